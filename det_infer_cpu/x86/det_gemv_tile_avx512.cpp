// det_gemv_tile_avx512.cpp: the canonical GEMV (docs/SPEC.md §9) of two or more inputs (batched
// decode, prefill) against bf16 or nf4 rows with AVX-512 (F, BW, VL, DQ), in register tiles.
//
// A block of R rows is staged once (det_stage_avx512.h: each 256-weight block transposed to fp32
// in registers and stored, R x det_staged_len(K) floats, in L1 or L2; nf4 rows are decoded to their
// bf16 weights first), then every tile of T inputs walks it: per step, R weight vectors and T
// input vectors feed R x T accumulator vectors, two per output (accumulators 0-15 and 16-31), all
// in zmm registers. A short last block (K = 576: 64 weights, accumulators 0-7) runs only the low
// half. The tree runs once per output at the end.
#include <algorithm>
#include <vector>

#include "../det_kernels_cpu.h"
#include "det_stage_avx512.h"

namespace {

// Rows staged and tiled together, and inputs per tile: 4 x 3 outputs are 24 accumulator registers.
// Each input vector serves 4 rows: with a prefill's inputs in L2, not L1, 4 x 3 tiles keep their
// speed where 3 x 4 tiles lose a fifth (one core of Zen 5, 63 inputs, K = 576: 189 against 153
// GFLOP/s for the bare tile).
constexpr int kRows = 4;
constexpr int kInputs = 3;

// A loaded vector kept in a register: without this gcc folds the load into every fma that uses it,
// reading each weight T times and each input R times (about 2x slower in the layout probe).
DET_AVX512 inline __m512 det_in_register(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

// Y[t * ldy + i] = dot(staged row i, staged input t) for i < R, t < T.
template <int R, int T>
DET_AVX512 void tile(const float* S, const float* xp, int64_t Kp, int64_t K, float* Y, int64_t ldy) {
  __m512 lo[R][T], hi[R][T];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) lo[i][t] = hi[i][t] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
    const bool both = det_block_lanes(K, k0) > 16;
    for (int64_t s = k0; s < k0 + DET_REDUCE_BLOCK; s += DET_REDUCE_LANES) {
      __m512 w[R];
      for (int i = 0; i < R; ++i) w[i] = det_in_register(_mm512_load_ps(S + i * Kp + s));
      for (int t = 0; t < T; ++t) {
        const __m512 x = det_in_register(_mm512_loadu_ps(xp + t * Kp + s));
        for (int i = 0; i < R; ++i) lo[i][t] = _mm512_fmadd_ps(w[i], x, lo[i][t]);
      }
      if (!both) continue;
      for (int i = 0; i < R; ++i) w[i] = det_in_register(_mm512_load_ps(S + i * Kp + s + 16));
      for (int t = 0; t < T; ++t) {
        const __m512 x = det_in_register(_mm512_loadu_ps(xp + t * Kp + s + 16));
        for (int i = 0; i < R; ++i) hi[i][t] = _mm512_fmadd_ps(w[i], x, hi[i][t]);
      }
    }
  }
  static_assert(R <= 4 && T <= 4, "det_stage_tree16 holds outputs 4i + t");
  if (R * T < 8) {
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < T; ++t) Y[t * ldy + i] = det_stage_tree(lo[i][t], hi[i][t]);
    return;
  }
  __m512 l16[16], h16[16];  // output 4i + t; unused slots zero
  for (int o = 0; o < 16; ++o) l16[o] = h16[o] = _mm512_setzero_ps();
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) l16[4 * i + t] = lo[i][t], h16[4 * i + t] = hi[i][t];
  float y[16];
  det_stage_tree16(l16, h16, y);
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) Y[t * ldy + i] = y[4 * i + t];
}

// All B inputs against R staged rows, in tiles of kInputs; a remainder of 1 is taken with the
// tile before it as 2 + 2, so that no tile but a lone input's reads each weight for one input.
template <int R>
DET_AVX512 void row_block(const float* S, const float* xp, int64_t Kp, int64_t K, int64_t B, float* Y,
                          int64_t ldy) {
  int64_t b = 0;
  for (; B - b > kInputs + 1 || B - b == kInputs; b += kInputs)
    tile<R, kInputs>(S, xp + b * Kp, Kp, K, Y + b * ldy, ldy);
  for (; b < B; b += 2) {
    if (B - b == 1) tile<R, 1>(S, xp + b * Kp, Kp, K, Y + b * ldy, ldy);
    else tile<R, 2>(S, xp + b * Kp, Kp, K, Y + b * ldy, ldy);
  }
}

// Stages n rows of K bf16 weights (row i at w + i * K) into S (n x Kp floats).
DET_AVX512 void stage_rows(const uint16_t* w, int64_t K, int64_t Kp, int64_t n, float* S) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
      __m512 s[16];
      det_stage_block_bf16(w + i * K + k0, std::min<int64_t>(DET_REDUCE_BLOCK, K - k0), s);
      for (int j = 0; j < 8; ++j) {
        _mm512_store_ps(S + i * Kp + k0 + 32 * j, s[2 * j]);
        _mm512_store_ps(S + i * Kp + k0 + 32 * j + 16, s[2 * j + 1]);
      }
    }
}

}  // namespace

DET_AVX512 void det_gemv_rows_tile_avx512(const det_matrix& W, int64_t K, const float* xp, int64_t B, float* Y,
                                          int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t Kp = det_staged_len(K);
  thread_local det_staging staging;
  thread_local std::vector<uint16_t> decoded;
  float* S = staging.get(kRows * Kp);
  if (!W.bf16 && (int64_t)decoded.size() < kRows * K) decoded.resize(kRows * K);
  for (int64_t r = r0; r < r1; r += kRows) {
    const int64_t n = std::min<int64_t>(kRows, r1 - r);
    const uint16_t* rows = W.bf16 ? W.bf16 + r * K : decoded.data();
    if (!W.bf16) det_nf4_decode_row(W, r * K, n * K, decoded.data());
    else if (r + 2 * kRows <= r1) det_prefetch_l2(W.bf16 + (r + kRows) * K, kRows * K * 2);
    stage_rows(rows, K, Kp, n, S);
    if (n == kRows) row_block<kRows>(S, xp, Kp, K, B, Y + r, ldy);
    else
      for (int64_t i = 0; i < n; ++i) row_block<1>(S + i * Kp, xp, Kp, K, B, Y + r + i, ldy);
  }
}
