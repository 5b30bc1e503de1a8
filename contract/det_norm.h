// det_norm.h: RMSNorm (docs/SPEC.md §13.2). The sum of squares is the canonical reduction
// (det_reduce.h) with fma; then mean, eps, rsqrt and two multiplications, each rounded.
#pragma once

#include "det_reduce.h"
#include "det_rsqrt.h"

// The factor r = rsqrt(fl(fl(ss / K) + eps)) for a row whose canonical sum of squares is ss.
DET_HD float det_rmsnorm_factor_f32(float ss, long long K, float eps) {
  return det_rsqrt_f32(det_add_f32(det_div_f32(ss, (float)K), eps));
}

// One element: fl(fl(x * r) * w). w is the fp32 multiplier made once at load (SPEC §13.2): the
// bf16 weight widened, or for Gemma fl(1 + weight). (w * (x*r) is the same product.)
DET_HD float det_rmsnorm_scale_f32(float x, float r, float w) {
  return det_mul_f32(det_mul_f32(x, r), w);
}

// Reference: y = rmsnorm(x) * w over K elements; x and the multipliers w are (K,) fp32.
DET_HD void det_rmsnorm_ref(const float* x, const float* w, float* y, long long K, float eps) {
  float r = det_rmsnorm_factor_f32(det_dot_f32_ref(x, x, K), K, eps);
  for (long long k = 0; k < K; ++k) y[k] = det_rmsnorm_scale_f32(x[k], r, w[k]);
}
