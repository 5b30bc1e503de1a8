// det_freq.h: integer token frequencies from a row of fp32 logits (docs/SPEC.md §18.1), the
// probability model of lossless compression (torch-ext/det_infer/compress.py). The range coder sees
// these integers only; they are a function of the logits' bits alone, so an encoder and a decoder
// that get the same logits (any executor, batch or prefill split) get the same frequencies.
//
//   Every l_i finite: m = max l; e_i = exp(fl(l_i - m)) (the sampler's weights at T = 1, §15 step 2);
//   S = canonical sum of e (§9); c = fl(2^30 / S); f_i = 1 + floor(fl(e_i * c)).
//   Any NaN or infinite logit: f_i = 1 for every id, plus 2^30 for the argmax (§10).
//   Each f_i is in [1, 2^30 + 1]; their sum is below 2^31 for V < 2^30.
#pragma once

#include "det_argmax.h"
#include "det_reduce.h"
#include "det_sample.h"

#define DET_FREQ_SCALE 1073741824.0f  // 2^30

// The scale c from S (S >= 1: the largest e is exactly 1).
DET_HD float det_freq_scale(float S) { return det_div_f32(DET_FREQ_SCALE, S); }

// f_i from e_i and c. fl(e * c) <= c <= 2^30, so the conversion (truncation = floor for x >= 0) fits.
DET_HD int32_t det_freq_of(float e, float c) { return 1 + (int32_t)det_mul_f32(e, c); }

// The whole rule for one row, sequentially (the reference; the CPU op vectorizes the exps).
// Scratch: e, V entries.
DET_HD void det_freq_f32_ref(const float* logits, int64_t V, int32_t* f, float* e) {
  for (int64_t i = 0; i < V; ++i) {
    if (!det_sample_finite(logits[i])) {
      for (int64_t j = 0; j < V; ++j) f[j] = 1;
      f[det_argmax_f32_ref(logits, V)] += (int32_t)DET_FREQ_SCALE;
      return;
    }
  }
  float m = logits[0];
  for (int64_t i = 1; i < V; ++i) m = logits[i] > m ? logits[i] : m;
  for (int64_t i = 0; i < V; ++i) e[i] = det_sample_weight(logits[i], m);
  const float c = det_freq_scale(det_sum_f32_ref(e, V));
  for (int64_t i = 0; i < V; ++i) f[i] = det_freq_of(e[i], c);
}
