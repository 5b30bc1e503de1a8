// det_attn_avx2.cpp: attention scores (docs/SPEC.md §13.4) of one query against consecutive
// cached keys with AVX2 + FMA: s_i = fl(canonical dot(q, k_i) * scale), eight keys at a time, one
// key per lane.
//
// Accumulator l of every key takes the key's runs 8l .. 8l + 7 (and 256 + 8l .. when D > 256): the
// eight keys' runs load as eight vectors, an 8 x 8 transpose gives one vector per step, and each
// step is an fma with q's element broadcast. A head is short (D = 64 feeds accumulators 0-7), so
// the tree steps that would add the accumulators that took no term (+0) are skipped and +0 is
// added once at the end, which gives the full tree's bits (contract/det_reduce.h).
#include <algorithm>

#include "../det_kernels_cpu.h"
#include "../det_lane_blocks.h"
#include "det_transpose_avx2.h"

namespace {

template <int kLive>
DET_AVX2 void scores(const float* q, const float* k, int64_t stride, int64_t D, int64_t n, float scale,
                     float* out) {
  static_assert(kLive >= 1 && kLive <= DET_REDUCE_LANES, "accumulators that take terms");
  alignas(32) static const float zeros[DET_REDUCE_RUN] = {};
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int m = (int)std::min<int64_t>(8, n - i0);
    for (int64_t t = i0 + 8; t < std::min<int64_t>(n, i0 + 16); ++t)  // the next group's keys
      det_prefetch_l1(k + t * stride, 4 * D);
    __m256 acc[kLive];
    for (int l = 0; l < kLive; ++l) {
      acc[l] = _mm256_setzero_ps();
      for (int64_t k0 = 0; k0 + DET_REDUCE_RUN * l < D; k0 += DET_REDUCE_BLOCK) {
        const int64_t c = k0 + DET_REDUCE_RUN * l;
        __m256 r[8];
        for (int t = 0; t < 8; ++t) r[t] = _mm256_loadu_ps(t < m ? k + (i0 + t) * stride + c : zeros);
        det_transpose8(r);
        for (int i = 0; i < DET_REDUCE_RUN; ++i) acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(q[c + i]), r[i], acc[l]);
      }
    }
    for (int h = DET_REDUCE_LANES / 2; h >= 1; h /= 2)
      for (int j = 0; j < h; ++j)
        if (j + h < kLive) acc[j] = _mm256_add_ps(acc[j], acc[j + h]);
    __m256 v = acc[0];
    if (kLive < DET_REDUCE_LANES) v = _mm256_add_ps(v, _mm256_setzero_ps());  // the skipped +0 additions
    v = _mm256_mul_ps(v, s);
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::copy(tmp, tmp + m, out + i0);
  }
}

}  // namespace

DET_AVX2 void det_attn_scores_avx2(const float* q, const float* k, int64_t stride, int64_t D, int64_t n,
                                   float scale, float* out) {
  switch (std::min<int64_t>(D, DET_REDUCE_BLOCK) / DET_REDUCE_RUN) {  // accumulators that take terms
    case 4: return scores<4>(q, k, stride, D, n, scale, out);
    case 8: return scores<8>(q, k, stride, D, n, scale, out);
    case 16: return scores<16>(q, k, stride, D, n, scale, out);
    case 32: return scores<32>(q, k, stride, D, n, scale, out);
    default: return scores<DET_REDUCE_LANES>(q, k, stride, D, n, scale, out);
  }
}
