// det_math_cpu.h: the CPU executor's array entry points for the contract functions.
// Plain C++ (no torch): the torch binding and the native tests both call these. Every entry
// point pins the FP environment (det_fpenv.h) in each thread it runs on.
#pragma once

#include <stdint.h>

// y[i] = f(x[i]) for the det_unary_fn f (contract/det_unary.h). Returns 0, or -1 for an unknown fn.
int det_cpu_unary_f32(int fn, const float* x, float* y, int64_t n);

// s[i], c[i] = sin, cos of theta[i] (contract/det_trig.h).
void det_cpu_sincos_f64(const double* theta, float* s, float* c, int64_t n);

// y[r] = canonical dot(w[r, :], x) for r < rows; w is (rows, K) row-major, bf16 bits or fp32.
void det_cpu_gemv_bf16_ref(const uint16_t* w, const float* x, float* y, int64_t rows, int64_t K);
void det_cpu_gemv_f32_ref(const float* w, const float* x, float* y, int64_t rows, int64_t K);

// y[r] = canonical sum(x[r, :]) for r < rows; x is (rows, K) row-major fp32.
void det_cpu_sum_f32_ref(const float* x, float* y, int64_t rows, int64_t K);

// The contract argmax of v[0..n), n >= 1 (contract/det_argmax.h).
int64_t det_cpu_argmax_f32(const float* v, int64_t n);

// 1 when a guard-protected region sees IEEE defaults (a self-check for tests).
int det_cpu_fpenv_probe(void);
