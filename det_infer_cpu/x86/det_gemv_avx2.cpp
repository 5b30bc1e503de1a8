// det_gemv_avx2.cpp: the canonical GEMV (docs/SPEC.md §9) with AVX2 + FMA, for CPUs without
// AVX-512 (and DET_INFER_GEMV=avx2). Same order as det_gemv_rows_ref.
//
// Each row is staged (det_lane_blocks.h) in L1: 8 bf16 weights 8l .. 8l + 7 of a block widen to one
// vector, accumulator l's run, and an 8 x 8 transpose of accumulators 8g .. 8g + 7 gives their
// steps 0..7 as vectors. Then every group of up to 3 inputs walks the staged row with four
// accumulator vectors per output (accumulators 0-7, 8-15, 16-23, 24-31; the quarters a short last
// block does not reach are skipped). With 3 or more inputs, rows are staged three at a time and
// register tiles of 3 rows x 3 inputs take one accumulator quarter at a time (tile_quarters): 1.4-2x
// the row-by-row walk at K = 576. nf4 rows are first decoded to their bf16 weights
// (det_nf4_decode_row): exactly the contract's weights.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "../det_kernels_cpu.h"
#include "../det_lane_blocks.h"
#include "det_transpose_avx2.h"

namespace {

constexpr int kInputs = 3;  // inputs per pass: 3 x 4 accumulator vectors of the 16 registers
// tile_quarters' register tile: 9 accumulator vectors, 3 weight vectors and an input. 3 x 4 (all 16
// registers) ran as fast; 2 x 4 to 2 x 6 slower (per-kernel timing, 2026-12-07, AVX2 Zen 5 VM).
constexpr int kTileRows = 3, kTileInputs = 3;

DET_AVX2 inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// S (det_staged_len(K) floats) = the staged form of the K bf16 weights at w.
DET_AVX2 void stage_row(const uint16_t* w, int64_t K, float* S) {
  for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK, S += DET_REDUCE_BLOCK) {
    const int lanes = det_block_lanes(K, k0);  // K % 16 == 0: whole runs
    for (int g = 0; g < 4; ++g) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) {
        const int l = 8 * g + j;
        r[j] = l < lanes ? widen8(w + k0 + 8 * l) : _mm256_setzero_ps();
      }
      det_transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(S + 32 * i + 8 * g, r[i]);
    }
  }
}

// The tree of docs/SPEC.md §9 over accumulator vectors q[0..3] (accumulators 8u .. 8u + 7).
DET_AVX2 inline float tree(const __m256 (&q)[4]) {
  return det_tree_last8(_mm256_add_ps(_mm256_add_ps(q[0], q[2]), _mm256_add_ps(q[1], q[3])));  // j + 16, j + 8
}

// Y[t * ldy] = dot(staged row S, staged input t) for t < T.
template <int T>
DET_AVX2 void row_inputs(const float* S, const float* xp, int64_t Kp, int64_t K, float* Y, int64_t ldy) {
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < 4; ++u) acc[t][u] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
    const int quarters = (det_block_lanes(K, k0) + 7) / 8;
    for (int64_t s = k0; s < k0 + DET_REDUCE_BLOCK; s += DET_REDUCE_LANES)
      for (int u = 0; u < 4; ++u) {
        if (u >= quarters) break;
        const __m256 w = _mm256_loadu_ps(S + s + 8 * u);
        for (int t = 0; t < T; ++t) acc[t][u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp + t * Kp + s + 8 * u), acc[t][u]);
      }
  }
  for (int t = 0; t < T; ++t) Y[t * ldy] = tree(acc[t]);
}

// Y[t * ldy + r] = dot(staged row S[r], staged input t) for r < R rows and t < T inputs, one
// accumulator quarter at a time (accumulators 8u .. 8u + 7, one vector): a register holds one
// output's quarter, so each step's R weight and T input loads feed R x T fmas (row_inputs: 4
// accumulator vectors an output, 3 fmas per 4 loads). Each accumulator still takes its terms in
// order; the quarters wait in q for the tree.
template <int R, int T>
DET_AVX2 void tile_quarters(const float* const* S, const float* xp, int64_t Kp, int64_t K, float* Y, int64_t ldy) {
  __m256 q[R][T][4];
  for (int u = 0; u < 4; ++u) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
      if (u >= (det_block_lanes(K, k0) + 7) / 8) break;  // a short last block: quarters it does not reach
      for (int64_t s = k0 + 8 * u; s < k0 + DET_REDUCE_BLOCK; s += DET_REDUCE_LANES) {
        __m256 w[R];
        for (int r = 0; r < R; ++r) w[r] = _mm256_loadu_ps(S[r] + s);
        for (int t = 0; t < T; ++t) {
          const __m256 x = _mm256_loadu_ps(xp + t * Kp + s);
          for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(w[r], x, acc[r][t]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) q[r][t][u] = acc[r][t];
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = tree(q[r][t]);
}

}  // namespace

// det_stage_inputs with 8 x 8 transposes: accumulators 8g .. 8g + 7's runs, one vector each, become
// their steps 0..7; runs past K are -0 (K % 8 == 0: whole runs).
DET_AVX2 void det_stage_inputs_avx2(const float* X, int64_t K, int64_t B, float* xp) {
  const int64_t Kp = det_staged_len(K);
  for (int64_t b = 0; b < B; ++b) {
    const float* x = X + b * K;
    float* o = xp + b * Kp;
    for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK, o += DET_REDUCE_BLOCK) {
      const int lanes = det_block_lanes(K, k0);
      for (int g = 0; g < 4; ++g) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) {
          const int l = 8 * g + j;
          r[j] = l < lanes ? _mm256_loadu_ps(x + k0 + 8 * l) : _mm256_set1_ps(-0.0f);
        }
        det_transpose8(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + 32 * i + 8 * g, r[i]);
      }
    }
  }
}

DET_AVX2 void det_gemv_rows_avx2(const det_matrix& W, int64_t K, const float* xp, int64_t B, float* Y,
                                 int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t Kp = det_staged_len(K);
  thread_local det_staging staging;
  thread_local std::vector<uint16_t> decoded;
  const int rows = B >= kTileInputs ? kTileRows : 1;  // rows staged together
  float* S0 = staging.get(kTileRows * Kp);
  const float* S[kTileRows];
  for (int r = 0; r < kTileRows; ++r) S[r] = S0 + r * Kp;
  if (!W.bf16 && (int64_t)decoded.size() < K) decoded.resize(K);
  auto stage = [&](int64_t r, float* dst) {
    const uint16_t* w = W.bf16 ? W.bf16 + r * K : decoded.data();
    if (!W.bf16) det_nf4_decode_row(W, r * K, K, decoded.data());
    else if (r + 2 * rows < r1) det_prefetch_l1(W.bf16 + (r + 2 * rows) * K, 2 * K);
    stage_row(w, K, dst);
  };
  int64_t r = r0;
  if (rows == kTileRows) {  // several inputs (a prompt block, a batch): register tiles of rows x inputs
    for (; r + kTileRows <= r1; r += kTileRows) {
      for (int i = 0; i < kTileRows; ++i) stage(r + i, S0 + i * Kp);
      int64_t b = 0;
      for (; b + kTileInputs <= B; b += kTileInputs)
        tile_quarters<kTileRows, kTileInputs>(S, xp + b * Kp, Kp, K, Y + b * ldy + r, ldy);
      for (; b < B; ++b) tile_quarters<kTileRows, 1>(S, xp + b * Kp, Kp, K, Y + b * ldy + r, ldy);
    }
  }
  for (; r < r1; ++r) {
    stage(r, S0);
    int64_t b = 0;
    for (; b + kInputs <= B; b += kInputs) row_inputs<kInputs>(S0, xp + b * Kp, Kp, K, Y + b * ldy + r, ldy);
    if (B - b == 2) row_inputs<2>(S0, xp + b * Kp, Kp, K, Y + b * ldy + r, ldy);
    if (B - b == 1) row_inputs<1>(S0, xp + b * Kp, Kp, K, Y + b * ldy + r, ldy);
  }
}
