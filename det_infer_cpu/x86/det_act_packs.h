// det_act_packs.h: exp, silu and gelu-tanh on packs of vectors, the same operations as
// contract/det_exp.h and contract/det_act.h lane by lane (tests/test_engine_kernels.py compares
// every bit with the scalar contract), written once over one vector's primitives. Branches of the
// scalar code become per-lane selects: both sides are computed and the lane takes the side its own
// condition picks, so no lane ever sees another lane's path.
//
// Every value is a pack of kPack independent vectors, and every operation is applied to the pack's
// vectors one after another. The double-float exp is one long chain of dependent operations (its
// latency, not the core's throughput, bounds one vector; the out-of-order window holds less than
// two vectors' worth), so interleaving independent vectors in program order is what keeps the pipes
// busy. Lanes never mix, so the packing changes no bit; a tail shorter than a pack is padded.
//
// Included inside a namespace by one file per ISA (det_act_avx2.cpp, det_act_avx512.cpp), after it
// defines DET_INL / DET_INL_LAMBDA (inlined, with its target), kLanes, the vector types pvec and
// pivec, and the primitives: p_add .. p_fma, p_fms (a * b - c, one rounding), p_min, p_max,
// bitwise p_and, p_andnot (~a & b), p_or, p_xor; comparisons p_lt, p_gt, p_eq, p_ne, p_isnan
// giving all-ones lanes; p_blend(if_false, if_true, mask); int32 p_iadd, p_isub, p_iand, p_imax,
// p_igt, p_ieq, p_iblend, p_shr23; p_cvtt (truncating conversion), p_bits / p_float (casts),
// p_pow2 (2^e from bits), p_set, p_iset, p_all (every lane of a mask set), p_load, p_store.
#pragma once

constexpr int kPack = 4;  // vectors per pack: 2.4x one 8-lane vector's rate on Zen 4 (2: 1.6x, 6: 2.5x)
constexpr int kPackLanes = kLanes * kPack;
struct vf {
  pvec v[kPack];
};
struct vi {
  pivec v[kPack];
};

// Lifts a one-vector operation `op` to packs: the result's vector j is op of the arguments' vectors j.
#define DET_PACK1(R, name, T, op) \
  DET_INL R name(T a) { R r; for (int j = 0; j < kPack; ++j) r.v[j] = op(a.v[j]); return r; }
#define DET_PACK2(R, name, T, U, op) \
  DET_INL R name(T a, U b) { R r; for (int j = 0; j < kPack; ++j) r.v[j] = op(a.v[j], b.v[j]); return r; }
#define DET_PACK3(R, name, T, U, W, op)                                               \
  DET_INL R name(T a, U b, W c) {                                                     \
    R r;                                                                              \
    for (int j = 0; j < kPack; ++j) r.v[j] = op(a.v[j], b.v[j], c.v[j]);              \
    return r;                                                                         \
  }

DET_PACK2(vf, add, vf, vf, p_add)
DET_PACK2(vf, sub, vf, vf, p_sub)
DET_PACK2(vf, mul, vf, vf, p_mul)
DET_PACK2(vf, div, vf, vf, p_div)
DET_PACK3(vf, fma, vf, vf, vf, p_fma)
DET_PACK3(vf, fms, vf, vf, vf, p_fms)
DET_PACK2(vf, min_, vf, vf, p_min)
DET_PACK2(vf, max_, vf, vf, p_max)
DET_PACK2(vf, and_, vf, vf, p_and)
DET_PACK2(vf, andnot, vf, vf, p_andnot)  // ~a & b
DET_PACK2(vf, or_, vf, vf, p_or)
DET_PACK2(vf, xor_, vf, vf, p_xor)
DET_PACK3(vf, sel_, vf, vf, vf, p_blend)  // (if_false, if_true, mask)
DET_PACK2(vf, lt, vf, vf, p_lt)
DET_PACK2(vf, gt, vf, vf, p_gt)
DET_PACK2(vf, eq, vf, vf, p_eq)
DET_PACK2(vf, ne, vf, vf, p_ne)
DET_PACK1(vf, isnan_, vf, p_isnan)
DET_PACK2(vi, iadd, vi, vi, p_iadd)
DET_PACK2(vi, isub, vi, vi, p_isub)
DET_PACK2(vi, iand, vi, vi, p_iand)
DET_PACK2(vi, imax, vi, vi, p_imax)
DET_PACK2(vi, igt, vi, vi, p_igt)
DET_PACK2(vi, ieq, vi, vi, p_ieq)
DET_PACK3(vi, isel_, vi, vi, vi, p_iblend)  // (if_false, if_true, mask)
DET_PACK1(vi, ishr23, vi, p_shr23)
DET_PACK1(vi, cvtt, vf, p_cvtt)
DET_PACK1(vi, bits_of, vf, p_bits)
DET_PACK1(vf, imask, vi, p_float)
DET_PACK1(vf, pow2, vi, p_pow2)

DET_INL vf set(float a) { vf r; for (auto& x : r.v) x = p_set(a); return r; }
DET_INL vi iset(int a) { vi r; for (auto& x : r.v) x = p_iset(a); return r; }
DET_INL vf zero() { return set(0.0f); }
DET_INL vf sel(vf mask, vf if_true, vf if_false) { return sel_(if_false, if_true, mask); }
DET_INL vi isel(vi mask, vi if_true, vi if_false) { return isel_(if_false, if_true, mask); }
DET_INL vf neg(vf a) { return xor_(a, set(-0.0f)); }
DET_INL vf abs_(vf a) { return andnot(set(-0.0f), a); }
DET_INL vf copysign_(vf mag, vf sgn) { return or_(abs_(mag), and_(set(-0.0f), sgn)); }
DET_INL bool all(vf mask) {
  bool r = true;
  for (const auto& x : mask.v) r = r && p_all(x);
  return r;
}

struct v2 {
  vf hi, lo;
};

// det_ldexp_f32, per lane: k > 127: (y*2^127)*2^(k-127); k < -126: (y*2^(k+126))*2^-126; else y*2^k
// (times 1.0, exact).
DET_INL vf ldexp_(vf y, vi k) {
  const vi big = igt(k, iset(127)), small = igt(iset(-126), k);
  vi e1 = isel(big, iset(127), k);
  e1 = isel(small, iadd(k, iset(126)), e1);
  vi e2 = isel(big, isub(k, iset(127)), iset(0));
  e2 = isel(small, iset(-126), e2);
  return mul(mul(y, pow2(e1)), pow2(e2));
}

DET_INL v2 two_sum(vf a, vf b) {
  vf s = add(a, b), bb = sub(s, a);
  return {s, add(sub(a, sub(s, bb)), sub(b, bb))};
}
DET_INL v2 fast_two_sum(vf a, vf b) {
  vf s = add(a, b);
  return {s, sub(b, sub(s, a))};
}
DET_INL v2 two_prod(vf a, vf b) {
  vf p = mul(a, b);
  return {p, fms(a, b, p)};  // fma(a, b, -p): one op fewer
}
DET_INL v2 x2_mul(v2 a, v2 b) {
  v2 p = two_prod(a.hi, b.hi);
  return fast_two_sum(p.hi, add(p.lo, fma(a.hi, b.lo, mul(a.lo, b.hi))));
}
DET_INL v2 x2_add_dominant(v2 a, v2 b) {
  v2 s = fast_two_sum(a.hi, b.hi);
  return fast_two_sum(s.hi, add(add(s.lo, a.lo), b.lo));
}
DET_INL v2 x2_div(v2 a, v2 b) {
  vf q = div(a.hi, b.hi);
  vf rem = fma(neg(q), b.hi, a.hi);
  rem = sub(add(rem, a.lo), mul(q, b.lo));
  return fast_two_sum(q, div(rem, b.hi));
}

// det_exp_reduce_f32x2 per lane: m (double-float) and k.
DET_INL v2 exp_reduce(v2 x, vi* k) {
  vf kf = sub(add(mul(x.hi, set(DET_EXP_LOG2E)), set(DET_ROUND_MAGIC_F32)), set(DET_ROUND_MAGIC_F32));
  vf a = sub(x.hi, mul(kf, set(DET_EXP_LN2_HI)));
  v2 r = two_sum(a, neg(mul(kf, set(DET_EXP_LN2_MID))));
  r.lo = add(sub(r.lo, mul(kf, set(DET_EXP_LN2_LO))), x.lo);
  r = fast_two_sum(r.hi, r.lo);
  vf q = set(0x1.ae6456p-26f);
  q = fma(q, r.hi, set(0x1.27e4fcp-22f));
  q = fma(q, r.hi, set(0x1.71de3ap-19f));
  q = fma(q, r.hi, set(0x1.a01a02p-16f));
  q = fma(q, r.hi, set(0x1.a01a02p-13f));
  q = fma(q, r.hi, set(0x1.6c16c2p-10f));
  const float c[6][2] = {{0x1.0p+0f, 0.0f}, {0x1.0p+0f, 0.0f}, {0x1.0p-1f, 0.0f},
                         {0x1.555556p-3f, -0x1.555556p-28f}, {0x1.555556p-5f, -0x1.555556p-30f},
                         {0x1.111112p-7f, -0x1.ddddep-32f}};
  v2 p = {q, zero()};
  for (int i = 5; i >= 0; --i) p = x2_add_dominant({set(c[i][0]), set(c[i][1])}, x2_mul(p, r));
  *k = cvtt(kf);
  return p;
}

// det_f32x2_ldexp_f32 per lane (both paths computed, then selected).
DET_INL vf x2_ldexp(v2 m, vi k) {
  const vi bits = bits_of(m.hi);
  const vi e = isub(iand(ishr23(bits), iset(0xff)), iset(127));
  const vi ek = iadd(e, k);
  const vf lo_pulls_down = and_(xor_(lt(m.lo, zero()), lt(m.hi, zero())), ne(m.lo, zero()));
  const vf is_pow2 = imask(ieq(iand(bits, iset(0x7fffff)), iset(0)));
  const vf at_edge = imask(ieq(ek, iset(-126)));
  const vf edge = and_(and_(at_edge, is_pow2), lo_pulls_down);
  const vf normal = or_(or_(imask(ieq(e, iset(-127))), imask(igt(ek, iset(-126)))), andnot(edge, at_edge));
  const vf r_normal = ldexp_(add(m.hi, m.lo), k);
  if (all(normal)) return r_normal;  // no lane takes the paths below
  // Subnormal path; its lanes are only kept where e + k is in [-151, -126].
  const vi kk = iadd(k, iset(149));
  const vf a = ldexp_(abs_(m.hi), imax(kk, iset(-252)));
  vf n = sub(add(a, set(0x1.0p+23f)), set(0x1.0p+23f));
  const vf d = sub(a, n);
  const vf tie = and_(eq(abs_(d), set(0.5f)), ne(m.lo, zero()));
  const vf up = xor_(gt(d, zero()), lo_pulls_down);  // (d > 0) != lo_pulls_down
  n = sel(and_(tie, up), add(n, add(d, d)), n);
  const vf r_sub = copysign_(mul(mul(n, set(0x1.0p-126f)), set(0x1.0p-23f)), m.hi);
  const vf tiny = imask(igt(iset(-151), ek));
  vf r = sel(normal, r_normal, r_sub);
  return sel(andnot(normal, tiny), copysign_(zero(), m.hi), r);
}

DET_INL vf exp_pack(vf x) {
  // Every lane in (-87, 88) (NaN fails both comparisons): the result is normal (e^-87 > 1.4 *
  // 2^-126) and k in [-126, 127], so det_f32x2_ldexp_f32 takes its first path and its scaling is
  // one exact multiply: the same bits as the general path below in about a third fewer operations.
  // Attention's exps (fl(s - max), never above 0) are mostly here.
  if (all(and_(gt(x, set(-87.0f)), lt(x, set(88.0f))))) {
    vi k;
    const v2 m = exp_reduce({x, zero()}, &k);
    return mul(add(m.hi, m.lo), pow2(k));
  }
  const vf xc = max_(min_(x, set(89.0f)), set(-104.0f));  // garbage-free lanes
  vi k;
  v2 m = exp_reduce({xc, zero()}, &k);
  vf r = x2_ldexp(m, k);
  r = sel(gt(x, set(89.0f)), set(__builtin_inff()), r);
  r = sel(lt(x, set(-104.0f)), zero(), r);
  return sel(isnan_(x), set(det_nan_f32()), r);
}

// det_mul_sigmoid_f32(x, z) per lane, for x, z not NaN (|z.hi| > 120, infinities included, take
// the two selects at the end; the clamp keeps their lanes' arithmetic finite).
DET_INL vf mul_sigmoid(vf x, v2 z) {
  const vf zc = max_(min_(z.hi, set(DET_SIGMOID_ZERO)), set(-DET_SIGMOID_ZERO));
  const vf negz = lt(zc, zero());
  vi k;
  v2 m = exp_reduce({sel(negz, zc, neg(zc)), sel(negz, z.lo, neg(z.lo))}, &k);  // -|z|
  v2 d = fast_two_sum(set(1.0f), ldexp_(m.hi, k));
  d = fast_two_sum(d.hi, add(d.lo, ldexp_(m.lo, k)));
  // The two sides divide different numerators by the same d: each lane picks its numerator
  // first, so one double-float division serves both (lane by lane the same operations).
  v2 n = two_prod(x, m.hi);
  n = fast_two_sum(n.hi, fma(x, m.lo, n.lo));
  const v2 q = x2_div({sel(negz, n.hi, x), sel(negz, n.lo, zero())}, d);
  const vf r_pos = copysign_(add(q.hi, q.lo), x);
  const vf r_neg = copysign_(x2_ldexp(q, k), x);
  vf r = sel(negz, r_neg, r_pos);
  r = sel(gt(z.hi, set(DET_SIGMOID_ZERO)), x, r);
  return sel(lt(z.hi, set(-DET_SIGMOID_ZERO)), copysign_(zero(), x), r);
}

DET_INL vf silu_pack(vf x) {
  const vf nan = isnan_(x);
  const vf xs = sel(nan, zero(), x);
  return sel(nan, set(det_nan_f32()), mul_sigmoid(xs, {xs, zero()}));
}

// det_gelu_tanh_f32 per lane: z = 2C * (x + A * x^3) in double-float, then x * sigmoid(z). Lanes
// with |x| > 12 or NaN take their select at the end, computing on 0 meanwhile.
DET_INL vf gelu_tanh_pack(vf x) {
  const vf nan = isnan_(x), big = gt(abs_(x), set(DET_GELU_BIG));
  const vf xs = sel(or_(nan, big), zero(), x);
  const v2 x3 = x2_mul(two_prod(xs, xs), {xs, zero()});
  const v2 t = x2_mul({set(DET_GELU_A_HI), set(DET_GELU_A_LO)}, x3);
  v2 u = two_sum(xs, t.hi);
  u = fast_two_sum(u.hi, add(u.lo, t.lo));
  vf r = mul_sigmoid(xs, x2_mul({set(DET_GELU_2C_HI), set(DET_GELU_2C_LO)}, u));
  r = sel(big, sel(gt(x, zero()), x, copysign_(zero(), x)), r);
  return sel(nan, set(det_nan_f32()), r);
}

DET_INL vf load(const float* p) { vf r; for (int j = 0; j < kPack; ++j) r.v[j] = p_load(p + kLanes * j); return r; }
DET_INL void store(float* p, vf a) { for (int j = 0; j < kPack; ++j) p_store(p + kLanes * j, a.v[j]); }

// Runs op(a, b, out) on whole packs of n elements, the last part pack through a zero-padded copy
// (lanes never mix, so padding changes no bit). b may be null.
template <typename Op>
DET_INL void over_packs(int64_t n, const float* a, const float* b, float* out, Op op) {
  int64_t i = 0;
  for (; i + kPackLanes <= n; i += kPackLanes) op(a + i, b ? b + i : nullptr, out + i);
  if (i == n) return;
  float ta[kPackLanes] = {}, tb[kPackLanes] = {}, to[kPackLanes];
  memcpy(ta, a + i, (n - i) * sizeof(float));
  if (b) memcpy(tb, b + i, (n - i) * sizeof(float));
  op(ta, b ? tb : nullptr, to);
  memcpy(out + i, to, (n - i) * sizeof(float));
}

// out = fl(act(gate) * up), act one of the packs above.
template <vf (*act)(vf)>
DET_INL void act_mul(const float* gate, const float* up, float* out, int64_t n) {
  over_packs(n, gate, up, out, [](const float* g, const float* u, float* o) DET_INL_LAMBDA {
    store(o, mul(act(load(g)), load(u)));
  });
}

// e = exp(fl(s - m)), m given for each lane of a pack's vectors (one value, or one per lane).
DET_INL void exp_sub(const float* s, vf mv, float* e, int64_t n) {
  over_packs(n, s, nullptr, e, [&](const float* x, const float*, float* o) DET_INL_LAMBDA {
    store(o, exp_pack(sub(load(x), mv)));
  });
}

