// det_math_cpu.cpp: OpenMP loops over the contract functions. Elementwise and per-row work only,
// so the thread count never changes a bit; each thread pins its own FP environment.
#include "det_math_cpu.h"

#include "../contract/det_argmax.h"
#include "../contract/det_reduce.h"
#include "../contract/det_trig.h"
#include "../contract/det_unary.h"
#include "det_parallel.h"

namespace {

DET_CPU_CLONES void unary_chunk(int fn, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = det_unary_apply_f32(fn, x[i]);
}

DET_CPU_CLONES void sincos_chunk(const double* theta, float* s, float* c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    det_sincos_f32 sc = det_sincos_f64(theta[i]);
    s[i] = sc.s;
    c[i] = sc.c;
  }
}

DET_CPU_CLONES void gemv_bf16_chunk(const uint16_t* w, const float* x, float* y, int64_t rows,
                                    int64_t K) {
  for (int64_t r = 0; r < rows; ++r) y[r] = det_dot_bf16_ref(w + r * K, x, K);
}

DET_CPU_CLONES void gemv_f32_chunk(const float* w, const float* x, float* y, int64_t rows,
                                   int64_t K) {
  for (int64_t r = 0; r < rows; ++r) y[r] = det_dot_f32_ref(w + r * K, x, K);
}

DET_CPU_CLONES void sum_chunk(const float* x, float* y, int64_t rows, int64_t K) {
  for (int64_t r = 0; r < rows; ++r) y[r] = det_sum_f32_ref(x + r * K, K);
}

}  // namespace

int det_cpu_unary_f32(int fn, const float* x, float* y, int64_t n) {
  if (fn < 0 || fn >= DET_UNARY_COUNT) return -1;
  det_parallel_chunks(n, [&](int64_t b, int64_t e) { unary_chunk(fn, x + b, y + b, e - b); });
  return 0;
}

void det_cpu_sincos_f64(const double* theta, float* s, float* c, int64_t n) {
  det_parallel_chunks(n, [&](int64_t b, int64_t e) { sincos_chunk(theta + b, s + b, c + b, e - b); });
}

void det_cpu_gemv_bf16_ref(const uint16_t* w, const float* x, float* y, int64_t rows, int64_t K) {
  det_parallel_chunks(rows, [&](int64_t b, int64_t e) { gemv_bf16_chunk(w + b * K, x, y + b, e - b, K); });
}

void det_cpu_gemv_f32_ref(const float* w, const float* x, float* y, int64_t rows, int64_t K) {
  det_parallel_chunks(rows, [&](int64_t b, int64_t e) { gemv_f32_chunk(w + b * K, x, y + b, e - b, K); });
}

void det_cpu_sum_f32_ref(const float* x, float* y, int64_t rows, int64_t K) {
  det_parallel_chunks(rows, [&](int64_t b, int64_t e) { sum_chunk(x + b * K, y + b, e - b, K); });
}

int64_t det_cpu_argmax_f32(const float* v, int64_t n) { return det_argmax_f32_ref(v, n); }

int det_cpu_fpenv_probe(void) {
  det_fpenv_guard env;
  return det_fpenv_is_ieee();
}
