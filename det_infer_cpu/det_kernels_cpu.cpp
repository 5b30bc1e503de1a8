// det_kernels_cpu.cpp: the reference versions of the engine's kernels (the contract's literal
// loops) and the run-time choice between them and the ISA versions in x86/.
#include "det_kernels_cpu.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../contract/det_act.h"
#include "../contract/det_reduce.h"
#include "det_lane_blocks.h"
#include "det_parallel.h"

namespace {

constexpr int64_t kBatchLanes = 4;  // inputs sharing one converted weight row (scheduling only)
std::atomic<int> g_isa_cap{-1};     // highest level allowed; -1: read DET_INFER_GEMV once

int hardware_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int isa = !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? DET_ISA_REF
                         : __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                                 __builtin_cpu_supports("avx512dq") ? DET_ISA_AVX512
                                                                                                   : DET_ISA_AVX2;
  return isa;
#else
  return DET_ISA_REF;
#endif
}

// The one choice of GEMV version: AVX-512 serves one input (det_gemv_b1_avx512.cpp) and any more
// (det_gemv_tile_avx512.cpp), AVX2 both where AVX-512 is missing or capped; nf4 rows are decoded
// by det_nf4_decode_row, which reads the level itself.
int gemv_isa(const det_matrix& W, int64_t K, int64_t B) {
  const bool fits = K % 16 == 0 && (W.bf16 || W.block_shift >= 4);
  const int isa = det_cpu_isa();
  if (!fits || isa < DET_ISA_AVX2) return DET_ISA_REF;
  return isa >= DET_ISA_AVX512 ? DET_ISA_AVX512 : DET_ISA_AVX2;
}

DET_CPU_CLONES void act_mul_ref(int act, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = det_mul_f32(det_act_f32(act, gate[i]), up[i]);
}

DET_CPU_CLONES void exp_sub_ref(const float* s, float m, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = det_exp_f32(det_sub_f32(s[i], m));
}

// Each full block of 256 terms is copied transposed (step i of accumulator l to t[i][l]), so the
// 32 accumulators then advance side by side in vectors, each in its own order; the last short block
// goes term by term as the reference does. About 4x faster than the literal loop on Zen 5 (AVX2).
DET_CPU_CLONES float sum_blocks(const float* a, int64_t K) {
  float acc[DET_REDUCE_LANES];
  float t[DET_REDUCE_RUN][DET_REDUCE_LANES];
  for (int l = 0; l < DET_REDUCE_LANES; ++l) acc[l] = 0.0f;
  int64_t k0 = 0;
  for (; k0 + DET_REDUCE_BLOCK <= K; k0 += DET_REDUCE_BLOCK) {
    for (int l = 0; l < DET_REDUCE_LANES; ++l)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) t[i][l] = a[det_reduce_term(k0, l, i)];
    for (int i = 0; i < DET_REDUCE_RUN; ++i)
      for (int l = 0; l < DET_REDUCE_LANES; ++l) acc[l] = det_add_f32(acc[l], t[i][l]);
  }
  for (int l = 0; l < DET_REDUCE_LANES; ++l)
    for (int i = 0; i < DET_REDUCE_RUN; ++i)
      if (det_reduce_term(k0, l, i) < K) acc[l] = det_add_f32(acc[l], a[det_reduce_term(k0, l, i)]);
  return det_reduce_tree_f32(acc);
}

DET_CPU_CLONES void attn_scores_ref(const float* q, const float* k, int64_t stride, int64_t D, int64_t n,
                                    float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = det_mul_f32(det_dot_f32_ref(q, k + i * stride, D), scale);
}

}  // namespace

int det_cpu_isa() {
  int cap = g_isa_cap.load(std::memory_order_relaxed);
  if (cap < 0) {
    const char* e = getenv("DET_INFER_GEMV");
    cap = !e ? DET_ISA_AVX512 : strcmp(e, "ref") == 0 ? DET_ISA_REF : strcmp(e, "avx2") == 0 ? DET_ISA_AVX2
                                                                                              : DET_ISA_AVX512;
    g_isa_cap.store(cap, std::memory_order_relaxed);
  }
  return std::min(hardware_isa(), cap);
}

void det_set_isa_cap(int level) { g_isa_cap.store(level, std::memory_order_relaxed); }

// The literal loops of docs/SPEC.md §9; each converted weight block serves kBatchLanes inputs.
DET_CPU_CLONES void det_gemv_rows_ref(const det_matrix& W, int64_t K, const float* X, int64_t B, float* Y,
                                      int64_t ldy, int64_t r0, int64_t r1) {
  float wf[DET_REDUCE_BLOCK];
  float acc[kBatchLanes][DET_REDUCE_LANES];
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b0 = 0; b0 < B; b0 += kBatchLanes) {
      int64_t nb = std::min(kBatchLanes, B - b0);
      for (int64_t bb = 0; bb < nb; ++bb)
        for (int j = 0; j < DET_REDUCE_LANES; ++j) acc[bb][j] = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += DET_REDUCE_BLOCK) {
        const int64_t n = std::min<int64_t>(DET_REDUCE_BLOCK, K - k0);
        for (int64_t j = 0; j < n; ++j) wf[j] = det_matrix_at_f32(W, K, r, k0 + j);
        for (int64_t bb = 0; bb < nb; ++bb) {
          const float* x = X + (b0 + bb) * K + k0;
          float* a = acc[bb];
          for (int64_t j = 0; j < n; ++j) {  // term k0 + j goes to accumulator j / 8, in increasing j
            const int64_t l = j / DET_REDUCE_RUN;
            a[l] = det_fma_f32(wf[j], x[j], a[l]);
          }
        }
      }
      for (int64_t bb = 0; bb < nb; ++bb) Y[(b0 + bb) * ldy + r] = det_reduce_tree_f32(acc[bb]);
    }
  }
}

det_gemv_input det_gemv_stage(const det_matrix* const* W, int n, const float* X, int64_t K, int64_t B,
                              det_staging& buf) {
  det_gemv_input in{X, nullptr, K, B};
  bool simd = false;
  for (int i = 0; i < n; ++i) simd = simd || gemv_isa(*W[i], K, B) != DET_ISA_REF;
  if (!simd) return in;
  float* xp = buf.get(B * det_staged_len(K));
#if defined(__x86_64__)
  if (K % 8 == 0) det_stage_inputs_avx2(X, K, B, xp);  // every SIMD version needs AVX2 and K % 16 == 0
  else
#endif
    det_stage_inputs(X, K, B, xp);
  in.xp = xp;
  return in;
}

void det_gemv_rows(const det_matrix& W, const det_gemv_input& in, float* Y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t K = in.K, B = in.B;
  const int isa = gemv_isa(W, K, B);
  if (isa == DET_ISA_REF || !in.xp) return det_gemv_rows_ref(W, K, in.X, B, Y, ldy, r0, r1);
#if defined(__x86_64__)
  if (isa == DET_ISA_AVX2) return det_gemv_rows_avx2(W, K, in.xp, B, Y, ldy, r0, r1);
  if (B == 1) return det_gemv_rows_b1_avx512(W, K, in.xp, Y, r0, r1);
  return det_gemv_rows_tile_avx512(W, K, in.xp, B, Y, ldy, r0, r1);
#endif
}

const char* det_gemv_impl_name(const det_matrix& W, int64_t K, int64_t B) {
  static const char* const names[] = {"ref", "avx2", "avx512"};
  return names[gemv_isa(W, K, B)];
}

void det_attn_scores(const float* q, const float* k, int64_t stride, int64_t D, int64_t n, float scale,
                     float* out) {
#if defined(__x86_64__)
  if (det_cpu_isa() >= DET_ISA_AVX2 && D % 8 == 0) return det_attn_scores_avx2(q, k, stride, D, n, scale, out);
#endif
  attn_scores_ref(q, k, stride, D, n, scale, out);
}

void det_act_mul(int act, const float* gate, const float* up, float* out, int64_t n) {
#if defined(__x86_64__)
  if (det_cpu_isa() >= DET_ISA_AVX512) {
    if (act == DET_ACT_SILU) return det_silu_mul_avx512(gate, up, out, n);
    if (act == DET_ACT_GELU_TANH) return det_gelu_tanh_mul_avx512(gate, up, out, n);
  }
  if (det_cpu_isa() >= DET_ISA_AVX2) {
    if (act == DET_ACT_SILU) return det_silu_mul_avx2(gate, up, out, n);
    if (act == DET_ACT_GELU_TANH) return det_gelu_tanh_mul_avx2(gate, up, out, n);
  }
#endif
  act_mul_ref(act, gate, up, out, n);
}

float det_sum_f32(const float* a, int64_t K) { return sum_blocks(a, K); }

void det_exp_sub(const float* s, float m, float* e, int64_t n) {
#if defined(__x86_64__)
  if (det_cpu_isa() >= DET_ISA_AVX512) return det_exp_sub_avx512(s, m, e, n);
  if (det_cpu_isa() >= DET_ISA_AVX2) return det_exp_sub_avx2(s, m, e, n);
#endif
  exp_sub_ref(s, m, e, n);
}
