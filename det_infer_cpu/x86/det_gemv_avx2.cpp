// det_gemv_avx2.cpp: the canonical GEMV (docs/SPEC.md §9) with AVX2 + FMA, same order as
// det_gemv_rows_ref: every lane of a vector is one of the 256 residue accumulators, fed its terms
// in increasing k by fma, and the fixed tree runs at the end. Weights are dense bf16 or nf4
// (decoded in the loop, 16 at a time, to the same fp32 values).
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

// Round fp32 to bf16 (nearest even, NaN -> 0x7fc0) and widen back: det_f32_to_bf16 per lane.
DET_AVX2 inline __m256 round_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))),
                                     _mm256_set1_epi32((int)0xffff0000u));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

// The weight rows as the kernels read them: load(r, k) gives w[r, k .. k+15] as fp32 in the
// (A, B) lane order, half(r, k, h) only A (h = 0) or B (h = 1). k % 16 == 0.
struct Bf16Rows {
  const uint16_t* W;
  int64_t K;
  DET_AVX2 void load(int64_t r, int64_t k, __m256* a, __m256* b) const { load_bf16x16(W + r * K + k, a, b); }
  DET_AVX2 __m256 half(int64_t r, int64_t k, int h) const {
    __m256 a, b;
    load(r, k, &a, &b);
    return h ? b : a;
  }
  const char* row(int64_t r) const { return reinterpret_cast<const char*>(W + r * K); }
  int64_t row_bytes() const { return 2 * K; }
};

// nf4 (det_nf4.h): 16 codes are 8 bytes, all in one block (blocks of at least 16). The codes are
// looked up in the 16-entry codebook held in two registers, multiplied by the block's absmax and
// rounded to bf16: det_nf4_weight_f32 lane by lane.
struct Nf4Rows {
  const uint8_t* q;
  const float* absmax;
  int64_t K, shift;
  __m256 code_lo, code_hi;
  DET_AVX2 Nf4Rows(const det_matrix& W, int64_t K_)
      : q(W.nf4), absmax(W.absmax), K(K_), shift(W.block_shift),
        code_lo(_mm256_loadu_ps(W.code)), code_hi(_mm256_loadu_ps(W.code + 8)) {}
  // Codes of elements (0..3, 8..11) and (4..7, 12..15) of the group at flat index i, as int32.
  DET_AVX2 void codes(int64_t i, __m256i* ca, __m256i* cb) const {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i / 2));
    const __m128i lo4 = _mm_set1_epi8(15);
    const __m128i natural = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), lo4), _mm_and_si128(bytes, lo4));
    const __m128i ab = _mm_shuffle_epi8(natural, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15));
    *ca = _mm256_cvtepu8_epi32(ab);
    *cb = _mm256_cvtepu8_epi32(_mm_srli_si128(ab, 8));
  }
  DET_AVX2 __m256 weights(__m256i c, __m256 scale) const {
    const __m256 lo = _mm256_permutevar8x32_ps(code_lo, c), hi = _mm256_permutevar8x32_ps(code_hi, c);
    const __m256 v = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));  // code >= 8
    return round_bf16(_mm256_mul_ps(v, scale));
  }
  DET_AVX2 void load(int64_t r, int64_t k, __m256* a, __m256* b) const {
    const int64_t i = r * K + k;
    const __m256 scale = _mm256_set1_ps(absmax[i >> shift]);
    __m256i ca, cb;
    codes(i, &ca, &cb);
    *a = weights(ca, scale);
    *b = weights(cb, scale);
  }
  DET_AVX2 __m256 half(int64_t r, int64_t k, int h) const {
    const int64_t i = r * K + k;
    __m256i ca, cb;
    codes(i, &ca, &cb);
    return weights(h ? cb : ca, _mm256_set1_ps(absmax[i >> shift]));
  }
  const char* row(int64_t r) const { return reinterpret_cast<const char*>(q + r * K / 2); }
  int64_t row_bytes() const { return K / 2; }
};

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

// The tree for leaves in natural lane order (leaf x = residues 8x .. 8x+7): x with x+16, +8, +4,
// +2, +1, then inside the vector i with i+4, i+2, i+1.
DET_AVX2 inline float tree_natural(const __m256* leaf) {
  __m256 v[16];
  for (int x = 0; x < 16; ++x) v[x] = _mm256_add_ps(leaf[x], leaf[x + 16]);
  for (int x = 0; x < 8; ++x) v[x] = _mm256_add_ps(v[x], v[x + 8]);
  for (int x = 0; x < 4; ++x) v[x] = _mm256_add_ps(v[x], v[x + 4]);
  for (int x = 0; x < 2; ++x) v[x] = _mm256_add_ps(v[x], v[x + 2]);
  const __m256 a = _mm256_add_ps(v[0], v[1]);
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  return _mm_cvtss_f32(q);
}

// Few inputs (memory-bound): one row at a time, in windows of 4 blocks (1024 weights, 2 KB). Within
// a window each leaf pair (A_g, B_g) is an fma chain in registers over its blocks (k = 16g + 256t),
// continuing from the value the previous window left in the leaf array: the same chain, so the
// same order. Per 16 weights: 1 load and 2 unpacks, plus 2 input loads and 2 fmas per input. The
// row after next is prefetched, since the walk revisits a window's lines rather than streaming.
template <int T, class Rows>
DET_AVX2 void stream_rows(const Rows& W, int64_t K, const float* Xp, float* Y, int64_t ldy, int64_t r0,
                          int64_t r1) {
  constexpr int64_t kWindow = 4 * 256;
  alignas(32) __m256 leaf[T][kLeaves];
  const int64_t row_bytes = W.row_bytes();
  for (int64_t r = r0; r < r1; ++r) {
    if (r + 2 < r1) {
      const char* next = W.row(r + 2);
      for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    }
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
          W.load(r, k, &wa, &wb);
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
template <int R, int T, class Rows>
DET_AVX2 void tile(const Rows& W, int64_t K, const float* Xp, float* Y, int64_t ldy, int64_t r,
                   __m256* leaves) {
  for (int L = 0; L < kLeaves; ++L) {
    const int g = L / 2, h = L % 2;
    __m256 acc[R][T];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < T; ++b) acc[i][b] = _mm256_setzero_ps();
    for (int64_t k = kGroup * g; k < K; k += 256) {
      __m256 w[R];
      for (int i = 0; i < R; ++i) w[i] = W.half(r + i, k, h);
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
template <int R, class Rows>
DET_AVX2 void row_block(const Rows& W, int64_t K, const float* Xp, int64_t B, float* Y, int64_t ldy, int64_t r,
                        __m256* leaves) {
  int64_t b = 0;
  for (; b + 4 <= B; b += 4) tile<R, 4, Rows>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves);
  switch (B - b) {
    case 3: tile<R, 3, Rows>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    case 2: tile<R, 2, Rows>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    case 1: tile<R, 1, Rows>(W, K, Xp + b * K, Y + b * ldy, ldy, r, leaves); break;
    default: break;
  }
}

template <class Rows>
DET_AVX2 void gemv_rows(const Rows& W, int64_t K, const float* Xp, int64_t B, float* Y, int64_t ldy, int64_t r0,
                        int64_t r1) {
  if (B == 1) return stream_rows<1>(W, K, Xp, Y, ldy, r0, r1);
  if (B == 2) return stream_rows<2>(W, K, Xp, Y, ldy, r0, r1);
  alignas(32) __m256 leaves[12 * kLeaves];
  int64_t r = r0;
  for (; r + 3 <= r1; r += 3) row_block<3>(W, K, Xp, B, Y, ldy, r, leaves);
  for (; r < r1; ++r) row_block<1>(W, K, Xp, B, Y, ldy, r, leaves);
}

}  // namespace

DET_AVX2 void det_gemv_rows_avx2(const det_matrix& W, int64_t K, const float* X, int64_t B, float* Y,
                                 int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> xp;
  if ((int64_t)xp.size() < B * K) xp.resize(B * K);
  for (int64_t b = 0; b < B; ++b) permute_input(X + b * K, xp.data() + b * K, K);
  if (W.bf16) return gemv_rows(Bf16Rows{W.bf16, K}, K, xp.data(), B, Y, ldy, r0, r1);
  gemv_rows(Nf4Rows(W, K), K, xp.data(), B, Y, ldy, r0, r1);
}

// Canonical dot of two fp32 vectors (K % 8 == 0), natural lane order.
DET_AVX2 float det_dot_f32_avx2(const float* a, const float* b, int64_t K) {
  alignas(32) __m256 leaf[kLeaves];
  for (int x = 0; x < kLeaves; ++x) leaf[x] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 256) {
    const int n = (int)std::min<int64_t>(256, K - k0) / 8;
    for (int x = 0; x < n; ++x)
      leaf[x] = _mm256_fmadd_ps(_mm256_loadu_ps(a + k0 + 8 * x), _mm256_loadu_ps(b + k0 + 8 * x), leaf[x]);
  }
  return tree_natural(leaf);
}
