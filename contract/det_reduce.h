// det_reduce.h: the canonical reduction order for every dot product and sum (docs/SPEC.md §9).
//
// A length-K reduction uses DET_REDUCE_LANES = 256 accumulators. Accumulator j starts at +0 and
// takes the terms k = j, j + 256, j + 512, ... < K in increasing k (one fma, or one add for a plain
// sum, per term). Then a fixed halving tree: for s = 128, 64, ..., 1: acc[j] = acc[j] + acc[j + s]
// for j < s. The result is acc[0]. The order depends on K only: batch rows, thread counts and SIMD
// widths change how many residues advance per instruction, never the order. On a GPU warp, lane l
// owns residues 8l..8l+7 (one 16-byte load of 8 bf16); steps 128..8 are shuffles down by 16..1
// lanes and steps 4..1 are in-register. The _ref loops below are the literal definition.
#pragma once

#include "det_bf16.h"

#define DET_REDUCE_LANES 256

// The tree over 256 accumulators; destroys acc.
DET_HD float det_reduce_tree256_f32(float* acc) {
  for (int s = DET_REDUCE_LANES / 2; s >= 1; s >>= 1)
    for (int j = 0; j < s; ++j) acc[j] = det_add_f32(acc[j], acc[j + s]);
  return acc[0];
}

// The loops below walk k in blocks of 256 (k = k0 + j): accumulator j takes the terms j, j+256, ...
// in increasing order, exactly as "acc[k mod 256]", in a form compilers vectorize.

// sum_k w[k] * x[k]; w is (K,) bf16 bits, x is (K,) fp32.
DET_HD float det_dot_bf16_ref(const uint16_t* w, const float* x, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_LANES) {
    const long long n = K - k0 < DET_REDUCE_LANES ? K - k0 : DET_REDUCE_LANES;
    for (long long j = 0; j < n; ++j) acc[j] = det_fma_f32(det_bf16_to_f32(w[k0 + j]), x[k0 + j], acc[j]);
  }
  return det_reduce_tree256_f32(acc);
}

// sum_k a[k] * b[k]; a, b are (K,) fp32.
DET_HD float det_dot_f32_ref(const float* a, const float* b, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_LANES) {
    const long long n = K - k0 < DET_REDUCE_LANES ? K - k0 : DET_REDUCE_LANES;
    for (long long j = 0; j < n; ++j) acc[j] = det_fma_f32(a[k0 + j], b[k0 + j], acc[j]);
  }
  return det_reduce_tree256_f32(acc);
}

// sum_k a[k]; a is (K,) fp32 (adds, no products).
DET_HD float det_sum_f32_ref(const float* a, long long K) {
  float acc[DET_REDUCE_LANES];
  for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[j] = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += DET_REDUCE_LANES) {
    const long long n = K - k0 < DET_REDUCE_LANES ? K - k0 : DET_REDUCE_LANES;
    for (long long j = 0; j < n; ++j) acc[j] = det_add_f32(acc[j], a[k0 + j]);
  }
  return det_reduce_tree256_f32(acc);
}
