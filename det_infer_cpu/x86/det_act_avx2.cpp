// det_act_avx2.cpp: exp and silu eight lanes at a time, same operations as contract/det_exp.h and
// contract/det_act.h lane by lane (tests/test_engine_kernels.py compares every bit with the scalar
// contract). Branches of the scalar code become per-lane selects: both sides are computed and the
// lane takes the side its own condition picks, so no lane ever sees another lane's path. Tails go
// through the scalar contract functions.
#include <immintrin.h>

#include "../../contract/det_act.h"
#include "../det_kernels_cpu.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))

namespace {

struct v2 {
  __m256 hi, lo;
};

DET_AVX2 inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
DET_AVX2 inline __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
DET_AVX2 inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
DET_AVX2 inline __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
DET_AVX2 inline __m256 set(float a) { return _mm256_set1_ps(a); }
DET_AVX2 inline __m256 neg(__m256 a) { return _mm256_xor_ps(a, set(-0.0f)); }
DET_AVX2 inline __m256 abs_(__m256 a) { return _mm256_andnot_ps(set(-0.0f), a); }
DET_AVX2 inline __m256 sel(__m256 mask, __m256 if_true, __m256 if_false) {
  return _mm256_blendv_ps(if_false, if_true, mask);
}
DET_AVX2 inline __m256 copysign_(__m256 mag, __m256 sgn) {
  return _mm256_or_ps(abs_(mag), _mm256_and_ps(set(-0.0f), sgn));
}
DET_AVX2 inline __m256 lt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
DET_AVX2 inline __m256 gt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
DET_AVX2 inline __m256 isnan_(__m256 a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }

// 2^e for integer lanes e in [-126, 127] (built from bits, exact).
DET_AVX2 inline __m256 pow2(__m256i e) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}
DET_AVX2 inline __m256i iset(int a) { return _mm256_set1_epi32(a); }
DET_AVX2 inline __m256 imask(__m256i m) { return _mm256_castsi256_ps(m); }

// det_ldexp_f32, per lane: k > 127: (y*2^127)*2^(k-127); k < -126: (y*2^(k+126))*2^-126; else y*2^k
// (times 1.0, exact).
DET_AVX2 inline __m256 ldexp_(__m256 y, __m256i k) {
  const __m256i big = _mm256_cmpgt_epi32(k, iset(127)), small = _mm256_cmpgt_epi32(iset(-126), k);
  __m256i e1 = _mm256_blendv_epi8(k, iset(127), big);
  e1 = _mm256_blendv_epi8(e1, _mm256_add_epi32(k, iset(126)), small);
  __m256i e2 = _mm256_blendv_epi8(iset(0), _mm256_sub_epi32(k, iset(127)), big);
  e2 = _mm256_blendv_epi8(e2, iset(-126), small);
  return mul(mul(y, pow2(e1)), pow2(e2));
}

DET_AVX2 inline v2 two_sum(__m256 a, __m256 b) {
  __m256 s = add(a, b), bb = sub(s, a);
  return {s, add(sub(a, sub(s, bb)), sub(b, bb))};
}
DET_AVX2 inline v2 fast_two_sum(__m256 a, __m256 b) {
  __m256 s = add(a, b);
  return {s, sub(b, sub(s, a))};
}
DET_AVX2 inline v2 two_prod(__m256 a, __m256 b) {
  __m256 p = mul(a, b);
  return {p, fma(a, b, neg(p))};
}
DET_AVX2 inline v2 x2_mul(v2 a, v2 b) {
  v2 p = two_prod(a.hi, b.hi);
  return fast_two_sum(p.hi, add(p.lo, fma(a.hi, b.lo, mul(a.lo, b.hi))));
}
DET_AVX2 inline v2 x2_add_dominant(v2 a, v2 b) {
  v2 s = fast_two_sum(a.hi, b.hi);
  return fast_two_sum(s.hi, add(add(s.lo, a.lo), b.lo));
}
DET_AVX2 inline v2 x2_div(v2 a, v2 b) {
  __m256 q = _mm256_div_ps(a.hi, b.hi);
  __m256 rem = fma(neg(q), b.hi, a.hi);
  rem = sub(add(rem, a.lo), mul(q, b.lo));
  return fast_two_sum(q, _mm256_div_ps(rem, b.hi));
}

// det_exp_reduce_f32x2 per lane: m (double-float) and k.
DET_AVX2 inline v2 exp_reduce(v2 x, __m256i* k) {
  __m256 kf = sub(add(mul(x.hi, set(DET_EXP_LOG2E)), set(DET_ROUND_MAGIC_F32)), set(DET_ROUND_MAGIC_F32));
  __m256 a = sub(x.hi, mul(kf, set(DET_EXP_LN2_HI)));
  v2 r = two_sum(a, neg(mul(kf, set(DET_EXP_LN2_MID))));
  r.lo = add(sub(r.lo, mul(kf, set(DET_EXP_LN2_LO))), x.lo);
  r = fast_two_sum(r.hi, r.lo);
  __m256 q = set(0x1.ae6456p-26f);
  q = fma(q, r.hi, set(0x1.27e4fcp-22f));
  q = fma(q, r.hi, set(0x1.71de3ap-19f));
  q = fma(q, r.hi, set(0x1.a01a02p-16f));
  q = fma(q, r.hi, set(0x1.a01a02p-13f));
  q = fma(q, r.hi, set(0x1.6c16c2p-10f));
  const float c[6][2] = {{0x1.0p+0f, 0.0f}, {0x1.0p+0f, 0.0f}, {0x1.0p-1f, 0.0f},
                         {0x1.555556p-3f, -0x1.555556p-28f}, {0x1.555556p-5f, -0x1.555556p-30f},
                         {0x1.111112p-7f, -0x1.ddddep-32f}};
  v2 p = {q, _mm256_setzero_ps()};
  for (int i = 5; i >= 0; --i) p = x2_add_dominant({set(c[i][0]), set(c[i][1])}, x2_mul(p, r));
  *k = _mm256_cvttps_epi32(kf);
  return p;
}

// det_f32x2_ldexp_f32 per lane (both paths computed, then selected).
DET_AVX2 inline __m256 x2_ldexp(v2 m, __m256i k) {
  const __m256i bits = _mm256_castps_si256(m.hi);
  const __m256i e = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23), iset(0xff)), iset(127));
  const __m256i ek = _mm256_add_epi32(e, k);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 lo_pulls_down = _mm256_and_ps(_mm256_xor_ps(lt(m.lo, zero), lt(m.hi, zero)),
                                             _mm256_cmp_ps(m.lo, zero, _CMP_NEQ_OQ));
  const __m256 is_pow2 = imask(_mm256_cmpeq_epi32(_mm256_and_si256(bits, iset(0x7fffff)), iset(0)));
  const __m256 at_edge = imask(_mm256_cmpeq_epi32(ek, iset(-126)));
  const __m256 edge = _mm256_and_ps(_mm256_and_ps(at_edge, is_pow2), lo_pulls_down);
  const __m256 normal = _mm256_or_ps(
      _mm256_or_ps(imask(_mm256_cmpeq_epi32(e, iset(-127))), imask(_mm256_cmpgt_epi32(ek, iset(-126)))),
      _mm256_andnot_ps(edge, at_edge));
  const __m256 r_normal = ldexp_(add(m.hi, m.lo), k);
  if (_mm256_movemask_ps(normal) == 0xff) return r_normal;  // no lane takes the paths below
  // Subnormal path; its lanes are only kept where e + k is in [-151, -126].
  const __m256i kk = _mm256_add_epi32(k, iset(149));
  const __m256 a = ldexp_(abs_(m.hi), _mm256_max_epi32(kk, iset(-252)));
  __m256 n = sub(add(a, set(0x1.0p+23f)), set(0x1.0p+23f));
  const __m256 d = sub(a, n);
  const __m256 tie = _mm256_and_ps(_mm256_cmp_ps(abs_(d), set(0.5f), _CMP_EQ_OQ),
                                   _mm256_cmp_ps(m.lo, zero, _CMP_NEQ_OQ));
  const __m256 up = _mm256_xor_ps(gt(d, zero), lo_pulls_down);  // (d > 0) != lo_pulls_down
  n = sel(_mm256_and_ps(tie, up), add(n, add(d, d)), n);
  const __m256 r_sub = copysign_(mul(mul(n, set(0x1.0p-126f)), set(0x1.0p-23f)), m.hi);
  const __m256 tiny = imask(_mm256_cmpgt_epi32(iset(-151), ek));
  __m256 r = sel(normal, r_normal, r_sub);
  return sel(_mm256_andnot_ps(normal, tiny), copysign_(zero, m.hi), r);
}

DET_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, set(89.0f)), set(-104.0f));  // garbage-free lanes
  __m256i k;
  v2 m = exp_reduce({xc, _mm256_setzero_ps()}, &k);
  __m256 r = x2_ldexp(m, k);
  r = sel(gt(x, set(89.0f)), set(__builtin_inff()), r);
  r = sel(lt(x, set(-104.0f)), _mm256_setzero_ps(), r);
  return sel(isnan_(x), set(det_nan_f32()), r);
}

// det_mul_sigmoid_f32(x, (z, 0)) per lane, for finite x, z.
DET_AVX2 inline __m256 mul_sigmoid8(__m256 x, __m256 z) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 zc = _mm256_max_ps(_mm256_min_ps(z, set(DET_SIGMOID_ZERO)), set(-DET_SIGMOID_ZERO));
  const __m256 negz = lt(zc, zero);
  const __m256 w = sel(negz, zc, neg(zc));
  __m256i k;
  v2 m = exp_reduce({w, zero}, &k);
  v2 d = fast_two_sum(set(1.0f), ldexp_(m.hi, k));
  d = fast_two_sum(d.hi, add(d.lo, ldexp_(m.lo, k)));
  // The two sides divide different numerators by the same d: each lane picks its numerator
  // first, so one double-float division serves both (lane by lane the same operations).
  v2 n = two_prod(x, m.hi);
  n = fast_two_sum(n.hi, fma(x, m.lo, n.lo));
  const v2 q = x2_div({sel(negz, n.hi, x), sel(negz, n.lo, zero)}, d);
  const __m256 r_pos = copysign_(add(q.hi, q.lo), x);
  const __m256 r_neg = copysign_(x2_ldexp(q, k), x);
  __m256 r = sel(negz, r_neg, r_pos);
  r = sel(gt(z, set(DET_SIGMOID_ZERO)), x, r);
  return sel(lt(z, set(-DET_SIGMOID_ZERO)), copysign_(zero, x), r);
}

DET_AVX2 inline __m256 silu8(__m256 x) {
  const __m256 nan = isnan_(x);
  const __m256 xs = sel(nan, _mm256_setzero_ps(), x);
  return sel(nan, set(det_nan_f32()), mul_sigmoid8(xs, xs));
}

}  // namespace

DET_AVX2 void det_silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, mul(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  for (; i < n; ++i) out[i] = det_mul_f32(det_silu_f32(gate[i]), up[i]);
}

DET_AVX2 void det_exp_sub_avx2(const float* s, float m, float* e, int64_t n) {
  int64_t i = 0;
  const __m256 mv = set(m);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, exp8(sub(_mm256_loadu_ps(s + i), mv)));
  for (; i < n; ++i) e[i] = det_exp_f32(det_sub_f32(s[i], m));
}
