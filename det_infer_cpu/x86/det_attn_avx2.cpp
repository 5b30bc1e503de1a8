// det_attn_avx2.cpp: attention scores (docs/SPEC.md §13.4) of one query against consecutive
// cached keys with AVX2 + FMA: s_i = fl(canonical dot(q, k_i) * scale), eight keys at a time.
//
// Per key, the 256 accumulators are 32 leaf vectors in natural lane order (leaf x holds residues
// 8x .. 8x+7, fed by fma onto +0 in increasing k). A head is short (D = 64 fills 8 leaves), so the
// other leaves hold +0 and the tree steps that would add them are skipped. Skipping "a + (+0)"
// changes at most the sign of a zero, and such a difference stays a sign-of-zero difference through
// the later adds; the true tree's result is never -0 when a +0 leaf exists (a sum is -0 only when
// both terms are), so one final "+ 0" makes the two equal bit for bit. The in-vector steps (lane i
// with i + 4, + 2, + 1) run for eight keys at once on transposed vectors, lower lane first as in
// the reference loop.
#include <immintrin.h>

#include <algorithm>

#include "../det_kernels_cpu.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))

namespace {

constexpr int kLeaves = 32;  // 256 residues / 8 lanes

// Steps j + 128 .. j + 8 of the tree over the first kHave leaves (the rest +0, skipped), from step
// j + 8 * S down; returns leaf 0. Unrolled at compile time, so the leaves stay in registers (a loop
// bounded at run time kept them in memory: three times slower for D = 64).
template <int S, int kHave>
DET_AVX2 inline __m256 fold_leaves(__m256* leaf) {
  if constexpr (S == 0) {
    return leaf[0];
  } else {
#pragma GCC unroll 16
    for (int x = 0; x < S && x + S < kHave; ++x) leaf[x] = _mm256_add_ps(leaf[x], leaf[x + S]);
    return fold_leaves<S / 2, (kHave < S ? kHave : S)>(leaf);
  }
}

// Steps j + 128 .. j + 8 of one key's tree over its first `live` leaves (kLive when it is not 0;
// the rest +0, skipped); returns leaf 0.
template <int kLive>
DET_AVX2 inline __m256 key_leaves(const float* q, const float* k, int64_t D, int live) {
  const int n = kLive > 0 ? kLive : live;
  __m256 leaf[kLeaves];
#pragma GCC unroll 16
  for (int x = 0; x < n; ++x)
    leaf[x] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * x), _mm256_loadu_ps(k + 8 * x), _mm256_setzero_ps());
  if constexpr (kLive == 0 || kLive == kLeaves) {  // only these heads can be longer than 256
    for (int64_t k0 = 256; k0 < D; k0 += 256) {      // more terms per residue
      const int m = (int)std::min<int64_t>(256, D - k0) / 8;
      for (int x = 0; x < m; ++x)
        leaf[x] = _mm256_fmadd_ps(_mm256_loadu_ps(q + k0 + 8 * x), _mm256_loadu_ps(k + k0 + 8 * x), leaf[x]);
    }
  }
  if constexpr (kLive > 0) return fold_leaves<kLeaves / 2, kLive>(leaf);
  int have = n;
  for (int s = kLeaves / 2; s >= 1; s /= 2) {
    for (int x = 0; x < s && x + s < have; ++x) leaf[x] = _mm256_add_ps(leaf[x], leaf[x + s]);
    have = std::min(have, s);
  }
  return leaf[0];
}

// The in-vector steps for eight keys: r[t] holds key t's lanes after step j + 8; returns the eight
// sums in key order.
DET_AVX2 inline __m256 lane_trees8(const __m256* r) {
  __m256 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // lane i + 4: [key 2i: 4 sums | key 2i+1: 4 sums]
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(r[2 * i], r[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(r[2 * i], r[2 * i + 1], 0x31));
  for (int i = 0; i < 2; ++i)  // lane i + 2: [keys 4i, 4i+2: 2 each | keys 4i+1, 4i+3: 2 each]
    u[i] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),  // lane i + 1:
                                 _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));  // keys 0 2 4 6 1 3 5 7
  return _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <int kLive>
DET_AVX2 void scores(const float* q, const float* k, int64_t stride, int64_t D, int64_t n, float scale,
                     float* out) {
  const int live = (int)std::min<int64_t>(D, 256) / 8;
  const __m256 zero = _mm256_setzero_ps(), s = _mm256_set1_ps(scale);
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int m = (int)std::min<int64_t>(8, n - i0);
    for (int64_t t = i0 + 8; t < std::min<int64_t>(n, i0 + 16); ++t)  // the next group's keys
      det_prefetch_l1(k + t * stride, 4 * D);
    __m256 r[8];
    for (int t = 0; t < 8; ++t) r[t] = t < m ? key_leaves<kLive>(q, k + (i0 + t) * stride, D, live) : zero;
    __m256 v = lane_trees8(r);
    if (live < kLeaves) v = _mm256_add_ps(v, zero);  // the skipped +0 leaves' one visible effect
    v = _mm256_mul_ps(v, s);
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::copy(tmp, tmp + m, out + i0);
  }
}

}  // namespace

DET_AVX2 void det_attn_scores_avx2(const float* q, const float* k, int64_t stride, int64_t D, int64_t n,
                                   float scale, float* out) {
  switch (std::min<int64_t>(D, 256) / 8) {  // the common head sizes with their leaf count fixed
    case 8: return scores<8>(q, k, stride, D, n, scale, out);
    case 16: return scores<16>(q, k, stride, D, n, scale, out);
    case 32: return scores<32>(q, k, stride, D, n, scale, out);
    default: return scores<0>(q, k, stride, D, n, scale, out);
  }
}
