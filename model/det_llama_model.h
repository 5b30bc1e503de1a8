// det_llama_model.h: what every executor takes: a llama-family model (Llama, Qwen3, Mistral,
// Gemma-3, Gemma-4 text, Qwen2) as weight pointers (the seven per-layer projections dense bf16 or
// nf4-packed, det_nf4.h; norms as fp32 multipliers, docs/SPEC.md §13.2) plus the shapes and
// switches the contract depends on, and one sequence's fp32 KV cache.
// The CPU engine reads host pointers; the megakernel reads the same struct holding device
// pointers (or host pointers under emulation). Plain C, no torch.
#pragma once

#include <stdint.h>

#include "../contract/det_act.h"
#include "../contract/det_nf4.h"
#include "det_layer_plan.h"

struct det_llama_layer {
  const float* attn_norm;      // (hidden,)
  det_matrix wq;               // (heads*head_dim, hidden)
  det_matrix wk;               // (kv_heads*head_dim, hidden); unset when kv_source != this layer
  det_matrix wv;               // (kv_heads*head_dim, hidden); unset when kv_source != this layer
  det_matrix wo;               // (hidden, heads*head_dim)
  // Attention biases (Qwen2; attention_bias=True), fp32 widened from bf16, or null: added to each
  // projection's dot product, q_i = fl(dot_i + bq_i) (docs/SPEC.md §13.3 b, g).
  const float* bq;             // (heads*head_dim,)
  const float* bk;             // (kv_heads*head_dim,); null when kv_source != this layer
  const float* bv;             // (kv_heads*head_dim,); null when kv_source != this layer
  const float* bo;             // (hidden,)
  const float* q_norm;         // (head_dim,) or null (qk-norm: Qwen3, Gemma)
  const float* k_norm;         // (head_dim,) or null
  const float* v_norm;         // (head_dim,) or null (Gemma-4: its weightless norm, multipliers 1)
  const float* attn_out_norm;  // (hidden,) or null: Gemma's norm of the attention output
  const float* mlp_norm;       // (hidden,)
  det_matrix w_gate;           // (inter, hidden)
  det_matrix w_up;             // (inter, hidden)
  det_matrix w_down;           // (hidden, inter)
  const float* mlp_out_norm;   // (hidden,) or null: Gemma's norm of the MLP output
  // Gemma-4's per-layer input branch (det_llama_model.ple_dim > 0), else unset / null.
  det_matrix ple_gate;         // (ple_dim, hidden)
  det_matrix ple_proj;         // (hidden, ple_dim)
  const float* ple_out_norm;   // (hidden,)
  const float* scalar;         // (1,) or null: the residual stream is multiplied by it last (Gemma-4)
  int64_t head_dim;            // this layer's head size D (Gemma-4: sliding and full layers differ)
  int64_t inter;               // this layer's MLP width
  int64_t window;              // 0: full causal attention; W: a query at p sees p-W+1 .. p
  int64_t rope_table;          // which of the model's rope tables rotates this layer
  int64_t kv_source;           // the layer whose cached K/V it attends over: itself, or an earlier
                               // layer (Gemma-4 KV sharing: it then computes no K/V of its own)
  int64_t kv_offset;           // kv_source's place in the cache: the K (V) floats per position of the
                               // storing layers before it (det_kv_head_base)
};

#define DET_ROPE_TABLES_MAX 2

// A rope table: pairs (x_i, x_{i+half}) rotate by inv_freq[offset + i] for i < pairs (§13.3 d).
struct det_rope_table {
  int64_t pairs, half, offset;
};

struct det_llama_model {
  int64_t hidden, n_layers, n_heads, n_kv_heads, vocab;
  int64_t head_dim, inter;  // the largest of the layers' (sizes of the executors' buffers)
  int64_t rope_tables;      // 1 or 2 (Gemma: sliding and full layers rotate differently)
  det_rope_table rope[DET_ROPE_TABLES_MAX];
  int64_t rope_pairs;       // pairs of all tables together (the inv_freq and sin/cos lengths)
  int64_t attn_scale_dim;   // scores are scaled by rsqrt(attn_scale_dim): head_dim, Gemma-3's
                            // query_pre_attn_scalar, or 1 (Gemma-4)
  int64_t act;              // DET_ACT_SILU or DET_ACT_GELU_TANH
  int64_t kv_row;           // K (and V) floats per position in a sequence's cache: the K/V widths
                            // of the layers that store, summed
  float rms_eps;            // fp32 value of the config's eps
  float embed_scale;        // embedding rows are multiplied by it: 1, or Gemma's fl32(sqrt(hidden))
  const double* inv_freq;   // (rope_pairs,) fp64 rope inverse frequencies of every table (rope.py)
  const uint16_t* embed;    // (vocab, hidden)
  const float* final_norm;
  const uint16_t* lm_head;  // (vocab, hidden) bf16; the embedding when tied
  const float* softcap;     // (1,) or null: logits = c * tanh(z / c) (Gemma-4's final softcapping)
  // Gemma-4 per-layer inputs (docs/SPEC.md §13.7); ple_dim 0: none.
  int64_t ple_dim;               // P
  const uint16_t* ple_embed;     // (vocab, n_layers * P)
  det_matrix ple_model_proj;     // (n_layers * P, hidden)
  const float* ple_proj_norm;    // (P,)
  const det_llama_layer* layers;
  const det_step* steps;  // the layer plan (det_layer_plan.h), det_layer_plan_build's
  int64_t n_steps;
};

// One sequence's cache: k and v are capacity * kv_row fp32 each, laid out by layer, then KV head,
// then position (docs/SPEC.md §13.8): a storing layer's block of (kv_heads, capacity, head_dim)
// starts at kv_offset * capacity, so one head's keys (and values) at consecutive positions lie
// together (a walk over the context streams through memory; a position-major layout put them
// kv_row floats apart, a page per position on a large model).
struct det_kv_cache {
  float* k;
  float* v;
  int64_t capacity;
};

// Where KV head g of layer L starts in a cache of `capacity` positions.
DET_HD int64_t det_kv_head_base(const det_llama_layer& L, int64_t capacity, int64_t g) {
  return (L.kv_offset + g * L.head_dim) * capacity;
}

// Positions per key panel. A head's keys are stored in panels of 16 consecutive positions, element
// by element: element d of the panel's 16 keys are 16 adjacent floats. A CPU vector of 16 lanes
// then holds one element of 16 keys, which is what the scores (one key per lane) consume: keys
// stored row by row were transposed 16 x 16 on every step, for every chunk of the context (12% of
// a SmolLM2 decode step at 1,000 positions, 2026-12-05). Chunks (128) are whole panels.
#define DET_KV_PANEL 16

// Element d of the key at position p, from its head's start (det_kv_head_base); D the head size.
// The panel of positions p0 .. p0 + 15 takes 16 D floats from p0 * D on; when the capacity ends
// inside it, it is as wide as the positions that remain (its width w < 16), so a cache takes
// capacity * D floats per head whatever its capacity. Element d is d * w floats after element 0.
DET_HD int64_t det_kv_panel_width(int64_t capacity, int64_t p) {
  const int64_t p0 = p - p % DET_KV_PANEL;
  return capacity - p0 < DET_KV_PANEL ? capacity - p0 : DET_KV_PANEL;
}
DET_HD int64_t det_kv_key_at(int64_t capacity, int64_t D, int64_t p, int64_t d) {
  const int64_t p0 = p - p % DET_KV_PANEL;
  return p0 * D + d * det_kv_panel_width(capacity, p) + (p - p0);
}

// Element d of the value at position p, from its head's start: values stay one row per position.
DET_HD int64_t det_kv_value_at(int64_t D, int64_t p, int64_t d) { return p * D + d; }

// Errors (returned as negative codes; the Python layer validates first and maps them to text).
enum {
  DET_OK = 0,
  DET_ERR_ARG = -1,       // null pointer, n < 1, bad shape
  DET_ERR_TOKEN = -2,     // token id outside [0, vocab)
  DET_ERR_POSITION = -3,  // position outside [0, capacity) or > 1M rope bound
  DET_ERR_ORDER = -4,     // rows of one cache not in increasing position order
};

// Whether ok(matrix) holds for every layer's projections (true when there are no layers); host
// code, for the checks made before any executor runs. Unset matrices (K/V of a layer that reads
// another's, the per-layer-input pair without PLE) are skipped.
template <class Pred>
inline bool det_llama_every_projection(const det_llama_model* m, Pred ok) {
  for (int64_t l = 0; m->layers && l < m->n_layers; ++l) {
    const det_llama_layer& L = m->layers[l];
    const bool own_kv = L.kv_source == l, ple = m->ple_dim > 0;
    const det_matrix* w[] = {&L.wq, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
    for (const det_matrix* x : w)
      if (!ok(*x)) return false;
    if (own_kv && !(ok(L.wk) && ok(L.wv))) return false;
    if (ple && !(ok(L.ple_gate) && ok(L.ple_proj))) return false;
  }
  return m->ple_dim == 0 || ok(m->ple_model_proj);
}

// Every layer's projections readable (det_matrix_valid), a layer plan ending in the head, and the switches and per-layer shapes in
// range: the activation, the rope tables, each layer's table, window, head size (at most the
// model's), MLP width and K/V source (itself, or an earlier layer of the same head size that
// stores its own), and the cache row.
inline bool det_llama_model_valid(const det_llama_model* m) {
  if (!m->layers || !m->inv_freq || (m->act != DET_ACT_SILU && m->act != DET_ACT_GELU_TANH) ||
      m->rope_tables < 1 || m->rope_tables > DET_ROPE_TABLES_MAX || m->attn_scale_dim < 1 || m->ple_dim < 0 ||
      (m->ple_dim > 0 && (!m->ple_embed || !m->ple_proj_norm)))
    return false;
  for (int64_t t = 0; t < m->rope_tables; ++t) {
    const det_rope_table& r = m->rope[t];
    if (r.pairs < 0 || r.half < r.pairs || r.offset < 0 || r.offset + r.pairs > m->rope_pairs) return false;
  }
  for (int64_t l = 0; l < m->n_layers; ++l) {
    const det_llama_layer& L = m->layers[l];
    const int64_t s = L.kv_source;
    if (L.window < 0 || L.rope_table < 0 || L.rope_table >= m->rope_tables || L.head_dim < 1 ||
        L.head_dim > m->head_dim || L.inter < 1 || L.inter > m->inter || 2 * m->rope[L.rope_table].half > L.head_dim ||
        s < 0 || s > l || m->layers[s].kv_source != s || m->layers[s].head_dim != L.head_dim ||
        L.kv_offset != m->layers[s].kv_offset || L.kv_offset < 0 ||
        L.kv_offset + m->n_kv_heads * L.head_dim > m->kv_row)
      return false;
  }
  if (!m->steps || m->n_steps < 1 || m->steps[m->n_steps - 1].kind != DET_STEP_HEAD) return false;
  for (int64_t i = 0; i < m->n_steps; ++i) {
    const det_step& s = m->steps[i];
    if (s.kind < 0 || s.kind >= DET_STEP_KINDS || s.layer < -1 || s.layer >= m->n_layers) return false;
    if (s.kind == DET_STEP_RESIDUAL && (s.layer < 0 || !det_matrix_valid(s.w) || (s.input != DET_IN_ATT && s.input != DET_IN_ACT)))
      return false;
  }
  return det_llama_every_projection(m, [](const det_matrix& w) { return det_matrix_valid(w); });
}

#define DET_MAX_POSITION 1000000  // the rope reduction's validated bound (docs/SPEC.md §7.1)
