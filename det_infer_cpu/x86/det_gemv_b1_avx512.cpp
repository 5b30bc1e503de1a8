// det_gemv_b1_avx512.cpp: the canonical GEMV (docs/SPEC.md §9) of one input (the batch-1 decode
// step) against bf16 or nf4 rows (§16) with AVX-512 (F, BW, VL, DQ), nf4 decoded in registers.
//
// Leaves in natural order: zmm register L holds residues 16L .. 16L+15, so the row is walked in
// increasing k and element k's term goes to register (k / 16) % 16, lane k % 16: every residue's
// fma chain runs in increasing k, as in the reference. All 16 leaves stay in registers.
// bf16 weights widen by a zero-extension and a shift. nf4: the 16 possible values of the current block, bf16(fl(code[c] * absmax)) as fp32
// (det_nf4_weight_f32), sit in one register; vpermd looks 16 codes up at once.
// Tree: residue j + 128, +64, +32, +16 is register L + 8, +4, +2, +1; then lanes j + 8, +4, +2, +1.
#include <immintrin.h>

#include "../det_kernels_cpu.h"

#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

// The 16 weights of a block with scale s, as fp32 values of bf16 (det_nf4_weight_f32 per code).
DET_AVX512 inline __m512 block_weights(__m512 code, float s) {
  const __m512 p = _mm512_mul_ps(code, _mm512_set1_ps(s));
  const __m512i u = _mm512_castps_si512(p);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))),
                                     _mm512_set1_epi32((int)0xffff0000u));
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc00000)));
}

// Codes of the 16 elements at flat index i (a multiple of 16) as 32-bit lanes in element order:
// element 2j is the high nibble of byte j, element 2j+1 the low nibble.
DET_AVX512 inline __m512i codes16(const uint8_t* q, int64_t i) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + (uint64_t)i / 2)));
  const __m256i hi = _mm256_srli_epi32(b, 4), lo = _mm256_and_si256(b, _mm256_set1_epi32(15));
  const __m512i interleave = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  return _mm512_permutex2var_epi32(_mm512_castsi256_si512(hi), interleave, _mm512_castsi256_si512(lo));
}

DET_AVX512 inline float tree(__m512 (&v)[16]) {
  for (int L = 0; L < 8; ++L) v[L] = _mm512_add_ps(v[L], v[L + 8]);  // j + 128
  for (int L = 0; L < 4; ++L) v[L] = _mm512_add_ps(v[L], v[L + 4]);  // j + 64
  for (int L = 0; L < 2; ++L) v[L] = _mm512_add_ps(v[L], v[L + 2]);  // j + 32
  v[0] = _mm512_add_ps(v[0], v[1]);                                    // j + 16
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v[0]), _mm512_extractf32x8_ps(v[0], 1));  // j + 8
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));                   // j + 4
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));                                                            // j + 2
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));                                                        // j + 1
  return _mm_cvtss_f32(q);
}

// The walk over rows [r0, r1): weight(r, k) gives the fp32 weights of elements k .. k+15 of row r.
template <class Weights>
DET_AVX512 inline void rows(int64_t K, const float* x, float* y, int64_t r0, int64_t r1, const char* base,
                            int64_t row_bytes, Weights weight) {
  for (int64_t r = r0; r < r1; ++r) {
    if (r + 2 < r1) det_prefetch_l1(base + (r + 2) * row_bytes, row_bytes);
    __m512 leaf[16];
    for (int L = 0; L < 16; ++L) leaf[L] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += 256) {
      for (int L = 0; L < 16; ++L) {  // unrolled: leaf[L] stays a register
        const int64_t k = k0 + 16 * L;
        if (k >= K) break;
        leaf[L] = _mm512_fmadd_ps(weight(r, k), _mm512_loadu_ps(x + k), leaf[L]);
      }
    }
    y[r] = tree(leaf);
  }
}

// Weight sources (functors: a lambda would not carry the target attribute).
struct Bf16Weights {
  const uint16_t* w;
  int64_t K;
  DET_AVX512 __m512 operator()(int64_t r, int64_t k) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

struct Nf4Weights {
  const det_matrix& W;
  int64_t K;
  __m512 code;
  int64_t block = -1;
  __m512 table = _mm512_setzero_ps();
  DET_AVX512 __m512 operator()(int64_t r, int64_t k) {
    const int64_t i = r * K + k;
    if ((i >> W.block_shift) != block) block = i >> W.block_shift, table = block_weights(code, W.absmax[block]);
    return _mm512_permutexvar_ps(codes16(W.nf4, i), table);
  }
};

}  // namespace

DET_AVX512 void det_gemv_rows_b1_avx512(const det_matrix& W, int64_t K, const float* x, float* y, int64_t r0,
                                        int64_t r1) {
  if (W.bf16)
    return rows(K, x, y, r0, r1, reinterpret_cast<const char*>(W.bf16), 2 * K, Bf16Weights{W.bf16, K});
  rows(K, x, y, r0, r1, reinterpret_cast<const char*>(W.nf4), K / 2, Nf4Weights{W, K, _mm512_loadu_ps(W.code)});
}
