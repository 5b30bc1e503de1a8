// det_stage_avx512.h: a 256-weight bf16 block in the staged layout of det_lane_blocks.h, in
// registers (AVX-512 F + BW): out[2i + h] holds step i of accumulators 16h .. 16h + 15, i.e. the
// fp32 values of weights 8l + i for l = 16h .. 16h + 15.
//
// The block loads as 8 vectors of 32 bf16 (vector j: weights 32j .. 32j + 31, accumulators 4j ..
// 4j + 3). Accumulators 16h .. 16h + 15 live in vectors 4h .. 4h + 3, so each half is transposed on
// its own: one round of two-source word permutes pairs the vectors (steps 0-3 and 4-7 of 8
// accumulators each), a second round picks one step of 16 accumulators and, zeroing the other
// words, puts each bf16 in the high half of a 32-bit lane: its fp32 value, widened for free.
// 24 permutes per 256 weights.
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "../det_lane_blocks.h"
#include "det_transpose_avx2.h"

#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))

struct det_stage_tables {
  alignas(64) uint16_t pair[2][32];  // round 1, steps 4g .. 4g + 3: word 8c + l <- step 4g + c of accumulator l
  alignas(64) uint16_t pick[4][32];  // round 2, step c (+4): word 2q + 1 <- accumulator q
};

inline const det_stage_tables& det_stage_tables_get() {
  static const det_stage_tables t = [] {
    det_stage_tables s{};
    for (int g = 0; g < 2; ++g)
      for (int P = 0; P < 32; ++P) {
        const int i = 4 * g + P / 8, l = P % 8;  // source: vector 0 holds accumulators 0-3, vector 1 4-7
        s.pair[g][P] = (uint16_t)(l < 4 ? 8 * l + i : 32 + 8 * (l - 4) + i);
      }
    for (int c = 0; c < 4; ++c)
      for (int q = 0; q < 16; ++q) {
        s.pick[c][2 * q] = 0;  // zeroed by the mask
        s.pick[c][2 * q + 1] = (uint16_t)(q < 8 ? 8 * c + q : 32 + 8 * c + (q - 8));
      }
    return s;
  }();
  return t;
}

// Words 32j .. 32j + 31 of the block that are < n, the rest +0.
DET_AVX512 inline __m512i det_stage_load32(const uint16_t* w, int64_t n, int j) {
  const int64_t left = n - 32 * j;
  if (left >= 32) return _mm512_loadu_si512(w + 32 * j);
  if (left <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1), w + 32 * j);
}

// The first n (<= 256) weights at w as a staged block: out[2i + h], +0 past n.
DET_AVX512 inline void det_stage_block_bf16(const uint16_t* w, int64_t n, __m512 (&out)[16]) {
  const det_stage_tables& t = det_stage_tables_get();
  const __m512i pair0 = _mm512_load_si512(t.pair[0]), pair1 = _mm512_load_si512(t.pair[1]);
  for (int h = 0; h < 2; ++h) {
    const __m512i z0 = det_stage_load32(w, n, 4 * h), z1 = det_stage_load32(w, n, 4 * h + 1);
    const __m512i z2 = det_stage_load32(w, n, 4 * h + 2), z3 = det_stage_load32(w, n, 4 * h + 3);
    const __m512i a[2] = {_mm512_permutex2var_epi16(z0, pair0, z1), _mm512_permutex2var_epi16(z0, pair1, z1)};
    const __m512i b[2] = {_mm512_permutex2var_epi16(z2, pair0, z3), _mm512_permutex2var_epi16(z2, pair1, z3)};
    for (int i = 0; i < 8; ++i) {
      const __m512i pick = _mm512_load_si512(t.pick[i % 4]);
      out[2 * i + h] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16((__mmask32)0xAAAAAAAAu, a[i / 4], pick, b[i / 4]));
    }
  }
}

// The tree of docs/SPEC.md §9 over accumulators 0-15 (lo) and 16-31 (hi).
DET_AVX512 inline float det_stage_tree(__m512 lo, __m512 hi) {
  const __m512 v = _mm512_add_ps(lo, hi);                                                         // j + 16
  return det_tree_last8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));  // j + 8
}

// The same tree for 16 outputs at once: out[o] = tree of lo[o], hi[o]. Each step adds lanes j and
// j + s of one output, as det_stage_tree does, but packs the outputs' halves together so that one
// add serves several outputs (61 vector ops for 16 outputs instead of about 9 each plus a store).
DET_AVX512 inline void det_stage_tree16(const __m512 (&lo)[16], const __m512 (&hi)[16], float (&out)[16]) {
  __m512 e[8], h[4], r[2];
  for (int k = 0; k < 8; ++k) {  // j + 16, then j + 8: outputs 2k, 2k + 1 in lanes 0-7, 8-15
    const __m512 a = _mm512_add_ps(lo[2 * k], hi[2 * k]), b = _mm512_add_ps(lo[2 * k + 1], hi[2 * k + 1]);
    e[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int m = 0; m < 4; ++m)  // j + 4: outputs 4m .. 4m + 3, one per 128-bit chunk
    h[m] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * m], e[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(e[2 * m], e[2 * m + 1], 0xDD));
  for (int n = 0; n < 2; ++n)  // j + 2: chunk c, lanes 0-1: output 8n + c, lanes 2-3: output 8n + 4 + c
    r[n] = _mm512_add_ps(_mm512_shuffle_ps(h[2 * n], h[2 * n + 1], 0x44),
                         _mm512_shuffle_ps(h[2 * n], h[2 * n + 1], 0xEE));
  // j + 1: lane 4c + i holds output 4i + c
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xDD));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, f);
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 4; ++i) out[4 * i + c] = lanes[4 * c + i];
}
