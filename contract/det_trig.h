// det_trig.h: sin and cos of an fp64 angle, rounded to fp32, and the rope rotation
// (docs/SPEC.md §7).
//
// Reduction: j = round(theta * 2/pi), r = theta - j*pi/2 with a three-term split of pi/2 (30 + 30
// + 53 bits; j*P1 and j*P2 exact for |j| < 2^23), valid for |theta| <= 2^22 (4.19e6 rad, above
// the 1e6 positions x max frequency 1 that rope needs). sin r and cos r are Taylor polynomials in
// fp64 (degrees 15 and 16 on |r| <= pi/4 + 2^-30: truncation below 2^-53), then one rounding to
// fp32. The angle is evaluated once per (position, frequency), so fp64 throughput does not matter.
#pragma once

#include "det_round.h"

#define DET_TRIG_MAX_ANGLE 0x1.0p+22                 // |theta| above this -> NaN (documented bound)
#define DET_TRIG_2_OVER_PI 0x1.45f306dc9c883p-1      // fp64(2/pi)
#define DET_TRIG_PIO2_1 0x1.921fb548p+0              // pi/2 to 30 bits
#define DET_TRIG_PIO2_2 -0x1.de973dc8p-31            // next 30 bits
#define DET_TRIG_PIO2_3 -0x1.9d9cceba3f91fp-62       // fp64 of the rest; error ~5e-36
#define DET_ROUND_MAGIC_F64 0x1.8p+52                // adding it rounds |v| < 2^51 to an integer

struct det_sincos_f32 {
  float s, c;
};

// sin(theta) and cos(theta) rounded to fp32. NaN, +-inf or |theta| > 2^22 -> (NaN, NaN).
DET_HD det_sincos_f32 det_sincos_f64(double theta) {
  if (!(theta >= -DET_TRIG_MAX_ANGLE && theta <= DET_TRIG_MAX_ANGLE)) {
    return {det_nan_f32(), det_nan_f32()};
  }
  double jf = det_sub_f64(det_add_f64(det_mul_f64(theta, DET_TRIG_2_OVER_PI), DET_ROUND_MAGIC_F64),
                          DET_ROUND_MAGIC_F64);
  double r = det_sub_f64(theta, det_mul_f64(jf, DET_TRIG_PIO2_1));  // exact
  r = det_sub_f64(r, det_mul_f64(jf, DET_TRIG_PIO2_2));
  r = det_sub_f64(r, det_mul_f64(jf, DET_TRIG_PIO2_3));
  double r2 = det_mul_f64(r, r);

  // sin r = r + r^3 * S(r^2), S = -1/3! + r^2/5! - ... + r^12/15!   (Horner, fma)
  double ps = -0x1.ae7f3e733b81fp-41;                   // -1/15!
  ps = det_fma_f64(ps, r2, 0x1.6124613a86d09p-33);      //  1/13!
  ps = det_fma_f64(ps, r2, -0x1.ae64567f544e4p-26);     // -1/11!
  ps = det_fma_f64(ps, r2, 0x1.71de3a556c734p-19);      //  1/9!
  ps = det_fma_f64(ps, r2, -0x1.a01a01a01a01ap-13);     // -1/7!
  ps = det_fma_f64(ps, r2, 0x1.1111111111111p-7);       //  1/5!
  ps = det_fma_f64(ps, r2, -0x1.5555555555555p-3);      // -1/3!
  double sin_r = det_fma_f64(det_mul_f64(r, r2), ps, r);

  // cos r = (1 - r^2/2) + r^4 * C(r^2), C = 1/4! - r^2/6! + ... + r^12/16!
  double pc = 0x1.ae7f3e733b81fp-45;                    //  1/16!
  pc = det_fma_f64(pc, r2, -0x1.93974a8c07c9dp-37);     // -1/14!
  pc = det_fma_f64(pc, r2, 0x1.1eed8eff8d898p-29);      //  1/12!
  pc = det_fma_f64(pc, r2, -0x1.27e4fb7789f5cp-22);     // -1/10!
  pc = det_fma_f64(pc, r2, 0x1.a01a01a01a01ap-16);      //  1/8!
  pc = det_fma_f64(pc, r2, -0x1.6c16c16c16c17p-10);     // -1/6!
  pc = det_fma_f64(pc, r2, 0x1.5555555555555p-5);       //  1/4!
  double cos_r = det_fma_f64(det_mul_f64(r2, r2), pc, det_sub_f64(1.0, det_mul_f64(0.5, r2)));

  // Quadrant j mod 4 (two's complement of the integer j): (sin, cos) rotated by j*pi/2.
  long long j = (long long)jf;
  double s, c;
  switch (j & 3) {
    case 0: s = sin_r; c = cos_r; break;
    case 1: s = cos_r; c = -sin_r; break;
    case 2: s = -sin_r; c = -cos_r; break;
    default: s = -cos_r; c = sin_r; break;
  }
  return {det_f64_to_f32(s), det_f64_to_f32(c)};
}

// The rope angle of position pos for an fp64 inverse frequency: fl64(pos * inv_freq). pos is
// exact in fp64 (pos < 2^53).
DET_HD double det_rope_angle_f64(long long pos, double inv_freq) {
  return det_mul_f64((double)pos, inv_freq);
}

// Rotate the pair (a, b) by the angle whose (sin, cos) is sc:
//   a' = fl(fl(a*c) - fl(b*s)),  b' = fl(fl(b*c) + fl(a*s)).
DET_HD void det_rope_rotate_f32(float* a, float* b, det_sincos_f32 sc) {
  float a0 = *a, b0 = *b;
  *a = det_sub_f32(det_mul_f32(a0, sc.c), det_mul_f32(b0, sc.s));
  *b = det_add_f32(det_mul_f32(b0, sc.c), det_mul_f32(a0, sc.s));
}
