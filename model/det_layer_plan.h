// det_layer_plan.h: the model's forward pass as data: the steps every row goes through, in order,
// with their operands and shapes. Built once per model on the host (det_layer_plan_build.h) and
// run step by step by both executors (det_infer_cpu/det_llama_cpu.cpp, megakernel/det_mk_steps.cuh).
// The arithmetic of each step is docs/SPEC.md §13; the plan says which steps, in which order, on
// which weights. Plain C, readable on the device.
#pragma once

#include <stdint.h>

#include "../contract/det_nf4.h"

enum det_step_kind {
  DET_STEP_EMBED,        // x = the tokens' embedding rows (§13.3 step 1); each row's rope (sin, cos)
  DET_STEP_PLE_PROJECT,  // Gemma-4's per-layer inputs (§13.7), 1: ple = fl(x·Wproj * rsqrt(H))
  DET_STEP_PLE_FINISH,   // 2: each (row, layer) slice: RMSNorm, then det_ple_combine_f32
  DET_STEP_QKV,          // h = RMSNorm(x, attn_norm); q, k, v = h·Wq, h·Wk, h·Wv (q only: shared K/V), + biases
  DET_STEP_ROPE,         // q, k, v head norms, the rotation of q and k, k and v into the cache
  DET_STEP_ATTEND,       // att = each query head's attention over the cache (§13.4)
  DET_STEP_MLP,          // h = RMSNorm(x, mlp_norm); act = act(h·Wgate) * (h·Wup)
  DET_STEP_PLE_GATE,     // act = gelu(x·Wgate) * the layer's per-layer input (x not normalized)
  DET_STEP_RESIDUAL,     // y = in·W (+ bias); with a norm y = RMSNorm(y); x = fl(x + y); with a scalar x = fl(x * s)
  DET_STEP_HEAD,         // the wanted rows' logits: RMSNorm(x, final_norm)·lm_head, softcapped if set
  DET_STEP_KINDS
};

// The kinds' names (tools and messages), in the order of det_step_kind.
static const char* const det_step_kind_names[DET_STEP_KINDS] = {
    "embed", "ple_project", "ple_finish", "qkv", "rope", "attend", "mlp", "ple_gate", "residual", "head"};

// What a DET_STEP_RESIDUAL step multiplies by its projection.
enum det_step_input { DET_IN_NONE, DET_IN_ATT, DET_IN_ACT };

struct det_step {
  int32_t kind;             // det_step_kind
  int32_t layer;            // the layer whose weights and shapes it uses; -1 for model-level steps
  int32_t input;            // det_step_input (DET_STEP_RESIDUAL)
  int32_t reads_embedding;  // x was just written by DET_STEP_EMBED: an executor may read the
                            // embedding rows instead (the megakernel does, saving a grid barrier)
  int64_t n, k;             // outputs and input length of the step's matrix products (0: none)
  det_matrix w;             // DET_STEP_RESIDUAL: its projection
  const float* bias;        // DET_STEP_RESIDUAL: the projection's bias (o_proj with attention_bias) or null
  const float* norm;        // DET_STEP_RESIDUAL: the output norm (Gemma) or null
  const float* scalar;      // DET_STEP_RESIDUAL: the layer scalar applied after it (Gemma-4) or null
};
