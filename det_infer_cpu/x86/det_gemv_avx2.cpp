// det_gemv_avx2.cpp: the canonical GEMV (docs/SPEC.md §9) with AVX2 + FMA, same order as
// det_gemv_rows_ref: every lane of a vector is one of the 256 residue accumulators, fed its terms
// in increasing k by fma, and the fixed tree runs at the end. nf4 matrices (docs/SPEC.md §16) are
// decoded a row (or a tile's rows) at a time into bf16 in L1, then run through the same kernels:
// the decoded values are exactly the contract's bf16 weights.
//
// Layout. 16 bf16 weights w[16g .. 16g+15] load as one 256-bit vector; unpacking it against zero
// gives their fp32 values in two vectors without a conversion instruction:
//   A_g = lanes (16g+0..3, 16g+8..11),  B_g = lanes (16g+4..7, 16g+12..15)   (unpack works per 128 bits)
// The inputs are permuted once per call into the same lane order, so lane i of A_g (or B_g) always
// holds one residue. Leaf L = 2g + h (h = 0 for A, 1 for B), g < 16, covers residues of group g.
// Tree: pairing residue j with j+128, +64, +32, +16 pairs group g with g+8, +4, +2, +1, i.e. leaf
// L with L+16, +8, +4, +2; that leaves A_0 and B_0. Then j with j+8 (the two 128-bit halves of each),
// j with j+4 (A_0's half with B_0's), and j with j+2, j+1 inside 128 bits.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "../det_kernels_cpu.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))

namespace {

constexpr int kLeaves = 32;  // 256 residues / 8 lanes
constexpr int kGroup = 16;   // residues per 256-bit bf16 load

// fp32 values of w[0..15] in the (A, B) lane order.
DET_AVX2 inline void load_bf16x16(const uint16_t* p, __m256* a, __m256* b) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i z = _mm256_setzero_si256();
  *a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w));
  *b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w));
}

// x (K,) in natural order -> xp in the (A, B) lane order of each 16-group.
DET_AVX2 void permute_input(const float* x, float* xp, int64_t K) {
  for (int64_t k = 0; k < K; k += kGroup) {
    const __m256 lo = _mm256_loadu_ps(x + k), hi = _mm256_loadu_ps(x + k + 8);
    _mm256_storeu_ps(xp + k, _mm256_permute2f128_ps(lo, hi, 0x20));      // x0..3, x8..11
    _mm256_storeu_ps(xp + k + 8, _mm256_permute2f128_ps(lo, hi, 0x31));  // x4..7, x12..15
  }
}

// The tree of one output from its 32 leaves.
DET_AVX2 inline float tree(const __m256* leaf) {
  __m256 v[16];
  for (int x = 0; x < 16; ++x) v[x] = _mm256_add_ps(leaf[x], leaf[x + 16]);  // j + 128
  for (int x = 0; x < 8; ++x) v[x] = _mm256_add_ps(v[x], v[x + 8]);          // j + 64
  for (int x = 0; x < 4; ++x) v[x] = _mm256_add_ps(v[x], v[x + 4]);          // j + 32
  for (int x = 0; x < 2; ++x) v[x] = _mm256_add_ps(v[x], v[x + 2]);          // j + 16
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v[0]), _mm256_extractf128_ps(v[0], 1));  // j + 8: 0..3
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v[1]), _mm256_extractf128_ps(v[1], 1));  // j + 8: 4..7
  __m128 q = _mm_add_ps(a, b);                   // j + 4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));        // j + 2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));    // j + 1
  return _mm_cvtss_f32(q);
}

// Few inputs (memory-bound): one row at a time, in windows of 4 blocks (1024 weights, 2 KB). Within
// a window each leaf pair (A_g, B_g) is an fma chain in registers over its blocks (k = 16g + 256t),
// continuing from the value the previous window left in the leaf array: the same chain, so the
// same order. Per 16 weights: 1 load and 2 unpacks, plus 2 input loads and 2 fmas per input. The
// row after next is prefetched, since the walk revisits a window's lines rather than streaming.
template <int T>
DET_AVX2 void stream_rows(const uint16_t* W, int64_t K, const float* Xp, float* Y, int64_t ldy, int64_t r0,
                          int64_t r1) {
  constexpr int64_t kWindow = 4 * 256;
  alignas(32) __m256 leaf[T][kLeaves];
  const int64_t row_bytes = K * 2;
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = W + r * K;
    if (r + 2 < r1) det_prefetch_l1(W + (r + 2) * K, row_bytes);
    for (int t = 0; t < T; ++t)
      for (int x = 0; x < kLeaves; ++x) leaf[t][x] = _mm256_setzero_ps();
    for (int64_t w0 = 0; w0 < K; w0 += kWindow) {
      const int64_t w1 = std::min(K, w0 + kWindow);
      for (int g = 0; g < kLeaves / 2; ++g) {
        __m256 a[T], b[T];
        for (int t = 0; t < T; ++t) {
          a[t] = leaf[t][2 * g];
          b[t] = leaf[t][2 * g + 1];
        }
        for (int64_t k = w0 + kGroup * g; k < w1; k += 256) {
          __m256 wa, wb;
          load_bf16x16(w + k, &wa, &wb);
          for (int t = 0; t < T; ++t) {
            a[t] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(Xp + t * K + k), a[t]);
            b[t] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(Xp + t * K + k + 8), b[t]);
          }
        }
        for (int t = 0; t < T; ++t) {
          leaf[t][2 * g] = a[t];
          leaf[t][2 * g + 1] = b[t];
        }
      }
    }
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = tree(leaf[t]);
  }
}

// Many inputs (compute-bound): a register tile of R rows x T inputs computes one leaf at a time;
// each unpacked weight vector serves T inputs and each input vector R rows.
template <int R, int T>
DET_AVX2 void tile(const uint16_t* W, int64_t K, const float* Xp, float* Y, int64_t ldy, int64_t r,
                   __m256* leaves) {
  for (int L = 0; L < kLeaves; ++L) {
    const int g = L / 2, h = L % 2;
    __m256 acc[R][T];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < T; ++b) acc[i][b] = _mm256_setzero_ps();
    for (int64_t k = kGroup * g; k < K; k += 256) {
      __m256 w[R];
      for (int i = 0; i < R; ++i) {
        __m256 wa, wb;
        load_bf16x16(W + (r + i) * K + k, &wa, &wb);
        w[i] = h ? wb : wa;
      }
      for (int b = 0; b < T; ++b) {
        const __m256 xv = _mm256_loadu_ps(Xp + b * K + k + 8 * h);
        for (int i = 0; i < R; ++i) acc[i][b] = _mm256_fmadd_ps(w[i], xv, acc[i][b]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < T; ++b) leaves[(i * T + b) * kLeaves + L] = acc[i][b];
  }
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < T; ++b) Y[b * ldy + r + i] = tree(leaves + (i * T + b) * kLeaves);
}

// All inputs against rows [r, r + R): groups of 4 inputs, then the remainder. The rows stay in
// L1/L2 between the groups, so they come from memory once.
template <int R>
DET_AVX2 void row_block(const uint16_t* W, int64_t K, const float* Xp, int64_t B, float* Y, int64_t ldy, int64_t r,
                        __m256* leaves) {
  int64_t b = 0;
  for (; b + 4 <= B; b += 4) tile<R, 4>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves);
  switch (B - b) {
    case 3: tile<R, 3>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    case 2: tile<R, 2>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    case 1: tile<R, 1>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    default: break;
  }
}

// ---- nf4 rows -----------------------------------------------------------------------------------
// Each row is decoded to its bf16 weights in L1 (det_nf4_decode_row, x86/det_nf4_decode.cpp), then
// streamed (1-2 inputs) or tiled (3 rows at a time) exactly as a bf16 row.
DET_AVX2 void gemv_rows_nf4(const det_matrix& W, int64_t K, const float* Xp, int64_t B, float* Y, int64_t ldy,
                            int64_t r0, int64_t r1) {
  constexpr int64_t kTile = 3;
  thread_local std::vector<uint16_t> rows;
  if ((int64_t)rows.size() < kTile * K) rows.resize(kTile * K);
  alignas(32) __m256 leaves[12 * kLeaves];
  int64_t r = r0;
  while (r < r1) {
    const int64_t n = B <= 2 ? 1 : std::min(kTile, r1 - r);  // rows decoded together
    if (r + n + 1 < r1) det_prefetch_l1(W.nf4 + (r + n + 1) * K / 2, K / 2);  // the codes of the row after next
    for (int64_t i = 0; i < n; ++i) det_nf4_decode_row(W, (r + i) * K, K, rows.data() + i * K);
    if (B == 1) stream_rows<1>(rows.data(), K, Xp, Y + r, ldy, 0, 1);
    else if (B == 2) stream_rows<2>(rows.data(), K, Xp, Y + r, ldy, 0, 1);
    else if (n == 3) row_block<3>(rows.data(), K, Xp, B, Y + r, ldy, 0, leaves);
    else for (int64_t i = 0; i < n; ++i) row_block<1>(rows.data() + i * K, K, Xp, B, Y + r + i, ldy, 0, leaves);
    r += n;
  }
}

}  // namespace

DET_AVX2 void det_gemv_rows_avx2(const det_matrix& M, int64_t K, const float* X, int64_t B, float* Y,
                                 int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> xp;
  if ((int64_t)xp.size() < B * K) xp.resize(B * K);
  for (int64_t b = 0; b < B; ++b) permute_input(X + b * K, xp.data() + b * K, K);
  if (!M.bf16) return gemv_rows_nf4(M, K, xp.data(), B, Y, ldy, r0, r1);
  const uint16_t* W = M.bf16;
  if (B == 1) return stream_rows<1>(W, K, xp.data(), Y, ldy, r0, r1);
  if (B == 2) return stream_rows<2>(W, K, xp.data(), Y, ldy, r0, r1);
  alignas(32) __m256 leaves[12 * kLeaves];
  int64_t r = r0;
  for (; r + 3 <= r1; r += 3) row_block<3>(W, K, xp.data(), B, Y, ldy, r, leaves);
  for (; r < r1; ++r) row_block<1>(W, K, xp.data(), B, Y, ldy, r, leaves);
}

