// det_nf4_decode.cpp: nf4 rows (docs/SPEC.md §16) decoded to their bf16 weights for the GEMV
// (x86/det_gemv_avx2.cpp), with AVX2 or with AVX-512 (BW + VL). Both give exactly
// det_nf4_weight_f32 per element; tests/test_engine_kernels.py checks each against the dense GEMV
// over bitsandbytes' own dequantization.
#include <immintrin.h>

#include <vector>

#include "../det_kernels_cpu.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))
#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))

namespace {

// bf16 bits (in the low 16 of each lane) of fl(v) rounded to nearest even; NaN -> 0x7fc0
// (det_f32_to_bf16 lane by lane).
DET_AVX2 inline __m256i bf16_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}

// The 16 possible weights of a block with scale s, bf16 bits in code order.
DET_AVX2 inline __m256i block_weights(__m256 code_lo, __m256 code_hi, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  const __m256i w16 = _mm256_packus_epi32(bf16_bits(_mm256_mul_ps(code_lo, sv)), bf16_bits(_mm256_mul_ps(code_hi, sv)));
  return _mm256_permute4x64_epi64(w16, 0xd8);  // packus interleaves 64-bit pieces: codes 0..7 | 8..15
}

// Per block, the 16 possible weights bf16(fl(code[c] * absmax)) (det_nf4_weight_f32) are made once,
// as a byte table of their low halves and one of their high halves; codes are then byte shuffles
// (pshufb takes the 4-bit code as its index). Blocks hold at least 16
// elements and start at multiples of their length, so a 16-element group (flat index a multiple
// of 16) lies in one block, and so does a 32-element group at a multiple of 32 when blocks hold 32+.
struct Avx2Decoder {
  const uint8_t* q;
  const float* absmax;
  int64_t shift;
  __m256 code_lo, code_hi;
  std::vector<__m128i>& tables;  // per block of the current row: low-byte table, high-byte table

  DET_AVX2 Avx2Decoder(const det_matrix& W, std::vector<__m128i>& scratch)
      : q(W.nf4), absmax(W.absmax), shift(W.block_shift), code_lo(_mm256_loadu_ps(W.code)),
        code_hi(_mm256_loadu_ps(W.code + 8)), tables(scratch) {}

  // The two byte tables of block b.
  DET_AVX2 void table(int64_t b, __m128i* out) const {
    const __m256i ordered = block_weights(code_lo, code_hi, absmax[b]);
    const __m256i split = _mm256_shuffle_epi8(  // per 128 bits: low bytes, then high bytes
        ordered, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                  0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m128i a = _mm256_castsi256_si128(split), c = _mm256_extracti128_si256(split, 1);
    out[0] = _mm_unpacklo_epi64(a, c);
    out[1] = _mm_unpackhi_epi64(a, c);
  }

  // 16 weights from flat index i (a multiple of 16) with the tables t of its block.
  DET_AVX2 void group16(int64_t i, const __m128i* t, uint16_t* out) const {
    const __m128i nibble = _mm_set1_epi8(15);
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i / 2));
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble),
                                            _mm_and_si128(bytes, nibble));  // element order
    const __m128i lo = _mm_shuffle_epi8(_mm_load_si128(t), codes), hi = _mm_shuffle_epi8(_mm_load_si128(t + 1), codes);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), _mm_unpackhi_epi8(lo, hi));
  }

  // 32 weights from flat index i (a multiple of 32, blocks of 32 or more).
  DET_AVX2 void group32(int64_t i, const __m128i* t, uint16_t* out) const {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i / 2)));
    const __m256i codes = _mm256_or_si256(_mm256_srli_epi16(w, 4),  // byte 2j: high nibble, 2j+1: low
                                          _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(15)), 8));
    const __m256i lo = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(t)), codes);
    const __m256i hi = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(t + 1)), codes);
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);  // 0..7|16..23, 8..15|24..31
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(a, b, 0x31));
  }

  // out[0..K) = the bf16 weights of the row starting at flat index i0 (i0 % 16 == 0, K % 16 == 0).
  // The tables of the row's blocks are made first (independent of each other), then the codes.
  DET_AVX2 void row(int64_t i0, int64_t K, uint16_t* out) {
    const int64_t b0 = i0 >> shift, nb = ((i0 + K - 1) >> shift) - b0 + 1;
    if ((int64_t)tables.size() < 2 * nb) tables.resize(2 * nb);
    for (int64_t b = 0; b < nb; ++b) table(b0 + b, &tables[2 * b]);
    auto t = [&](int64_t k) { return &tables[2 * (((i0 + k) >> shift) - b0)]; };
    int64_t k = 0;
    if (shift < 5) {
      for (; k < K; k += 16) group16(i0 + k, t(k), out + k);
      return;
    }
    if (i0 % 32) group16(i0, t(0), out), k = 16;
    for (; k + 32 <= K; k += 32) group32(i0 + k, t(k), out + k);
    if (k < K) group16(i0 + k, t(k), out + k);
  }
};

// AVX-512 (BW + VL): vpermw looks the 16 codes of a group up in the block's 16 bf16 weights at
// once. Codes as 16-bit indices in element order: lane j of the 32-bit view holds byte j, whose
// high nibble is element 2j and low nibble element 2j+1.
DET_AVX512 void decode_row_avx512(const det_matrix& W, int64_t i0, int64_t K, uint16_t* out) {
  const __m256 code_lo = _mm256_loadu_ps(W.code), code_hi = _mm256_loadu_ps(W.code + 8);
  const int64_t shift = W.block_shift;
  int64_t block = -1;
  __m256i table = _mm256_setzero_si256();
  for (int64_t k = 0; k < K; k += 16) {
    const int64_t i = i0 + k;
    if ((i >> shift) != block) block = i >> shift, table = block_weights(code_lo, code_hi, W.absmax[block]);
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(W.nf4 + i / 2)));
    const __m256i codes = _mm256_or_si256(_mm256_srli_epi32(b, 4), _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(15)), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_permutexvar_epi16(codes, table));
  }
}

}  // namespace

void det_nf4_decode_row(const det_matrix& W, int64_t i0, int64_t K, uint16_t* out) {
  if (det_cpu_isa() >= DET_ISA_AVX512) return decode_row_avx512(W, i0, K, out);
  thread_local std::vector<__m128i> tables;
  Avx2Decoder(W, tables).row(i0, K, out);
}
