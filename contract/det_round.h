// det_round.h: the rounding primitives of the det-infer arithmetic contract (docs/SPEC.md §2).
//
// Every floating-point operation of the contract is spelled through these functions, so that each
// rounding point is visible and no compiler can fuse, reorder or approximate it:
//   - on the GPU they are the explicit round-to-nearest intrinsics (__fadd_rn, __fmaf_rn, ...),
//     which ptxas never contracts whatever --fmad says;
//   - on the host they are plain IEEE operations, built with -ffp-contract=off and no fast-math
//     (guarded below), with the FP environment set by det_fpenv.h at every native entry point.
// Provides: DET_HD, det_{add,sub,mul,div,fma}_{f32,f64}, det_sqrt_f64, exact conversions and bit
// casts, det_ldexp_f32 (scaling by 2^k with at most one rounding), det_copysign_f32.
#pragma once

#include <float.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DET_HD __host__ __device__ __forceinline__
#define DET_UNROLL _Pragma("unroll")
#else
#define DET_HD inline
#define DET_UNROLL
#endif

#if !defined(__CUDA_ARCH__)
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "det-infer contract: never build with -ffast-math or -ffinite-math-only (docs/SPEC.md §2)"
#endif
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "det-infer contract: float expressions must evaluate in their own type (SSE2/NEON, not x87)"
#endif
#if defined(__clang__)
// clang honours this pragma; gcc does not, so every build also passes -ffp-contract=off.
#pragma clang fp contract(off)
#endif
#endif

// ---- fp32 -----------------------------------------------------------------------------------
DET_HD float det_add_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DET_HD float det_sub_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DET_HD float det_mul_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DET_HD float det_div_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// a*b + c with one rounding (software fmaf from libm where the ISA has no fma: still exact).
DET_HD float det_fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// ---- fp64 -----------------------------------------------------------------------------------
DET_HD double det_add_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DET_HD double det_sub_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
DET_HD double det_mul_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
DET_HD double det_div_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
DET_HD double det_fma_f64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
DET_HD double det_sqrt_f64(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

// ---- conversions and bits ----------------------------------------------------------------------
DET_HD float det_f64_to_f32(double a) {  // round to nearest even
#if defined(__CUDA_ARCH__)
  return __double2float_rn(a);
#else
  return (float)a;
#endif
}
DET_HD uint32_t det_f32_bits(float a) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(a);
#else
  uint32_t u;
  memcpy(&u, &a, sizeof u);
  return u;
#endif
}
DET_HD float det_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float a;
  memcpy(&a, &u, sizeof a);
  return a;
#endif
}
DET_HD bool det_isnan_f32(float a) { return (det_f32_bits(a) & 0x7fffffffu) > 0x7f800000u; }

// NaN sign and payload are not portable (x86 makes 0xffc00000, ARM 0x7fc00000, CUDA 0x7fffffff,
// and operand order picks which payload propagates), so they are not part of the contract: every
// contract function returns this one NaN, and digests hash every NaN as it (docs/SPEC.md §2.4).
#define DET_NAN_BITS_F32 0x7fc00000u
DET_HD float det_nan_f32() { return det_bits_f32(DET_NAN_BITS_F32); }
DET_HD float det_canonical_f32(float a) { return det_isnan_f32(a) ? det_nan_f32() : a; }
DET_HD float det_abs_f32(float a) { return det_bits_f32(det_f32_bits(a) & 0x7fffffffu); }
DET_HD float det_copysign_f32(float mag, float sgn) {
  return det_bits_f32((det_f32_bits(mag) & 0x7fffffffu) | (det_f32_bits(sgn) & 0x80000000u));
}
// 2^k as an fp32 value, exact, for k in [-126, 127] (a normal number built from its bits).
DET_HD float det_pow2_f32(int k) { return det_bits_f32((uint32_t)(k + 127) << 23); }

// y * 2^k for k in [-252, 254]. Two multiplications by normal powers of two: the first is exact
// whenever its result is normal, so a result in the normal range is exact and a subnormal result
// is rounded once (by the second multiplication).
DET_HD float det_ldexp_f32(float y, int k) {
  if (k > 127) return det_mul_f32(det_mul_f32(y, det_pow2_f32(127)), det_pow2_f32(k - 127));
  if (k < -126) return det_mul_f32(det_mul_f32(y, det_pow2_f32(k + 126)), det_pow2_f32(-126));
  return det_mul_f32(y, det_pow2_f32(k));
}
