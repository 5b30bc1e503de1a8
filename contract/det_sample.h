// det_sample.h: seeded sampling, bit-identical everywhere (docs/SPEC.md §15). Every step is a
// contract operation in a fixed order; the result depends on the logits, the parameters, the seed
// and the position only. The executors run these steps in their own way, with the same bits: the CPU
// engine with its vectorized exp and a radix ranking (det_infer_cpu/det_sample_cpu.cpp), the
// megakernel with the block's threads for the elementwise steps and a radix ranking by the block
// (megakernel/det_mk_sample.cuh). A NaN weight takes the heap below on both: it defines the order.
//
//   temperature == 0: the argmax (§10). Any NaN or infinite logit: the argmax too.
//   z_i = fl(logit_i / T); m = max z; e_i = exp(fl(z_i - m)) (so the top e is exactly 1).
//   Rank order: e descending, then id ascending (a total order: ties never depend on a sort).
//   S = canonical sum (§9, sum form) of e_i over ids 0..V-1; target = fl(top_p * S).
//   Walking the ranks, token j (0-based) is kept unless: j >= 1 and e < min_p (min_p > 0), or
//   j >= top_k (top_k > 0), or the walk already stopped because the running sum c (fl adds in
//   rank order) reached target (top_p < 1) at the previous token. At least one token is kept.
//   Draw: u = det_sample_uniform(seed, position); r = fl(u * c_n) (c_n the kept tokens' sum);
//   the result is the first kept token whose running sum exceeds r, else the last kept.
#pragma once

#include "det_argmax.h"
#include "det_exp.h"
#include "det_philox.h"
#include "det_reduce.h"

struct det_sample_params {
  float temperature;  // 0: greedy
  int32_t top_k;      // 0: off
  float top_p;        // 1: off
  float min_p;        // 0: off
  uint64_t seed;
};

DET_HD bool det_sample_greedy(const det_sample_params& p) { return !(p.temperature > 0.0f); }

// True when token a ranks before token b.
DET_HD bool det_sample_before(const float* e, int32_t a, int32_t b) {
  return e[a] > e[b] || (e[a] == e[b] && a < b);
}

// Restores the heap below node i of heap[0..n): the root is the best-ranked token.
DET_HD void det_sample_sift(const float* e, int32_t* heap, int64_t n, int64_t i) {
  for (;;) {
    int64_t best = i;
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l < n && det_sample_before(e, heap[l], heap[best])) best = l;
    if (r < n && det_sample_before(e, heap[r], heap[best])) best = r;
    if (best == i) return;
    const int32_t t = heap[i];
    heap[i] = heap[best], heap[best] = t;
    i = best;
  }
}

// The steps, so that an executor can spread the elementwise ones over threads:
// 1. det_sample_finite over all logits (else the argmax); 2. z_i = det_sample_scaled(logit_i),
// m = max z (which of +-0 is taken never matters: z - (+0) and z - (-0) differ only in the sign
// of a zero, and exp(+-0) = 1); 3. e_i = det_sample_weight(z_i, m); 4. S = canonical sum of e (§9);
// 5. det_sample_walk.
DET_HD bool det_sample_finite(float logit) { return logit - logit == 0.0f; }
DET_HD float det_sample_scaled(float logit, const det_sample_params& p) { return det_div_f32(logit, p.temperature); }
DET_HD float det_sample_weight(float z, float m) { return det_exp_f32(det_sub_f32(z, m)); }

// The walk's rules, shared by every ranking of the tokens (the heap below; the CPU engine's radix
// sort, det_infer_cpu/det_sample_cpu.cpp): the top_p target, whether the next-ranked token (weight
// e_next, with n kept so far) is refused by min_p, and whether the walk stops after keeping n
// tokens with running sum c.
DET_HD float det_sample_target(float S, const det_sample_params& p) {
  return p.top_p < 1.0f ? det_mul_f32(p.top_p, S) : 0.0f;
}
DET_HD bool det_sample_refused(float e_next, int64_t n, const det_sample_params& p) {
  return n >= 1 && p.min_p > 0.0f && e_next < p.min_p;
}
DET_HD bool det_sample_full(int64_t n, float c, float target, const det_sample_params& p) {
  return (p.top_k > 0 && n >= p.top_k) || (p.top_p < 1.0f && c >= target);
}

// Step 5 without the draw: the ranks and the filters over e (V weights) with S their canonical
// sum. The kept tokens go to heap[V-1], heap[V-2], ... in rank order; returns their number n and
// sets *c to their running sum (fl adds in rank order). Scratch: heap, V entries.
DET_HD int64_t det_sample_keep(const float* e, int64_t V, float S, const det_sample_params& p, int32_t* heap,
                               float* c_out) {
  const float target = det_sample_target(S, p);
  for (int64_t i = 0; i < V; ++i) heap[i] = (int32_t)i;
  for (int64_t i = V / 2 - 1; i >= 0; --i) det_sample_sift(e, heap, V, i);
  int64_t n = 0, size = V;
  float c = 0.0f;
  while (size > 0) {
    const int32_t tok = heap[0];
    if (det_sample_refused(e[tok], n, p)) break;
    heap[0] = heap[--size];
    heap[size] = tok;
    det_sample_sift(e, heap, size, 0);
    c = det_add_f32(c, e[tok]);
    ++n;
    if (det_sample_full(n, c, target, p)) break;
  }
  *c_out = c;
  return n;
}

// The draw among the n kept tokens heap[V-1], ..., heap[V-n] (rank order), c their running sum.
DET_HD int32_t det_sample_draw(const float* e, int64_t V, const int32_t* heap, int64_t n, float c,
                               const det_sample_params& p, int64_t position) {
  const float r = det_mul_f32(det_sample_uniform(p.seed, position), c);
  float run = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t tok = heap[V - 1 - j];
    run = det_add_f32(run, e[tok]);
    if (run > r) return tok;
  }
  return heap[V - n];
}

// Step 5: the kept set (det_sample_keep), then the draw.
DET_HD int32_t det_sample_walk(const float* e, int64_t V, float S, const det_sample_params& p, int64_t position,
                               int32_t* heap) {
  float c;
  const int64_t n = det_sample_keep(e, V, S, p, heap, &c);
  return det_sample_draw(e, V, heap, n, c, p, position);
}
