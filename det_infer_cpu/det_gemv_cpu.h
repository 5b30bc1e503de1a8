// det_gemv_cpu.h: the CPU engine's GEMV, Y[b*ldy + r] = canonical dot(W[r, :], X[b*K .. +K)) for
// rows r0 <= r < r1 and inputs b < B (docs/SPEC.md §9). One entry point; the ISA-specific
// versions compute exactly det_gemv_rows_ref's bits (tests/test_engine_kernels.py) and are chosen
// at run time.
#pragma once

#include <stdint.h>

// The portable version: the literal loops of det_reduce.h, auto-vectorized where the compiler can.
void det_gemv_rows_ref(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy,
                       int64_t r0, int64_t r1);

#if defined(__x86_64__)
// AVX2 + FMA: row streaming (few inputs) or register tiles (many); requires K % 16 == 0.
void det_gemv_rows_avx2(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy,
                        int64_t r0, int64_t r1);
#endif

// True when this CPU has AVX2 + FMA and the reference is not forced.
bool det_cpu_has_avx2();

// Canonical dot of two fp32 vectors, same bits as det_dot_f32_ref (attention scores).
float det_dot_f32(const float* a, const float* b, int64_t K);
#if defined(__x86_64__)
float det_dot_f32_avx2(const float* a, const float* b, int64_t K);  // K % 8 == 0
#endif

// Picks the fastest version this CPU and K allow.
void det_gemv_rows(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy,
                   int64_t r0, int64_t r1);

// Which version det_gemv_rows uses for this K: "avx2" or "ref" (for tests and benchmarks), and a
// switch that forces the reference (DET_INFER_GEMV=ref in the environment does the same).
const char* det_gemv_impl_name(int64_t K);
void det_gemv_force_ref(int on);
