// det_act_avx2.cpp: exp, silu and gelu-tanh with AVX2 + FMA: det_act_packs.h over 8-lane ymm
// primitives.
#include <immintrin.h>
#include <string.h>

#include "../../contract/det_act.h"
#include "../det_kernels_cpu.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))

namespace {

// Everything is inlined into the entry points: a pack passed to a call goes through memory.
#define DET_INL_LAMBDA __attribute__((always_inline)) DET_AVX2
#define DET_INL inline DET_INL_LAMBDA

constexpr int kLanes = 8;
typedef __m256 pvec;
typedef __m256i pivec;
DET_INL pvec p_add(pvec a, pvec b) { return _mm256_add_ps(a, b); }
DET_INL pvec p_sub(pvec a, pvec b) { return _mm256_sub_ps(a, b); }
DET_INL pvec p_mul(pvec a, pvec b) { return _mm256_mul_ps(a, b); }
DET_INL pvec p_div(pvec a, pvec b) { return _mm256_div_ps(a, b); }
DET_INL pvec p_fma(pvec a, pvec b, pvec c) { return _mm256_fmadd_ps(a, b, c); }
DET_INL pvec p_fms(pvec a, pvec b, pvec c) { return _mm256_fmsub_ps(a, b, c); }  // fma(a, b, -c)
DET_INL pvec p_min(pvec a, pvec b) { return _mm256_min_ps(a, b); }
DET_INL pvec p_max(pvec a, pvec b) { return _mm256_max_ps(a, b); }
DET_INL pvec p_and(pvec a, pvec b) { return _mm256_and_ps(a, b); }
DET_INL pvec p_andnot(pvec a, pvec b) { return _mm256_andnot_ps(a, b); }
DET_INL pvec p_or(pvec a, pvec b) { return _mm256_or_ps(a, b); }
DET_INL pvec p_xor(pvec a, pvec b) { return _mm256_xor_ps(a, b); }
DET_INL pvec p_lt(pvec a, pvec b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
DET_INL pvec p_gt(pvec a, pvec b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
DET_INL pvec p_eq(pvec a, pvec b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
DET_INL pvec p_ne(pvec a, pvec b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_OQ); }
DET_INL pvec p_isnan(pvec a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
DET_INL pvec p_blend(pvec f, pvec t, pvec mask) { return _mm256_blendv_ps(f, t, mask); }
DET_INL pivec p_iadd(pivec a, pivec b) { return _mm256_add_epi32(a, b); }
DET_INL pivec p_isub(pivec a, pivec b) { return _mm256_sub_epi32(a, b); }
DET_INL pivec p_iand(pivec a, pivec b) { return _mm256_and_si256(a, b); }
DET_INL pivec p_imax(pivec a, pivec b) { return _mm256_max_epi32(a, b); }
DET_INL pivec p_igt(pivec a, pivec b) { return _mm256_cmpgt_epi32(a, b); }
DET_INL pivec p_ieq(pivec a, pivec b) { return _mm256_cmpeq_epi32(a, b); }
DET_INL pivec p_iblend(pivec f, pivec t, pivec mask) { return _mm256_blendv_epi8(f, t, mask); }
DET_INL pivec p_shr23(pivec a) { return _mm256_srli_epi32(a, 23); }
DET_INL pivec p_cvtt(pvec a) { return _mm256_cvttps_epi32(a); }
DET_INL pivec p_bits(pvec a) { return _mm256_castps_si256(a); }
DET_INL pvec p_float(pivec a) { return _mm256_castsi256_ps(a); }
// 2^e for integer lanes e in [-126, 127] (built from bits, exact).
DET_INL pvec p_pow2(pivec e) {
  return p_float(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}
DET_INL pvec p_set(float a) { return _mm256_set1_ps(a); }
DET_INL pivec p_iset(int a) { return _mm256_set1_epi32(a); }
DET_INL bool p_all(pvec mask) { return _mm256_movemask_ps(mask) == 0xff; }
DET_INL pvec p_load(const float* p) { return _mm256_loadu_ps(p); }
DET_INL void p_store(float* p, pvec a) { _mm256_storeu_ps(p, a); }

#include "det_act_packs.h"

}  // namespace

DET_AVX2 void det_silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  act_mul<silu_pack>(gate, up, out, n);
}
DET_AVX2 void det_gelu_tanh_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  act_mul<gelu_tanh_pack>(gate, up, out, n);
}
DET_AVX2 void det_exp_sub_avx2(const float* s, float m, float* e, int64_t n) { exp_sub(s, set(m), e, n); }
