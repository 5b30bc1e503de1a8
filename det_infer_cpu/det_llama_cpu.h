// det_llama_cpu.h: the CPU engine for llama-family decoders (Llama, Qwen3, Mistral), torch-free.
//
// The forward pass of docs/SPEC.md §13 over "rows": row i is token tokens[i] at position
// positions[i] of the KV cache caches[i]. A prefill is the rows of one prompt, a batched decode
// step one row per sequence, a split prefill any grouping in between: the math of a row never
// depends on the other rows, so every grouping gives the same bits. Weights are bf16 used in
// place (the caller keeps them alive, typically memory-mapped); activations and the KV cache
// are fp32.
#pragma once

#include <stdint.h>

struct det_llama_layer {
  const uint16_t* attn_norm;  // (hidden,)
  const uint16_t* wq;         // (heads*head_dim, hidden)
  const uint16_t* wk;         // (kv_heads*head_dim, hidden)
  const uint16_t* wv;         // (kv_heads*head_dim, hidden)
  const uint16_t* wo;         // (hidden, heads*head_dim)
  const uint16_t* q_norm;     // (head_dim,) or null (Qwen3 qk-norm)
  const uint16_t* k_norm;     // (head_dim,) or null
  const uint16_t* mlp_norm;   // (hidden,)
  const uint16_t* w_gate;     // (inter, hidden)
  const uint16_t* w_up;       // (inter, hidden)
  const uint16_t* w_down;     // (hidden, inter)
};

struct det_llama_model {
  int64_t hidden, n_layers, n_heads, n_kv_heads, head_dim, inter, vocab;
  int64_t rope_pairs;      // rotated pairs per head: (i, i + rope_pairs) for i < rope_pairs
  int64_t sliding_window;  // 0: full causal attention; W: a query at p sees p-W+1 .. p
  float rms_eps;           // fp32 value of the config's eps
  const double* inv_freq;  // (rope_pairs,) fp64 rope inverse frequencies (rope.py)
  const uint16_t* embed;   // (vocab, hidden)
  const uint16_t* final_norm;
  const uint16_t* lm_head;  // (vocab, hidden); the embedding when tied
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

#define DET_MAX_POSITION 1000000  // the rope reduction's validated bound (docs/SPEC.md §7.1)

// Forward pass for n rows. For rows with want_logits[i] != 0 (all rows if want_logits is null),
// the fp32 logits are written to logits + j*vocab, j counting the wanted rows in order.
int det_llama_forward(const det_llama_model* m, int64_t n, const int32_t* tokens,
                      const int64_t* positions, det_kv_cache* const* caches,
                      const uint8_t* want_logits, float* logits);

// Greedy generation for B sequences in one call: sequence b's prompt is
// prompts[prompt_offsets[b] .. prompt_offsets[b+1]) and fills its cache from position
// start_positions[b] (0 for a fresh cache). Each step argmaxes (det_argmax.h) and feeds the token
// back; a sequence stops after max_new tokens or after emitting one of stop_ids. out_tokens is
// (B, max_new), out_lengths (B,). step_logits, if not null, receives the logits of every emitted
// token, (B, max_new, vocab).
int det_llama_generate(const det_llama_model* m, int64_t B, const int32_t* prompts,
                       const int64_t* prompt_offsets, const int64_t* start_positions,
                       det_kv_cache* const* caches, int64_t max_new, const int32_t* stop_ids,
                       int64_t n_stop, int32_t* out_tokens, int64_t* out_lengths,
                       float* step_logits);
