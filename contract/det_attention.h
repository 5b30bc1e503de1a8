// det_attention.h: causal attention for one query over fixed chunks of absolute positions
// (docs/SPEC.md §13.4). Chunk c holds positions [128c, 128c + 127]; slot j of the chunk is
// position 128c + j, and a masked position (after the query, or outside a sliding window)
// contributes nothing. The score of key j is fl(canonical dot(q, k_j) * scale), scale =
// rsqrt(attn_scale_dim) (head_dim, or Gemma's value: §13.6, §13.7). Per chunk: the max m of the
// scores (the first visible one, then any larger one, in slot order), e_j = exp(s_j - m), the
// canonical sum l of the e_j and, per dimension d, the canonical sum o[d] of e_j * v_j[d] (both
// reductions of length 128 over the slots). Chunks combine in increasing order:
//   M' = max(M, m); a = exp(M - M'); b = exp(m - M'); L' = L*a + l*b; O'[d] = O[d]*a + o[d]*b,
// each product and sum rounded; the output is O[d] / L. The chunk length is part of the contract.
#pragma once

#include "det_exp.h"
#include "det_reduce.h"

#define DET_ATTN_CHUNK 128

// A running softmax state: max, denominator, and the D-long numerator.
struct det_attn_acc {
  float m, l;
};

// Folding a chunk's partial (m, l, o) into the running (M, L, O), in two steps so that executors
// which spread the D dimensions over threads share the formula: det_attn_merge_stats updates
// (M, L) and returns the two weights; det_attn_merge_value then updates each O[d].
struct det_attn_weights {
  float a, b;  // O' = O*a + o*b
};

DET_HD det_attn_weights det_attn_merge_stats(det_attn_acc* run, det_attn_acc part) {
  float M = part.m > run->m ? part.m : run->m;
  det_attn_weights w = {det_exp_f32(det_sub_f32(run->m, M)), det_exp_f32(det_sub_f32(part.m, M))};
  run->l = det_add_f32(det_mul_f32(run->l, w.a), det_mul_f32(part.l, w.b));
  run->m = M;
  return w;
}

DET_HD float det_attn_merge_value(float O, float o, det_attn_weights w) {
  return det_add_f32(det_mul_f32(O, w.a), det_mul_f32(o, w.b));
}

// Folds one chunk's partial into the running state; the first chunk initializes.
DET_HD void det_attn_combine_f32(det_attn_acc* run, float* O, det_attn_acc part, const float* o,
                                 long long D, bool first) {
  if (first) {
    *run = part;
    for (long long d = 0; d < D; ++d) O[d] = o[d];
    return;
  }
  det_attn_weights w = det_attn_merge_stats(run, part);
  for (long long d = 0; d < D; ++d) O[d] = det_attn_merge_value(O[d], o[d], w);
}
