// det_kernels_cpu.h: the CPU engine's hot kernels and the run-time choice of their ISA version.
// Every version computes exactly the reference's bits (the literal contract loops); tests run each
// ISA level against the reference (tests/test_engine_kernels.py).
#pragma once

#include <stdint.h>

#include <vector>

#include "../contract/det_attention.h"
#include "../model/det_llama_model.h"
#include "det_lane_blocks.h"

// ISA levels. The level used is the CPU's, capped by DET_INFER_GEMV=ref|avx2 in the environment or
// by det_set_isa_cap (for tests and A/B runs). The SIMD GEMVs read weights and inputs in the staged
// order of det_lane_blocks.h: AVX-512 (F, BW, VL, DQ) transposes each 256-weight block in registers
// (x86/det_stage_avx512.h) for one input or stages row blocks for register tiles of several; AVX2
// stages one row at a time with 8 x 8 transposes.
enum { DET_ISA_REF = 0, DET_ISA_AVX2 = 1, DET_ISA_AVX512 = 2 };
int det_cpu_isa();
void det_set_isa_cap(int level);

// The inputs X (B, K) fp32 of a GEMV, with their staged form (det_lane_blocks.h) for the SIMD
// kernels. Staged once per parallel region by the calling thread, so that every matrix sharing
// the input (Q, K and V; gate and up) and every thread reads the same staged copy.
struct det_gemv_input {
  const float* X;
  const float* xp;  // B rows of det_staged_len(K) floats; null when only the reference runs
  int64_t K, B;
};
// Stages X for the matrices W[0 .. n) when any of them runs a SIMD version, into buf.
det_gemv_input det_gemv_stage(const det_matrix* const* W, int n, const float* X, int64_t K, int64_t B,
                              det_staging& buf);
// Y[b*ldy + r] = canonical dot(W[r, :], X[b*K .. +K)) for rows r0 <= r < r1 and inputs b < B
// (docs/SPEC.md §9); W dense bf16 or nf4-packed with rows of K (det_nf4.h), X fp32; `in` staged
// by det_gemv_stage for a list that held W.
void det_gemv_rows(const det_matrix& W, const det_gemv_input& in, float* Y, int64_t ldy, int64_t r0, int64_t r1);
// Which version det_gemv_rows uses for W with rows of length K and B inputs: "ref", "avx2", or
// "avx512" (the batch-1 kernel or the register tiles).
const char* det_gemv_impl_name(const det_matrix& W, int64_t K, int64_t B);
// Asks for the cache lines of [p, p + bytes) ahead of use (hints only): into L1, for data needed
// next; or into L2 (prefetcht1: L2 alone on Zen 4 and Intel cores), for data needed later, from far
// enough ahead to hide the memory's latency without evicting what L1 holds now. The hardware
// prefetchers do not follow the kernels' walks: a weight row block's lines are revisited out of
// order (one head's cached rows are adjacent, docs/SPEC.md §13.8, but a chunk's V walk follows its
// keys' scores group by group).
inline void det_prefetch_l1(const void* p, int64_t bytes) {
#if defined(__GNUC__)
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(static_cast<const char*>(p) + i, 0, 3);
#endif
}
inline void det_prefetch_l2(const void* p, int64_t bytes) {
#if defined(__GNUC__)
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(static_cast<const char*>(p) + i, 0, 2);
#endif
}
// Attention scores of one query: out[i] = fl(canonical dot(q, k + i*stride over D) * scale), i < n.
void det_attn_scores(const float* q, const float* k, int64_t stride, int64_t D, int64_t n, float scale,
                     float* out);
// One query of a chunk (docs/SPEC.md §13.4): its visible slots and where its partial goes.
struct det_attn_query {
  const float* q;      // (D,)
  int64_t j0, j1;      // visible slots, 0 <= j0 <= j1 < DET_ATTN_CHUNK
  det_attn_acc* part;  // out: the chunk's (m, l)
  float* o;            // out: (D,) the chunk's o
};
// §13.4 step 4's tree over a chunk's slot groups: group_o holds accumulator g's o (D floats) at
// g * D for each group g < 16 with a slot among j0..j1; the others (+0 in every dimension, and
// groups 16..31 always) are skipped, or copied into when the other side is empty. That changes at
// most the sign of a zero, and the full tree, which adds +0 leaves, never gives -0; adding +0 once
// at the end restores its bits (det_reduce.h). The result is group_o[0 .. D).
inline void det_attn_group_tree(float* group_o, int64_t D, int64_t j0, int64_t j1) {
  constexpr int64_t kGroups = DET_ATTN_CHUNK / DET_REDUCE_RUN;
  bool live[kGroups];
  for (int64_t g = 0; g < kGroups; ++g)
    live[g] = (j0 > g * DET_REDUCE_RUN ? j0 : g * DET_REDUCE_RUN) <=
              (j1 < g * DET_REDUCE_RUN + DET_REDUCE_RUN - 1 ? j1 : g * DET_REDUCE_RUN + DET_REDUCE_RUN - 1);
  for (int64_t half = kGroups / 2; half >= 1; half /= 2)
    for (int64_t g = 0; g < half; ++g) {
      if (!live[g + half]) continue;
      float* a = group_o + g * D;
      const float* b = group_o + (g + half) * D;
      if (live[g]) {
        for (int64_t d = 0; d < D; ++d) a[d] = det_add_f32(a[d], b[d]);
      } else {
        for (int64_t d = 0; d < D; ++d) a[d] = b[d];
        live[g] = true;
      }
    }
  for (int64_t d = 0; d < D; ++d) group_o[d] = det_add_f32(group_o[d], 0.0f);
}
// A chunk's cached keys and values (docs/SPEC.md §13.8): slots 0 .. n - 1 lie in the cache (n is
// 128, or less where the capacity ends inside the chunk). Keys in panels of 16 slots from k on,
// slot j's element d at k + det_kv_key_at(n, D, j, d); values one row per slot, slot j's at v + j * D.
struct det_attn_rows {
  const float *k, *v;
  int64_t n;
};
// Steps 1-4 of §13.4 for each query over one chunk's rows; keys are read by whole panels, values
// only where a query sees the slot (the rest of the cache may hold anything). next
// (null pointers: none) is the chunk the caller takes next: its rows are requested into L2 while
// this one computes (hints only: they are never read here).
void det_attn_chunk(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs, int64_t nq,
                    det_attn_rows next);
// Which version det_attn_chunk runs for head size D: "ref", "avx2" or "avx512".
const char* det_attn_chunk_impl_name(int64_t D);
// out[i] = fl(act(gate[i]) * up[i]), act silu or gelu-tanh (DET_ACT_*, contract/det_act.h)
void det_act_mul(int act, const float* gate, const float* up, float* out, int64_t n);
// e[i] = exp(fl(s[i] - m))
void det_exp_sub(const float* s, float m, float* e, int64_t n);
// The canonical sum of a[0 .. K) (docs/SPEC.md §9, det_sum_f32_ref's order), vectorized.
float det_sum_f32(const float* a, int64_t K);

// ---- the versions -----------------------------------------------------------------------------
void det_gemv_rows_ref(const det_matrix& W, int64_t K, const float* X, int64_t B, float* Y, int64_t ldy,
                       int64_t r0, int64_t r1);
#if defined(__x86_64__)
// The SIMD GEMVs take the inputs staged (xp: B rows of det_staged_len(K) floats, det_stage_inputs);
// K % 16 == 0, and nf4 blocks of at least 16.
// x86/det_gemv_avx2.cpp: det_stage_inputs with AVX2 (K % 8 == 0; the same floats).
void det_stage_inputs_avx2(const float* X, int64_t K, int64_t B, float* xp);
// x86/det_gemv_avx2.cpp: AVX2 + FMA, any B.
void det_gemv_rows_avx2(const det_matrix& W, int64_t K, const float* xp, int64_t B, float* Y, int64_t ldy,
                        int64_t r0, int64_t r1);
// x86/det_nf4_decode.cpp: out[0..K) = bf16 bits of the nf4 weights at flat indices i0 .. i0+K
// (i0 % 16 == 0, K % 16 == 0, blocks of at least 16); AVX-512 at that level, else AVX2.
void det_nf4_decode_row(const det_matrix& W, int64_t i0, int64_t K, uint16_t* out);
// x86/det_gemv_b1_avx512.cpp: y[r] = canonical dot(W[r, :], x) for one input.
void det_gemv_rows_b1_avx512(const det_matrix& W, int64_t K, const float* xp, float* y, int64_t r0, int64_t r1);
// x86/det_gemv_tile_avx512.cpp: the same for B >= 2 inputs in register tiles.
void det_gemv_rows_tile_avx512(const det_matrix& W, int64_t K, const float* xp, int64_t B, float* Y, int64_t ldy,
                               int64_t r0, int64_t r1);
// x86/det_attn_avx2.cpp: det_attn_scores eight keys at a time; D % 8 == 0.
void det_attn_scores_avx2(const float* q, const float* k, int64_t stride, int64_t D, int64_t n, float scale,
                          float* out);
// x86/det_attn_chunk_avx2.cpp: det_attn_chunk with AVX2 + FMA; D % 8 == 0.
void det_attn_chunk_avx2(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs, int64_t nq,
                         det_attn_rows next);
// x86/det_attn_chunk_avx512.cpp: det_attn_chunk with AVX-512 (F, DQ); D % 16 == 0.
void det_attn_chunk_avx512(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs,
                           int64_t nq, det_attn_rows next);
// AVX2 + FMA (x86/det_act_avx2.cpp)
void det_silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);
void det_gelu_tanh_mul_avx2(const float* gate, const float* up, float* out, int64_t n);
void det_exp_sub_avx2(const float* s, float m, float* e, int64_t n);
// The same with AVX-512 F + DQ (x86/det_act_avx512.cpp)
void det_silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n);
void det_gelu_tanh_mul_avx512(const float* gate, const float* up, float* out, int64_t n);
void det_exp_sub_avx512(const float* s, float m, float* e, int64_t n);
// e[16i + t] = exp(fl(s[16i + t] - m[t])), n % 16 == 0
void det_exp_sub_lanes_avx512(const float* s, const float* m, float* e, int64_t n);
#endif
