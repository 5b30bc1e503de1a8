// det_act_avx512.cpp: exp, silu and gelu-tanh with AVX-512 (F, DQ): det_act_packs.h over 16-lane
// zmm primitives. Comparisons give all-ones lanes (vpmovm2d) and selects read them back as masks, so
// the packs' code is the AVX2 version's, operation for operation.
#include <immintrin.h>
#include <string.h>

#include "../../contract/det_act.h"
#include "../det_kernels_cpu.h"

#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512dq")))

namespace {

// Everything is inlined into the entry points: a pack passed to a call goes through memory.
#define DET_INL_LAMBDA __attribute__((always_inline)) DET_AVX512
#define DET_INL inline DET_INL_LAMBDA

constexpr int kLanes = 16;
// A comparison's mask as a vector of all-ones (true) and zero lanes.
DET_INL __m512 mask_lanes(__mmask16 m) { return _mm512_castsi512_ps(_mm512_movm_epi32(m)); }
typedef __m512 pvec;
typedef __m512i pivec;
DET_INL pvec p_add(pvec a, pvec b) { return _mm512_add_ps(a, b); }
DET_INL pvec p_sub(pvec a, pvec b) { return _mm512_sub_ps(a, b); }
DET_INL pvec p_mul(pvec a, pvec b) { return _mm512_mul_ps(a, b); }
DET_INL pvec p_div(pvec a, pvec b) { return _mm512_div_ps(a, b); }
DET_INL pvec p_fma(pvec a, pvec b, pvec c) { return _mm512_fmadd_ps(a, b, c); }
DET_INL pvec p_fms(pvec a, pvec b, pvec c) { return _mm512_fmsub_ps(a, b, c); }  // fma(a, b, -c)
DET_INL pvec p_min(pvec a, pvec b) { return _mm512_min_ps(a, b); }
DET_INL pvec p_max(pvec a, pvec b) { return _mm512_max_ps(a, b); }
DET_INL pvec p_and(pvec a, pvec b) { return _mm512_and_ps(a, b); }
DET_INL pvec p_andnot(pvec a, pvec b) { return _mm512_andnot_ps(a, b); }
DET_INL pvec p_or(pvec a, pvec b) { return _mm512_or_ps(a, b); }
DET_INL pvec p_xor(pvec a, pvec b) { return _mm512_xor_ps(a, b); }
DET_INL pvec p_lt(pvec a, pvec b) { return mask_lanes(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)); }
DET_INL pvec p_gt(pvec a, pvec b) { return mask_lanes(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)); }
DET_INL pvec p_eq(pvec a, pvec b) { return mask_lanes(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)); }
DET_INL pvec p_ne(pvec a, pvec b) { return mask_lanes(_mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ)); }
DET_INL pvec p_isnan(pvec a) { return mask_lanes(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)); }
DET_INL pvec p_blend(pvec f, pvec t, pvec mask) {
  return _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(mask)), f, t);
}
DET_INL pivec p_iadd(pivec a, pivec b) { return _mm512_add_epi32(a, b); }
DET_INL pivec p_isub(pivec a, pivec b) { return _mm512_sub_epi32(a, b); }
DET_INL pivec p_iand(pivec a, pivec b) { return _mm512_and_si512(a, b); }
DET_INL pivec p_imax(pivec a, pivec b) { return _mm512_max_epi32(a, b); }
DET_INL pivec p_igt(pivec a, pivec b) { return _mm512_movm_epi32(_mm512_cmpgt_epi32_mask(a, b)); }
DET_INL pivec p_ieq(pivec a, pivec b) { return _mm512_movm_epi32(_mm512_cmpeq_epi32_mask(a, b)); }
DET_INL pivec p_iblend(pivec f, pivec t, pivec mask) {
  return _mm512_mask_blend_epi32(_mm512_movepi32_mask(mask), f, t);
}
DET_INL pivec p_shr23(pivec a) { return _mm512_srli_epi32(a, 23); }
DET_INL pivec p_cvtt(pvec a) { return _mm512_cvttps_epi32(a); }
DET_INL pivec p_bits(pvec a) { return _mm512_castps_si512(a); }
DET_INL pvec p_float(pivec a) { return _mm512_castsi512_ps(a); }
// 2^e for integer lanes e in [-126, 127] (built from bits, exact).
DET_INL pvec p_pow2(pivec e) {
  return p_float(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
}
DET_INL pvec p_set(float a) { return _mm512_set1_ps(a); }
DET_INL pivec p_iset(int a) { return _mm512_set1_epi32(a); }
DET_INL bool p_all(pvec mask) { return _mm512_movepi32_mask(_mm512_castps_si512(mask)) == 0xffff; }
DET_INL pvec p_load(const float* p) { return _mm512_loadu_ps(p); }
DET_INL void p_store(float* p, pvec a) { _mm512_storeu_ps(p, a); }

#include "det_act_packs.h"

}  // namespace

DET_AVX512 void det_silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  act_mul<silu_pack>(gate, up, out, n);
}
DET_AVX512 void det_gelu_tanh_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  act_mul<gelu_tanh_pack>(gate, up, out, n);
}
DET_AVX512 void det_exp_sub_avx512(const float* s, float m, float* e, int64_t n) { exp_sub(s, set(m), e, n); }
// e[16i + t] = exp(fl(s[16i + t] - m[t])) for n % 16 == 0: one m per lane (x86/det_attn_lanes_avx512.cpp
// holds a query per lane).
DET_AVX512 void det_exp_sub_lanes_avx512(const float* s, const float* m, float* e, int64_t n) {
  vf mv;
  for (int j = 0; j < kPack; ++j) mv.v[j] = p_load(m);
  exp_sub(s, mv, e, n);
}
