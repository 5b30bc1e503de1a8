// det_reduce.h: the canonical reduction order for every dot product and sum (docs/SPEC.md §9,
// contract 2).
//
// A length-K reduction uses DET_REDUCE_LANES = 32 accumulators, each starting at +0. The terms are
// taken in blocks of DET_REDUCE_BLOCK = 256 (k0 = 0, 256, 512, ...): in every block, accumulator l
// takes the DET_REDUCE_RUN = 8 consecutive terms k0 + 8l .. k0 + 8l + 7 that are < K, in increasing
// k (one fma, or one add for a plain sum, per term). So accumulator l's terms are, in order,
// 8l..8l+7, 256+8l..256+8l+7, ...; a last block of n < 256 terms feeds accumulators 0 .. ceil(n/8)-1.
// Then a fixed halving tree: for s = 16, 8, 4, 2, 1: acc[j] = acc[j] + acc[j + s] for j < s. The
// result is acc[0]. The order depends on K only: batch rows, thread counts, SIMD widths and launch
// geometry change how many accumulators advance per instruction, never the order.
// On a GPU warp, lane l is accumulator l: one 16-byte load of 8 bf16 per block, eight fmas in a
// chain, then five shuffles. A CPU vector holds accumulators side by side, so it reads a block
// transposed (step i of every accumulator: terms k0 + 8l + i). The _ref loops below are the literal
// definition.
//
// Signed zeros. An accumulator can be -0 (an fma whose exact result is a tiny negative number
// rounds to -0), and -0 + +0 = +0, so an executor may not drop the tree's addition of an accumulator
// that took no term (+0) unless it adds +0 to the result once at the end: dropping additions of +0
// changes at most the sign of a zero result, and the full tree's result is never -0 when one of its
// accumulators is +0. Padding, where an executor feeds an accumulator beyond the terms, must add -0,
// the additive identity: e.g. fma(+0, -0, acc) is acc for every acc.
#pragma once

#include "det_bf16.h"

#define DET_REDUCE_LANES 32
#define DET_REDUCE_RUN 8
#define DET_REDUCE_BLOCK (DET_REDUCE_LANES * DET_REDUCE_RUN)

// The tree over the 32 accumulators; destroys acc.
DET_HD float det_reduce_tree_f32(float* acc) {
  for (int s = DET_REDUCE_LANES / 2; s >= 1; s >>= 1)
    for (int j = 0; j < s; ++j) acc[j] = det_add_f32(acc[j], acc[j + s]);
  return acc[0];
}

// Index of the term that accumulator l takes at step i of the block starting at k0 (no bound check).
DET_HD long long det_reduce_term(long long k0, int l, int i) { return k0 + DET_REDUCE_RUN * l + i; }

// sum_k w[k] * x[k]; w is (K,) bf16 bits, x is (K,) fp32.
DET_HD float det_dot_bf16_ref(const uint16_t* w, const float* x, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK)
    for (int l = 0; l < DET_REDUCE_LANES; ++l)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) {
        const long long k = det_reduce_term(k0, l, i);
        if (k < K) acc[l] = det_fma_f32(det_bf16_to_f32(w[k]), x[k], acc[l]);
      }
  return det_reduce_tree_f32(acc);
}

// sum_k a[k] * b[k]; a, b are (K,) fp32.
DET_HD float det_dot_f32_ref(const float* a, const float* b, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK)
    for (int l = 0; l < DET_REDUCE_LANES; ++l)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) {
        const long long k = det_reduce_term(k0, l, i);
        if (k < K) acc[l] = det_fma_f32(a[k], b[k], acc[l]);
      }
  return det_reduce_tree_f32(acc);
}

// sum_k a[k]; a is (K,) fp32 (adds, no products).
DET_HD float det_sum_f32_ref(const float* a, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK)
    for (int l = 0; l < DET_REDUCE_LANES; ++l)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) {
        const long long k = det_reduce_term(k0, l, i);
        if (k < K) acc[l] = det_add_f32(acc[l], a[k]);
      }
  return det_reduce_tree_f32(acc);
}
