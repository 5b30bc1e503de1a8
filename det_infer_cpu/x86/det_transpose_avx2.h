// det_transpose_avx2.h: the 8 x 8 fp32 transpose the AVX2 kernels use to turn accumulators' runs
// of 8 terms (docs/SPEC.md §9) into one vector per step, and the tree's last steps inside a vector
// (also used by the AVX-512 kernels).
#pragma once

#include <immintrin.h>

#define DET_AVX2 __attribute__((target("avx2,fma")))

// On return r[i] holds element i of each input vector: lane j of r[i] is the old r[j][i].
DET_AVX2 inline void det_transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Steps 4, 2, 1 of the tree (docs/SPEC.md §9) over the 8 accumulators in a's lanes; returns the
// result (lane 0's).
DET_AVX2 inline float det_tree_last8(__m256 a) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // j + 4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));                                           // j + 2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));                                       // j + 1
  return _mm_cvtss_f32(q);
}
