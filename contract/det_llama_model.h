// det_llama_model.h: what every executor takes: a llama-family model (Llama, Qwen3, Mistral) as
// weight pointers (bf16 vectors; the seven per-layer projections dense bf16 or nf4-packed,
// det_nf4.h) plus the shapes the contract depends on, and one sequence's fp32 KV cache.
// The CPU engine reads host pointers; the megakernel reads the same struct holding device
// pointers (or host pointers under emulation). Plain C, no torch.
#pragma once

#include <stdint.h>

#include "det_nf4.h"

struct det_llama_layer {
  const uint16_t* attn_norm;  // (hidden,)
  det_matrix wq;              // (heads*head_dim, hidden)
  det_matrix wk;              // (kv_heads*head_dim, hidden)
  det_matrix wv;              // (kv_heads*head_dim, hidden)
  det_matrix wo;              // (hidden, heads*head_dim)
  const uint16_t* q_norm;     // (head_dim,) or null (Qwen3 qk-norm)
  const uint16_t* k_norm;     // (head_dim,) or null
  const uint16_t* mlp_norm;   // (hidden,)
  det_matrix w_gate;          // (inter, hidden)
  det_matrix w_up;            // (inter, hidden)
  det_matrix w_down;          // (hidden, inter)
};

struct det_llama_model {
  int64_t hidden, n_layers, n_heads, n_kv_heads, head_dim, inter, vocab;
  int64_t rope_pairs;      // rotated pairs per head: (i, i + rope_pairs) for i < rope_pairs
  int64_t sliding_window;  // 0: full causal attention; W: a query at p sees p-W+1 .. p
  float rms_eps;           // fp32 value of the config's eps
  const double* inv_freq;  // (rope_pairs,) fp64 rope inverse frequencies (rope.py)
  const uint16_t* embed;   // (vocab, hidden)
  const uint16_t* final_norm;
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

// Every layer's projections readable (det_matrix_valid).
inline bool det_llama_matrices_valid(const det_llama_model* m) {
  return m->layers && det_llama_every_projection(m, [](const det_matrix& w) { return det_matrix_valid(w); });
}

#define DET_MAX_POSITION 1000000  // the rope reduction's validated bound (docs/SPEC.md §7.1)
