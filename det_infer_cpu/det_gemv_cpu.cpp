// det_gemv_cpu.cpp: the reference GEMV and the run-time choice between it and the ISA versions.
#include "det_gemv_cpu.h"

#include "../contract/det_act.h"
#include "det_act_cpu.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "../contract/det_reduce.h"
#include "det_parallel.h"

namespace {
constexpr int64_t kBatchLanes = 4;  // inputs sharing one converted weight row (scheduling only)
int g_force_ref = -1;               // -1: read DET_INFER_GEMV once

bool force_ref() {
  if (g_force_ref < 0) {
    const char* e = getenv("DET_INFER_GEMV");
    g_force_ref = (e && strcmp(e, "ref") == 0) ? 1 : 0;
  }
  return g_force_ref == 1;
}

bool use_avx2(int64_t K) { return det_cpu_has_avx2() && K % 16 == 0; }
}  // namespace

bool det_cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !force_ref();
#else
  return false;
#endif
}

DET_CPU_CLONES void det_gemv_rows_ref(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y,
                                      int64_t ldy, int64_t r0, int64_t r1) {
  float wf[DET_REDUCE_LANES];
  float acc[kBatchLanes][DET_REDUCE_LANES];
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* w = W + r * K;
    for (int64_t b0 = 0; b0 < B; b0 += kBatchLanes) {
      int64_t nb = std::min(kBatchLanes, B - b0);
      for (int64_t bb = 0; bb < nb; ++bb)
        for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[bb][j] = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_LANES) {
        int64_t n = std::min<int64_t>(DET_REDUCE_LANES, K - k0);
        for (int64_t j = 0; j < n; ++j) wf[j] = det_bf16_to_f32(w[k0 + j]);
        for (int64_t bb = 0; bb < nb; ++bb) {
          const float* x = X + (b0 + bb) * K + k0;
          float* a = acc[bb];
          for (int64_t j = 0; j < n; ++j) a[j] = det_fma_f32(wf[j], x[j], a[j]);
        }
      }
      for (int64_t bb = 0; bb < nb; ++bb) Y[(b0 + bb) * ldy + r] = det_reduce_tree256_f32(acc[bb]);
    }
  }
}

void det_gemv_rows(const uint16_t* W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy,
                   int64_t r0, int64_t r1) {
#if defined(__x86_64__)
  if (use_avx2(K)) return det_gemv_rows_avx2(W, K, X, B, Y, ldy, r0, r1);
#endif
  det_gemv_rows_ref(W, K, X, B, Y, ldy, r0, r1);
}

float det_dot_f32(const float* a, const float* b, int64_t K) {
#if defined(__x86_64__)
  if (det_cpu_has_avx2() && K % 8 == 0) return det_dot_f32_avx2(a, b, K);
#endif
  return det_dot_f32_ref(a, b, K);
}

const char* det_gemv_impl_name(int64_t K) { return use_avx2(K) ? "avx2" : "ref"; }

void det_gemv_force_ref(int on) { g_force_ref = on ? 1 : 0; }

// ---- elementwise steps (det_act_cpu.h) ------------------------------------------------------------
namespace {
DET_CPU_CLONES void silu_mul_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = det_mul_f32(det_silu_f32(gate[i]), up[i]);
}
DET_CPU_CLONES void exp_sub_ref(const float* s, float m, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = det_exp_f32(det_sub_f32(s[i], m));
}
}  // namespace

void det_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#if defined(__x86_64__)
  if (det_cpu_has_avx2()) return det_silu_mul_avx2(gate, up, out, n);
#endif
  silu_mul_ref(gate, up, out, n);
}

void det_exp_sub(const float* s, float m, float* e, int64_t n) {
#if defined(__x86_64__)
  if (det_cpu_has_avx2()) return det_exp_sub_avx2(s, m, e, n);
#endif
  exp_sub_ref(s, m, e, n);
}
