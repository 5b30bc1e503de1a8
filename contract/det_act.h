// det_act.h: the MLP activations silu and gelu-tanh (docs/SPEC.md §5).
//
// Both are x * sigmoid(z): silu has z = x; gelu-tanh's 0.5*x*(1 + tanh(v)) equals x*sigmoid(2v)
// exactly in real arithmetic, and the sigmoid form has no cancellation at large negative x.
// z, e^{-|z|}, 1 + e^{-|z|} and the quotient are double-floats; the result is rounded once,
// subnormal outputs included (det_f32x2_ldexp_f32). gelu's z is formed in double-float too: an
// fp32 z of magnitude 70 would carry an absolute error that e^z turns into ~100 ulp.
#pragma once

#include "det_exp.h"

#define DET_SIGMOID_ZERO 120.0f  // |z| above: x*sigmoid(z) is x or rounds to +-0 (|x| <= 2|z|+1)

// x * sigmoid(z.hi + z.lo) for finite x, z with |x| <= 2|z| + 1 (true for both callers):
//   z.hi > 120: x;  z.hi < -120: +-0 with x's sign. Otherwise, with e^{-|z|} = m * 2^k:
//   E = (ldexp(m.hi, k), ldexp(m.lo, k)), d = 1 + E (double-float),
//   z >= 0: q = (x, 0) / d;  z < 0: q = two_prod(x, m.hi) + x*m.lo, then q = q / d;
//   result fl(q.hi + q.lo) when z >= 0, det_f32x2_ldexp_f32(q, k) when z < 0 (one rounding,
//   subnormal results included), with x's sign copied on (sigmoid > 0, so this only decides
//   the sign of a zero: silu(-0) = -0).
DET_HD float det_mul_sigmoid_f32(float x, det_f32x2 z) {
  if (z.hi > DET_SIGMOID_ZERO) return x;
  if (z.hi < -DET_SIGMOID_ZERO) return det_copysign_f32(0.0f, x);
  bool neg = z.hi < 0.0f;
  det_f32x2 minus_abs = neg ? z : det_f32x2{-z.hi, -z.lo};
  det_exp_parts e = det_exp_reduce_f32x2(minus_abs);
  det_f32x2 d = det_fast_two_sum_f32(1.0f, det_ldexp_f32(e.m.hi, e.k));
  d = det_fast_two_sum_f32(d.hi, det_add_f32(d.lo, det_ldexp_f32(e.m.lo, e.k)));
  if (!neg) {
    det_f32x2 q = det_f32x2_div({x, 0.0f}, d);
    return det_copysign_f32(det_add_f32(q.hi, q.lo), x);
  }
  det_f32x2 num = det_two_prod_f32(x, e.m.hi);
  num = det_fast_two_sum_f32(num.hi, det_fma_f32(x, e.m.lo, num.lo));
  det_f32x2 q = det_f32x2_div(num, d);
  return det_copysign_f32(det_f32x2_ldexp_f32(q, e.k), x);
}

// silu(x) = x * sigmoid(x). NaN -> NaN, silu(-inf) = -0, silu(+inf) = +inf.
DET_HD float det_silu_f32(float x) {
  if (det_isnan_f32(x)) return det_nan_f32();
  return det_mul_sigmoid_f32(x, {x, 0.0f});
}

// 0.044715 and 2*sqrt(2/pi) as double-floats (hi = fp32 of the value, lo = fp32 of the rest).
#define DET_GELU_A_HI 0x1.6e4e26p-5f
#define DET_GELU_A_LO 0x1.a9003ep-30f
#define DET_GELU_2C_HI 0x1.988454p+0f
#define DET_GELU_2C_LO -0x1.857936p-25f
#define DET_GELU_BIG 12.0f  // |x| above: |z| > 140, so sigmoid is 0 or 1 (and x^3 cannot overflow)

// gelu-tanh(x) = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715 x^3))) = x * sigmoid(z),
// z = 2C * (x + A * x^3) in double-float: x2 = two_prod(x, x), x3 = x2 * x, t = A * x3,
// u = x + t (two_sum on the heads), z = 2C * u.
DET_HD float det_gelu_tanh_f32(float x) {
  if (det_isnan_f32(x)) return det_nan_f32();
  if (det_abs_f32(x) > DET_GELU_BIG) return x > 0.0f ? x : det_copysign_f32(0.0f, x);
  det_f32x2 x3 = det_f32x2_mul(det_two_prod_f32(x, x), {x, 0.0f});
  det_f32x2 t = det_f32x2_mul({DET_GELU_A_HI, DET_GELU_A_LO}, x3);
  det_f32x2 u = det_two_sum_f32(x, t.hi);
  u = det_fast_two_sum_f32(u.hi, det_add_f32(u.lo, t.lo));
  det_f32x2 z = det_f32x2_mul({DET_GELU_2C_HI, DET_GELU_2C_LO}, u);
  return det_mul_sigmoid_f32(x, z);
}

// Final-logit softcapping (Gemma-4): c * tanh(z / c), each step rounded: fl(c * tanh(fl(z / c))).
DET_HD float det_softcap_f32(float z, float c) {
  return det_mul_f32(c, det_tanh_f32(det_div_f32(z, c)));
}

// The MLP activation a model uses (det_llama_model.act).
enum { DET_ACT_SILU = 0, DET_ACT_GELU_TANH = 1 };
DET_HD float det_act_f32(int act, float x) {
  return act == DET_ACT_GELU_TANH ? det_gelu_tanh_f32(x) : det_silu_f32(x);
}
