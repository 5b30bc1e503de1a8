// det_exp.h: exp and tanh from IEEE basic operations only (docs/SPEC.md §4).
//
// exp(x) = 2^k * e^r with k = round(x*log2 e) and r = x - k*ln2 carried as a double-float
// (three-term Cody-Waite split of ln2: the first two terms have 15 significant bits, so k*term
// is exact for |k| < 512); e^r is the degree-11 Taylor polynomial, terms 11..6 in fp32 Horner and
// terms 5..0 in double-float, leaving a relative error near 2^-42 before the single rounding of
// hi + lo (subnormal results included). Accuracy: docs/RESULTS.md §1.
#pragma once

#include "det_f32x2.h"

#define DET_EXP_LOG2E 0x1.715476p+0f   // fp32(1/ln 2)
#define DET_EXP_LN2_HI 0x1.62e4p-1f    // ln 2 to 15 bits
#define DET_EXP_LN2_MID 0x1.7f7cp-20f  // next 15 bits
#define DET_EXP_LN2_LO 0x1.1cf79ap-36f // fp32 of the rest; ln2 - (HI+MID+LO) ~ 6e-19
#define DET_ROUND_MAGIC_F32 0x1.8p+23f // adding it rounds |v| < 2^22 to an integer (ties to even)

// exp's reduced result: e^x ~= (m.hi + m.lo) * 2^k, m.hi in [0.70, 1.42].
struct det_exp_parts {
  det_f32x2 m;
  int k;
};

// Reduces the double-float x = x.hi + x.lo (x.lo = 0 for a plain fp32 argument). Valid for
// x.hi in [-180, 89] (k in [-260, 129]); callers clamp first. No special values here.
//   k = fl(fl(fl(x.hi*LOG2E) + M) - M)             (M = 1.5*2^23: round to integer, ties to even)
//   a = fl(x.hi - k*HI)                            (exact: k*HI exact, Sterbenz)
//   (r.hi, r.lo) = two_sum(a, -k*MID)              (k*MID exact)
//   r.lo = fl(fl(r.lo - fl(k*LO)) + x.lo); r = fast_two_sum(r.hi, r.lo)
//   e^r: q = Horner of 1/11! .. 1/6! in fp32 fma on r.hi; then for i = 5..0:
//        p = add_dominant(c_i, mul(p, r)) in double-float, starting from p = (q, 0).
DET_HD det_exp_parts det_exp_reduce_f32x2(det_f32x2 x) {
  float kf = det_sub_f32(det_add_f32(det_mul_f32(x.hi, DET_EXP_LOG2E), DET_ROUND_MAGIC_F32),
                         DET_ROUND_MAGIC_F32);
  float a = det_sub_f32(x.hi, det_mul_f32(kf, DET_EXP_LN2_HI));
  det_f32x2 r = det_two_sum_f32(a, -det_mul_f32(kf, DET_EXP_LN2_MID));
  r.lo = det_add_f32(det_sub_f32(r.lo, det_mul_f32(kf, DET_EXP_LN2_LO)), x.lo);
  r = det_fast_two_sum_f32(r.hi, r.lo);

  // Taylor coefficients 1/i!: fp32 for i >= 6, double-float (hi, lo) for i <= 5.
  float q = 0x1.ae6456p-26f;                       // 1/11!
  q = det_fma_f32(q, r.hi, 0x1.27e4fcp-22f);       // 1/10!
  q = det_fma_f32(q, r.hi, 0x1.71de3ap-19f);       // 1/9!
  q = det_fma_f32(q, r.hi, 0x1.a01a02p-16f);       // 1/8!
  q = det_fma_f32(q, r.hi, 0x1.a01a02p-13f);       // 1/7!
  q = det_fma_f32(q, r.hi, 0x1.6c16c2p-10f);       // 1/6!
  const det_f32x2 c[6] = {
      {0x1.0p+0f, 0.0f},                           // 1/0!
      {0x1.0p+0f, 0.0f},                           // 1/1!
      {0x1.0p-1f, 0.0f},                           // 1/2!
      {0x1.555556p-3f, -0x1.555556p-28f},          // 1/3!
      {0x1.555556p-5f, -0x1.555556p-30f},          // 1/4!
      {0x1.111112p-7f, -0x1.ddddep-32f},           // 1/5!
  };
  det_f32x2 p = {q, 0.0f};
  DET_UNROLL
  for (int i = 5; i >= 0; --i) p = det_f32x2_add_dominant(c[i], det_f32x2_mul(p, r));
  return {p, (int)kf};
}

// (m.hi + m.lo) * 2^k rounded once to fp32: a normalized double-float (|m.lo| <= ulp(m.hi)/2),
// m.hi normal or zero, k in [-300, 254]. With e the exponent of m.hi:
//   e + k > -126 (normal result): fl(m.hi + m.lo), then an exact scaling by 2^k;
//   e + k < -151: +-0 (|value| < 2^-150);
//   otherwise (subnormal result, or the binade edge e + k == -126 with m.hi = +-2^e and m.lo
//   pulling below it): a = |m.hi| * 2^(k+149) (exact, <= 2^23) is rounded to an integer n by the
//   2^23 magic add; a tie on a alone (|a - n| = 1/2) is broken by the sign of m.lo relative to
//   m.hi; the result +-n * 2^-149 is exact. Subnormal m.hi: fl(m.hi + m.lo) * 2^k (rounded twice).
DET_HD float det_f32x2_ldexp_f32(det_f32x2 m, int k) {
  uint32_t bits = det_f32_bits(m.hi);
  int e = (int)((bits >> 23) & 0xffu) - 127;
  bool lo_pulls_down = (m.lo < 0.0f) != (m.hi < 0.0f) && m.lo != 0.0f;
  bool edge = e + k == -126 && (bits & 0x7fffffu) == 0 && lo_pulls_down;
  if (e == -127 || (e + k > -126) || (e + k == -126 && !edge))
    return det_ldexp_f32(det_add_f32(m.hi, m.lo), k);
  if (e + k < -151) return det_copysign_f32(0.0f, m.hi);
  float a = det_ldexp_f32(det_abs_f32(m.hi), k + 149);
  float n = det_sub_f32(det_add_f32(a, 0x1.0p+23f), 0x1.0p+23f);
  float d = det_sub_f32(a, n);
  if (det_abs_f32(d) == 0.5f && m.lo != 0.0f && ((d > 0.0f) != lo_pulls_down))
    n = det_add_f32(n, det_add_f32(d, d));
  return det_copysign_f32(det_mul_f32(det_mul_f32(n, 0x1.0p-126f), 0x1.0p-23f), m.hi);
}

// e^x, fp32 -> fp32. NaN -> NaN, x > 89 -> +inf, x < -104 -> +0 (e^-104 < 2^-150).
// One rounding from the double-float (det_f32x2_ldexp_f32), subnormal results included.
DET_HD float det_exp_f32(float x) {
  if (det_isnan_f32(x)) return det_nan_f32();
  if (x > 89.0f) return det_bits_f32(0x7f800000u);
  if (x < -104.0f) return 0.0f;
  det_exp_parts e = det_exp_reduce_f32x2({x, 0.0f});
  return det_f32x2_ldexp_f32(e.m, e.k);
}

#define DET_TANH_SMALL 0x1.0p-7f  // below: odd Taylor series; above: double-float (e-1)/(e+1)
#define DET_TANH_ONE 9.1f         // above: tanh rounds to 1 (1 - tanh(9.1) < 2^-25)

// tanh(x), fp32 -> fp32, odd (evaluated on |x|, sign copied back, so tanh(-0) = -0).
// |x| < 2^-7: x + x^3 * (-1/3 + x^2 * 2/15) in fp32 (relative error
// ~2^-37); otherwise E = e^{2|x|} as a double-float and (E - 1) / (E + 1) in double-float, rounded
// once. Accuracy: docs/RESULTS.md §1.
DET_HD float det_tanh_f32(float x) {
  if (det_isnan_f32(x)) return det_nan_f32();
  float ax = det_abs_f32(x);
  if (ax > DET_TANH_ONE) return det_copysign_f32(1.0f, x);
  if (ax < DET_TANH_SMALL) {
    float x2 = det_mul_f32(ax, ax);
    float p = det_fma_f32(x2, 0x1.111112p-3f, -0x1.555556p-2f);  // 2/15, -1/3
    return det_copysign_f32(det_fma_f32(det_mul_f32(ax, x2), p, ax), x);
  }
  det_exp_parts e = det_exp_reduce_f32x2({det_add_f32(ax, ax), 0.0f});     // k in [0, 27]: exact scaling
  det_f32x2 big = {det_ldexp_f32(e.m.hi, e.k), det_ldexp_f32(e.m.lo, e.k)};  // E >= 1
  det_f32x2 num = det_fast_two_sum_f32(big.hi, -1.0f);
  num = det_fast_two_sum_f32(num.hi, det_add_f32(num.lo, big.lo));
  det_f32x2 den = det_fast_two_sum_f32(big.hi, 1.0f);
  den = det_fast_two_sum_f32(den.hi, det_add_f32(den.lo, big.lo));
  det_f32x2 q = det_f32x2_div(num, den);
  return det_copysign_f32(det_add_f32(q.hi, q.lo), x);
}
