// det_bf16.h: bf16 <-> fp32 (docs/SPEC.md §8). Widening is exact (a 16-bit shift); narrowing
// rounds to nearest even on the integer bits, NaN -> 0x7fc0 (the canonical quiet NaN, as torch).
#pragma once

#include "det_round.h"

DET_HD float det_bf16_to_f32(uint16_t h) { return det_bits_f32((uint32_t)h << 16); }

DET_HD uint16_t det_f32_to_bf16(float x) {
  uint32_t u = det_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even; overflow carries into inf correctly
  return (uint16_t)(u >> 16);
}
