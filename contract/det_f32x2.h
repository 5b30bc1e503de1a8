// det_f32x2.h: double-float arithmetic, an unevaluated sum hi + lo of two fp32 values
// (docs/SPEC.md §3). About 44 significant bits on the full-rate fp32 fma units; used by exp and
// tanh. Each function lists its operations in order; all are built from det_round.h only.
#pragma once

#include "det_round.h"

struct det_f32x2 {
  float hi, lo;  // value = hi + lo, |lo| <= ulp(hi)/2 after a normalizing step
};

// Knuth's two-sum: s + e == a + b exactly (6 operations, no precondition).
DET_HD det_f32x2 det_two_sum_f32(float a, float b) {
  float s = det_add_f32(a, b);
  float bb = det_sub_f32(s, a);
  float e = det_add_f32(det_sub_f32(a, det_sub_f32(s, bb)), det_sub_f32(b, bb));
  return {s, e};
}

// Dekker's fast two-sum: s + e == a + b exactly, provided |a| >= |b| or a == 0.
DET_HD det_f32x2 det_fast_two_sum_f32(float a, float b) {
  float s = det_add_f32(a, b);
  float e = det_sub_f32(b, det_sub_f32(s, a));
  return {s, e};
}

// Exact product on fma: p + e == a * b (barring underflow of e).
DET_HD det_f32x2 det_two_prod_f32(float a, float b) {
  float p = det_mul_f32(a, b);
  float e = det_fma_f32(a, b, -p);
  return {p, e};
}

// (a.hi + a.lo) * (b.hi + b.lo): exact hi product, cross terms a.hi*b.lo (fma) + a.lo*b.hi, renormalized.
DET_HD det_f32x2 det_f32x2_mul(det_f32x2 a, det_f32x2 b) {
  det_f32x2 p = det_two_prod_f32(a.hi, b.hi);
  float cross = det_fma_f32(a.hi, b.lo, det_mul_f32(a.lo, b.hi));
  return det_fast_two_sum_f32(p.hi, det_add_f32(p.lo, cross));
}

// a + b where |a.hi| >= |b.hi| (the Horner step c_i + p*r, whose coefficient dominates).
DET_HD det_f32x2 det_f32x2_add_dominant(det_f32x2 a, det_f32x2 b) {
  det_f32x2 s = det_fast_two_sum_f32(a.hi, b.hi);
  float lo = det_add_f32(det_add_f32(s.lo, a.lo), b.lo);
  return det_fast_two_sum_f32(s.hi, lo);
}

// a / b: quotient of the heads, then the exact remainder (fma) corrected by the tails.
DET_HD det_f32x2 det_f32x2_div(det_f32x2 a, det_f32x2 b) {
  float q = det_div_f32(a.hi, b.hi);
  float rem = det_fma_f32(-q, b.hi, a.hi);                 // a.hi - q*b.hi, exact
  rem = det_sub_f32(det_add_f32(rem, a.lo), det_mul_f32(q, b.lo));
  return det_fast_two_sum_f32(q, det_div_f32(rem, b.hi));
}
