// det_rsqrt.h: 1/sqrt(x) through fp64 sqrt and divide (docs/SPEC.md §6).
// fl32(fl64(1 / fl64(sqrt(x)))): two fp64 roundings (relative 2^-53 each) before the one fp32
// rounding, so the result is the correctly rounded value unless 1/sqrt(x) lies within ~2^-52 of
// an fp32 rounding boundary (none found in the test sweep). Per row, not per element: fp64 rate
// does not matter here.
#pragma once

#include "det_round.h"

// +0 -> +inf, -0 -> -inf, +inf -> +0 (from IEEE sqrt and divide); x < 0 or NaN -> the contract NaN.
DET_HD float det_rsqrt_f32(float x) {
  if (det_isnan_f32(x) || x < 0.0f) return det_nan_f32();
  return det_f64_to_f32(det_div_f64(1.0, det_sqrt_f64((double)x)));
}

// sqrt(x) for fp32 x: fl32(fl64(sqrt(x))). fp64 carries more than 2*24 + 2 bits, so the double
// rounding is innocuous: this is IEEE's correctly rounded fp32 sqrt (Gemma's sqrt(hidden) scales).
DET_HD float det_sqrt_f32(float x) {
  return det_f64_to_f32(det_sqrt_f64((double)x));
}
