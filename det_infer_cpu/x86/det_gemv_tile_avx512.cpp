// det_gemv_tile_avx512.cpp: the canonical GEMV (docs/SPEC.md §9) of bf16 rows against several
// inputs (batched decode, prefill) in 256-bit registers with AVX-512VL's 32 of them.
//
// Leaves in natural order: leaf x holds residues 8x .. 8x+7, fed by fma in increasing k, as in the
// reference. The tree's first step adds leaf x and leaf x + 16 (residue j and j + 128): both come
// from the same 256-column block (columns 8x and 128 + 8x), so a tile of R rows x T inputs keeps
// the pair in registers and stores only their sum: half the stores and reloads of the AVX2 tile,
// whose 16 registers cannot hold pairs. Each 8 bf16 load widens to fp32 by a zero-extension and a
// shift. The rest of the tree: x with x + 8, +4, +2, +1, then lanes i with i + 4, +2, +1.
#include <immintrin.h>

#include <algorithm>

#include "../det_kernels_cpu.h"

#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

constexpr int kPairs = 16;  // leaf pairs (x, x + 16) of one output

DET_AVX512 inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The tree of one output from its 16 pair sums (residues j + 128 already added).
DET_AVX512 inline float tree_pairs(const __m256* s) {
  __m256 v[8];
  for (int x = 0; x < 8; ++x) v[x] = _mm256_add_ps(s[x], s[x + 8]);  // j + 64
  for (int x = 0; x < 4; ++x) v[x] = _mm256_add_ps(v[x], v[x + 4]);  // j + 32
  for (int x = 0; x < 2; ++x) v[x] = _mm256_add_ps(v[x], v[x + 2]);  // j + 16
  const __m256 a = _mm256_add_ps(v[0], v[1]);                          // j + 8
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // j + 4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));                                         // j + 2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));                                     // j + 1
  return _mm_cvtss_f32(q);
}

// Rows r .. r + R - 1 against inputs X[0 .. T): pair x of every output, one pair at a time.
template <int R, int T>
DET_AVX512 void tile(const uint16_t* W, int64_t K, const float* X, float* Y, int64_t ldy, int64_t r,
                     __m256* sums) {
  for (int x = 0; x < kPairs; ++x) {
    __m256 lo[R][T], hi[R][T];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < T; ++b) lo[i][b] = hi[i][b] = _mm256_setzero_ps();
    for (int64_t k = 8 * x; k < K; k += 256) {
      __m256 wl[R];
      for (int i = 0; i < R; ++i) wl[i] = load_bf16x8(W + (r + i) * K + k);
      if (k + 128 < K) {
        __m256 wh[R];
        for (int i = 0; i < R; ++i) wh[i] = load_bf16x8(W + (r + i) * K + k + 128);
        for (int b = 0; b < T; ++b) {
          const __m256 xl = _mm256_loadu_ps(X + b * K + k), xh = _mm256_loadu_ps(X + b * K + k + 128);
          for (int i = 0; i < R; ++i) {
            lo[i][b] = _mm256_fmadd_ps(wl[i], xl, lo[i][b]);
            hi[i][b] = _mm256_fmadd_ps(wh[i], xh, hi[i][b]);
          }
        }
      } else {  // the last, partial block: no column 128 + 8x
        for (int b = 0; b < T; ++b) {
          const __m256 xl = _mm256_loadu_ps(X + b * K + k);
          for (int i = 0; i < R; ++i) lo[i][b] = _mm256_fmadd_ps(wl[i], xl, lo[i][b]);
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < T; ++b) sums[(i * T + b) * kPairs + x] = _mm256_add_ps(lo[i][b], hi[i][b]);  // j + 128
  }
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < T; ++b) Y[b * ldy + r + i] = tree_pairs(sums + (i * T + b) * kPairs);
}

// All inputs against rows [r, r + R), in tiles of 3 inputs, or 2 where B is not a multiple of 3
// (16 = 3+3+3+3+2+2: no tile of 1). The rows stay in L1 between the tiles, so they come from
// memory once.
template <int R>
DET_AVX512 void row_block(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy, int64_t r,
                          __m256* sums) {
  const int64_t threes = B % 3 == 0 ? B / 3 : B % 3 == 2 ? B / 3 : B / 3 - 1;  // B = 3 threes + 2 twos
  int64_t b = 0;
  if (B == 1) return tile<R, 1>(W, K, X, Y, ldy, r, sums);
  for (int64_t i = 0; i < threes; ++i, b += 3) tile<R, 3>(W, K, X + b * K, Y + b * ldy, ldy, r, sums);
  for (; b < B; b += 2) tile<R, 2>(W, K, X + b * K, Y + b * ldy, ldy, r, sums);
}

}  // namespace

// Row blocks of 3 against tiles of 3 inputs: 18 accumulators (9 leaf pairs), 6 widened weight
// vectors, 2 input vectors; the tile's 3 inputs (3 x K floats) stay in L1 up to K ~ 2000.
//
// Prefetch: the block 8 ahead into L2 (from memory: the walk revisits each block's lines out of
// order, which the hardware prefetchers do not follow), and the next block into L1. A block's lines
// asked into L1 any earlier are evicted by the inputs (16 inputs of 576 floats are 36 KB, the
// L1 32 KB) before use. At batch 16 from memory (benchmarks/tile_ceiling.sh) this took the gate/up
// shape from 40 to 58 GFLOP/s on one Zen 4 core, the down shape from 44 to 58.
DET_AVX512 void det_gemv_rows_tile_avx512(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y,
                                          int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int R = 3, kL2Ahead = 8;
  alignas(32) __m256 sums[R * 3 * kPairs];
  const int64_t block_bytes = R * K * 2;
  const int64_t warm_end = std::min(r0 + kL2Ahead * R, r1), warm_begin = std::min(r0 + R, warm_end);
  // Blocks 1 .. kL2Ahead - 1 now (block 0 is loaded on demand); the loop asks for kL2Ahead onward.
  det_prefetch_l2(W + warm_begin * K, (warm_end - warm_begin) * K * 2);
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    if (r + (kL2Ahead + 1) * R <= r1) det_prefetch_l2(W + (r + kL2Ahead * R) * K, block_bytes);
    if (r + 2 * R <= r1) det_prefetch_l1(W + (r + R) * K, block_bytes);
    row_block<R>(W, K, X, B, Y, ldy, r, sums);
  }
  for (; r < r1; ++r) row_block<1>(W, K, X, B, Y, ldy, r, sums);
}
