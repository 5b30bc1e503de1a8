// det_log.h: the natural logarithm from IEEE basic operations only (docs/SPEC.md §4.5).
//
// x = 2^e * m with m in [sqrt(1/2), sqrt(2)); log x = e*ln2 + 2*atanh(s), s = (m - 1) / (m + 1),
// |s| <= 0.1716. The quotient, the first three series terms and e*ln2 are carried as double-floats
// (the same three-term ln2 split as exp), the higher terms in fp32 Horner; the relative error is
// near 2^-44 before the single rounding of hi + lo. Accuracy: docs/RESULTS.md §1.
#pragma once

#include "det_exp.h"  // DET_EXP_LN2_{HI,MID,LO}

#define DET_LOG_SQRT2 0x1.6a09e6p+0f  // fp32(sqrt 2) rounded down: mantissas above it are halved

// log(x), fp32 -> fp32. NaN and x < 0 -> NaN, +-0 -> -inf, +inf -> +inf, log(1) = +0.
//   subnormal x: x = fl(x * 2^23) (exact), e -= 23
//   m = x's significand in [1, 2), e its exponent; m > DET_LOG_SQRT2: m = m/2, e = e + 1
//   f = fl(m - 1) (exact, Sterbenz); d = two_sum(f, 2); s = f32x2_div((f, 0), d); t = f32x2_mul(s, s)
//   q = Horner of c_8 .. c_4 in fp32 fma on t.hi, c_n = 2/(2n+1); then for n = 3, 2, 1:
//       p = add_dominant(c_n, mul(p, t)) in double-float, starting from p = (q, 0)
//   L = add_dominant(2s, mul(mul(p, t), s))                     (log m = 2s + s*t*P(t))
//   E = e*ln2: (hi, lo) = two_sum(e*HI, e*MID) (both exact); fast_two_sum(hi, fl(lo + fl(e*LO)))
//   result = fl(R.hi + R.lo), R = add_dominant(E, L) (|E| >= 2|L| unless e = 0, when E = 0)
DET_HD float det_log_f32(float x) {
  if (det_isnan_f32(x) || x < 0.0f) return det_nan_f32();
  if (x == 0.0f) return det_bits_f32(0xff800000u);
  if (x == det_bits_f32(0x7f800000u)) return x;
  int e = 0;
  if (x < 0x1.0p-126f) x = det_mul_f32(x, 0x1.0p+23f), e = -23;
  const uint32_t bits = det_f32_bits(x);
  e += (int)(bits >> 23) - 127;
  float m = det_bits_f32((bits & 0x7fffffu) | 0x3f800000u);
  if (m > DET_LOG_SQRT2) m = det_mul_f32(m, 0.5f), e += 1;

  const float f = det_sub_f32(m, 1.0f);
  const det_f32x2 s = det_f32x2_div({f, 0.0f}, det_two_sum_f32(f, 2.0f));
  const det_f32x2 t = det_f32x2_mul(s, s);
  float q = 0x1.e1e1e2p-4f;                  // 2/17
  q = det_fma_f32(q, t.hi, 0x1.111112p-3f);  // 2/15
  q = det_fma_f32(q, t.hi, 0x1.3b13b2p-3f);  // 2/13
  q = det_fma_f32(q, t.hi, 0x1.745d18p-3f);  // 2/11
  q = det_fma_f32(q, t.hi, 0x1.c71c72p-3f);  // 2/9
  const det_f32x2 c[3] = {
      {0x1.555556p-1f, -0x1.555556p-26f},     // 2/3
      {0x1.99999ap-2f, -0x1.99999ap-28f},     // 2/5
      {0x1.24924ap-2f, -0x1.b6db6ep-27f},     // 2/7
  };
  det_f32x2 p = {q, 0.0f};
  DET_UNROLL
  for (int n = 2; n >= 0; --n) p = det_f32x2_add_dominant(c[n], det_f32x2_mul(p, t));
  const det_f32x2 two_s = {det_add_f32(s.hi, s.hi), det_add_f32(s.lo, s.lo)};
  const det_f32x2 L = det_f32x2_add_dominant(two_s, det_f32x2_mul(det_f32x2_mul(p, t), s));

  const float ef = (float)e;
  det_f32x2 E = det_two_sum_f32(det_mul_f32(ef, DET_EXP_LN2_HI), det_mul_f32(ef, DET_EXP_LN2_MID));
  E = det_fast_two_sum_f32(E.hi, det_add_f32(E.lo, det_mul_f32(ef, DET_EXP_LN2_LO)));
  const det_f32x2 R = det_f32x2_add_dominant(E, L);
  return det_add_f32(R.hi, R.lo);
}
