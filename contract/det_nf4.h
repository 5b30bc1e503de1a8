// det_nf4.h: weight matrices as every executor sees them, dense bf16 or nf4-packed, and the one
// nf4 dequantization formula (docs/SPEC.md §16).
//
// nf4 (bitsandbytes' "NormalFloat4"): the matrix's elements in flat row-major order are cut into
// blocks of 2^block_shift; element i is the 4-bit code q[i] (byte i/2, high nibble for even i) and
// its weight is
//     w[i] = bf16( fl32(code[q[i]] * absmax[i >> block_shift]) )
// one IEEE fp32 multiply, then round to nearest even to bf16. The fp32 value of w[i] then enters
// the dense path's fma order unchanged, so an nf4 matrix and the dense matrix holding these bf16
// values give the same bits. absmax is fp32, one per block (nested absmax is resolved at load,
// torch-ext/det_infer/bnb_io.py).
#pragma once

#include <stdint.h>

#include "det_bf16.h"

struct det_matrix {
  const uint16_t* bf16;   // (rows, cols) bf16 bits; null when the matrix is nf4-packed
  const uint8_t* nf4;     // (rows*cols/2) packed codes, two per byte, high nibble first
  const float* absmax;    // (rows*cols >> block_shift) fp32 block scales
  const float* code;      // the 16 codebook values, det_nf4_code_bits (on the executor's device)
  int64_t block_shift;    // log2 of the block length (3 .. 20)
};

// bitsandbytes' nf4 quant_map as fp32 bit patterns (bitsandbytes.functional.get_4bit_type("nf4")).
#define DET_NF4_CODE_BITS                                                                        \
  {0xbf800000u, 0xbf3239b1u, 0xbf066b30u, 0xbeca32a0u, 0xbe91a24du, 0xbe3d353fu, 0xbdba7871u,    \
   0x00000000u, 0x3da2faffu, 0x3e24cae3u, 0x3e7c04ddu, 0x3ead033au, 0x3ee1a4b8u, 0x3f1007abu,    \
   0x3f3913b3u, 0x3f800000u}
#define DET_NF4_MIN_BLOCK_SHIFT 3   // 8 elements: the megakernel's per-lane group never straddles
#define DET_NF4_MAX_BLOCK_SHIFT 20

// A dense bf16 matrix (the lm_head, or any projection kept in bf16).
DET_HD det_matrix det_dense_matrix(const uint16_t* bf16) {
  det_matrix m = {bf16, nullptr, nullptr, nullptr, 0};
  return m;
}

// A matrix the executors can read: dense, or nf4 with its scales, codebook and a block in range.
DET_HD bool det_matrix_valid(const det_matrix& w) {
  if (w.bf16) return true;
  return w.nf4 && w.absmax && w.code && w.block_shift >= DET_NF4_MIN_BLOCK_SHIFT &&
         w.block_shift <= DET_NF4_MAX_BLOCK_SHIFT;
}

// The 4-bit code of flat element i.
DET_HD unsigned det_nf4_index(const uint8_t* q, int64_t i) {
  const uint8_t b = q[i >> 1];
  return (i & 1) ? (b & 15u) : (unsigned)(b >> 4);
}

// The fp32 value of one weight: code value times its block's absmax, rounded to bf16.
DET_HD float det_nf4_weight_f32(float code_value, float absmax) {
  return det_bf16_to_f32(det_f32_to_bf16(det_mul_f32(code_value, absmax)));
}

// Nested (double-quantized) absmax, resolved once at load: block b's absmax is stored as an 8-bit
// code q2[b] of a second blockwise quantization (codebook code2, one fp32 scale absmax2 per
// nested block) around a common offset:
//     absmax[b] = fl32( fl32(code2[q2[b]] * absmax2[b / nested_block]) + offset )
DET_HD float det_nf4_nested_absmax_f32(float code2_value, float absmax2, float offset) {
  return det_add_f32(det_mul_f32(code2_value, absmax2), offset);
}

// The fp32 value of element (r, k) of a matrix with `cols` columns, dense or nf4.
DET_HD float det_matrix_at_f32(const det_matrix& w, int64_t cols, int64_t r, int64_t k) {
  const int64_t i = r * cols + k;
  if (w.bf16) return det_bf16_to_f32(w.bf16[i]);
  return det_nf4_weight_f32(w.code[det_nf4_index(w.nf4, i)], w.absmax[i >> w.block_shift]);
}
