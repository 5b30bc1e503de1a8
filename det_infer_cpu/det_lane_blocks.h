// det_lane_blocks.h: the canonical order of contract/det_reduce.h in the layout the CPU's vectors
// read ("staged"): vector lanes are accumulators, so a 256-term block is read transposed.
//
// A staged vector of length K has ceil(K / 256) blocks of 256 floats; in block b, float 32i + l
// holds term 256b + 8l + i (step i of accumulator l), or padding where that term is >= K: +0 in a
// staged weight row, -0 in a staged input. Feeding the staged floats to 32 lane accumulators, step
// by step in increasing i and b, is exactly the contract's order: a padded product is +0 * -0 = -0,
// and acc + (-0) is acc for every acc, signed zeros included (det_reduce.h). The SIMD GEMVs stage the
// inputs once per call (det_stage_inputs) and the weight rows as they read them.
#pragma once

#include <stdint.h>

#include <vector>

#include "../contract/det_reduce.h"

// Floats of a staged vector of length K.
inline int64_t det_staged_len(int64_t K) { return (K + DET_REDUCE_BLOCK - 1) / DET_REDUCE_BLOCK * DET_REDUCE_BLOCK; }

// Accumulators that take terms in the block starting at k0 (32 except in a short last block).
inline int det_block_lanes(int64_t K, int64_t k0) {
  const int64_t n = K - k0 < DET_REDUCE_BLOCK ? K - k0 : DET_REDUCE_BLOCK;
  return (int)((n + DET_REDUCE_RUN - 1) / DET_REDUCE_RUN);
}

// Room for staged floats, 64-byte aligned: staged rows are whole blocks of 256 floats, so every
// row's vectors then sit on cache lines (an input vector split across two lines costs the tile
// about a fifth of its speed on Zen 5).
struct det_staging {
  std::vector<float> v;
  float* get(int64_t n) {
    if ((int64_t)v.size() < n + 16) v.resize(n + 16);
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
  }
};

// xp (B rows of det_staged_len(K) floats) = the staged form of each row of X (B, K).
inline void det_stage_inputs(const float* X, int64_t K, int64_t B, float* xp) {
  const int64_t Kp = det_staged_len(K);
  for (int64_t b = 0; b < B; ++b) {
    const float* x = X + b * K;
    float* o = xp + b * Kp;
    for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK, o += DET_REDUCE_BLOCK)
      for (int l = 0; l < DET_REDUCE_LANES; ++l)
        for (int i = 0; i < DET_REDUCE_RUN; ++i) {
          const int64_t k = det_reduce_term(k0, l, i);
          o[DET_REDUCE_LANES * i + l] = k < K ? x[k] : -0.0f;
        }
  }
}
