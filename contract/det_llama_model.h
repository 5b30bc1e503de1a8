// det_llama_model.h: what every executor takes: a llama-family model (Llama, Qwen3, Mistral,
// Gemma-3) as weight pointers (the seven per-layer projections dense bf16 or nf4-packed,
// det_nf4.h; norms as fp32 multipliers, docs/SPEC.md §13.2) plus the shapes and switches the
// contract depends on, and one sequence's fp32 KV cache.
// The CPU engine reads host pointers; the megakernel reads the same struct holding device
// pointers (or host pointers under emulation). Plain C, no torch.
#pragma once

#include <stdint.h>

#include "det_nf4.h"

struct det_llama_layer {
  const float* attn_norm;      // (hidden,)
  det_matrix wq;               // (heads*head_dim, hidden)
  det_matrix wk;               // (kv_heads*head_dim, hidden)
  det_matrix wv;               // (kv_heads*head_dim, hidden)
  det_matrix wo;               // (hidden, heads*head_dim)
  const float* q_norm;         // (head_dim,) or null (qk-norm: Qwen3, Gemma-3)
  const float* k_norm;         // (head_dim,) or null
  const float* attn_out_norm;  // (hidden,) or null: Gemma's norm of the attention output
  const float* mlp_norm;       // (hidden,)
  det_matrix w_gate;           // (inter, hidden)
  det_matrix w_up;             // (inter, hidden)
  det_matrix w_down;           // (hidden, inter)
  const float* mlp_out_norm;   // (hidden,) or null: Gemma's norm of the MLP output
  int64_t window;              // 0: full causal attention; W: a query at p sees p-W+1 .. p
  int64_t rope_table;          // which of the model's inv_freq tables rotates this layer
};

enum { DET_ACT_SILU = 0, DET_ACT_GELU_TANH = 1 };  // the MLP's act(gate) * up (det_act.h)
#define DET_ROPE_TABLES_MAX 2

struct det_llama_model {
  int64_t hidden, n_layers, n_heads, n_kv_heads, head_dim, inter, vocab;
  int64_t rope_pairs;      // rotated pairs per head: (i, i + rope_pairs) for i < rope_pairs
  int64_t rope_tables;     // 1 or 2 (Gemma: sliding and full layers rotate differently)
  int64_t attn_scale_dim;  // scores are scaled by rsqrt(attn_scale_dim): head_dim, or Gemma's
                           // query_pre_attn_scalar
  int64_t act;             // DET_ACT_SILU or DET_ACT_GELU_TANH
  float rms_eps;           // fp32 value of the config's eps
  float embed_scale;       // embedding rows are multiplied by it: 1, or Gemma's fl32(sqrt(hidden))
  const double* inv_freq;  // (rope_tables, rope_pairs) fp64 rope inverse frequencies (rope.py)
  const uint16_t* embed;   // (vocab, hidden)
  const float* final_norm;
  const uint16_t* lm_head;  // (vocab, hidden) bf16; the embedding when tied
  const det_llama_layer* layers;
};

// One sequence's cache: k and v are (n_layers, capacity, kv_heads*head_dim) fp32.
struct det_kv_cache {
  float* k;
  float* v;
  int64_t capacity;
};

// Errors (returned as negative codes; the Python layer validates first and maps them to text).
enum {
  DET_OK = 0,
  DET_ERR_ARG = -1,       // null pointer, n < 1, bad shape
  DET_ERR_TOKEN = -2,     // token id outside [0, vocab)
  DET_ERR_POSITION = -3,  // position outside [0, capacity) or > 1M rope bound
  DET_ERR_ORDER = -4,     // rows of one cache not in increasing position order
};

// Whether ok(matrix) holds for every layer's seven projections (true when there are no layers);
// host code, for the checks made before any executor runs.
template <class Pred>
inline bool det_llama_every_projection(const det_llama_model* m, Pred ok) {
  for (int64_t l = 0; m->layers && l < m->n_layers; ++l) {
    const det_llama_layer& L = m->layers[l];
    const det_matrix* w[] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
    for (const det_matrix* x : w)
      if (!ok(*x)) return false;
  }
  return true;
}

// Every layer's projections readable (det_matrix_valid), and the switches in range: the
// activation, the rope tables and each layer's table and window.
inline bool det_llama_model_valid(const det_llama_model* m) {
  if (!m->layers || !m->inv_freq || (m->act != DET_ACT_SILU && m->act != DET_ACT_GELU_TANH) ||
      m->rope_tables < 1 || m->rope_tables > DET_ROPE_TABLES_MAX || m->attn_scale_dim < 1)
    return false;
  for (int64_t l = 0; l < m->n_layers; ++l)
    if (m->layers[l].window < 0 || m->layers[l].rope_table < 0 || m->layers[l].rope_table >= m->rope_tables)
      return false;
  return det_llama_every_projection(m, [](const det_matrix& w) { return det_matrix_valid(w); });
}

#define DET_MAX_POSITION 1000000  // the rope reduction's validated bound (docs/SPEC.md §7.1)
