// det_gemv_b1_avx512.cpp: the canonical GEMV (docs/SPEC.md §9) of one input (the batch-1 decode
// step) against bf16 or nf4 rows (§16) with AVX-512 (F, BW, VL, DQ).
//
// Each 256-weight block of a row is transposed in registers into its staged form
// (det_stage_avx512.h) and fed to the row's two accumulator vectors (accumulators 0-15 and 16-31)
// against the staged input; two rows at a time, so that two fma chains interleave. nf4 rows are
// first decoded to their bf16 weights in L1 (det_nf4_decode_row): exactly the contract's weights.
#include <vector>

#include "../det_kernels_cpu.h"
#include "det_stage_avx512.h"

namespace {

// y[i] = dot of row i (K bf16 weights at w + i * ld) with the staged input xp, i < R.
template <int R>
DET_AVX512 inline void rows_dot(const uint16_t* w, int64_t ld, int64_t K, const float* xp, float* y) {
  __m512 lo[R], hi[R];
  for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
    const int64_t n = K - k0 < DET_REDUCE_BLOCK ? K - k0 : DET_REDUCE_BLOCK;
    const bool both = det_block_lanes(K, k0) > 16;
    for (int i = 0; i < R; ++i) {
      __m512 s[16];
      det_stage_block_bf16(w + i * ld + k0, n, s);
      for (int t = 0; t < 8; ++t) {
        lo[i] = _mm512_fmadd_ps(s[2 * t], _mm512_loadu_ps(xp + k0 + 32 * t), lo[i]);
        if (both) hi[i] = _mm512_fmadd_ps(s[2 * t + 1], _mm512_loadu_ps(xp + k0 + 32 * t + 16), hi[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) y[i] = det_stage_tree(lo[i], hi[i]);
}

}  // namespace

DET_AVX512 void det_gemv_rows_b1_avx512(const det_matrix& W, int64_t K, const float* xp, float* y, int64_t r0,
                                        int64_t r1) {
  if (W.bf16) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
      if (r + 4 <= r1) det_prefetch_l1(W.bf16 + (r + 2) * K, 4 * K);
      rows_dot<2>(W.bf16 + r * K, K, K, xp, y + r);
    }
    if (r < r1) rows_dot<1>(W.bf16 + r * K, K, K, xp, y + r);
    return;
  }
  thread_local std::vector<uint16_t> row;
  if ((int64_t)row.size() < 2 * K) row.resize(2 * K);
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) {
    det_nf4_decode_row(W, r * K, 2 * K, row.data());
    rows_dot<2>(row.data(), K, K, xp, y + r);
  }
  if (r < r1) {
    det_nf4_decode_row(W, r * K, K, row.data());
    rows_dot<1>(row.data(), K, K, xp, y + r);
  }
}
