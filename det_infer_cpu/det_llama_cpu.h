// det_llama_cpu.h: the CPU engine for llama-family decoders (Llama, Qwen3, Mistral, Gemma-3,
// Gemma-4 text), torch-free.
//
// The forward pass of docs/SPEC.md §13 over "rows": row i is token tokens[i] at position
// positions[i] of sequence seq[i]'s KV cache. A prefill is the rows of one prompt, a batched decode
// step one row per sequence, a split prefill any grouping in between: the math of a row never
// depends on the other rows, so every grouping gives the same bits. Weights are bf16 (projections
// possibly nf4-packed, contract/det_nf4.h) used in place (the caller keeps them alive, typically
// memory-mapped); activations and the KV cache are fp32.
#pragma once

#include <stdint.h>

#include "../model/det_llama_model.h"
#include "../contract/det_sample.h"

// Forward pass for n rows: row i is token tokens[i] at position positions[i] of sequence seq[i]'s
// cache caches[seq[i]] (n_seq caches), rows validated by det_program_check. For rows with
// want_logits[i] != 0 (all rows if want_logits is null), the fp32 logits are written to
// logits + j*vocab, j counting the wanted rows in order.
int det_llama_forward(const det_llama_model* m, int64_t n, const int32_t* tokens, const int64_t* positions,
                      const int32_t* seq, det_kv_cache* const* caches, int64_t n_seq, const uint8_t* want_logits,
                      float* logits);

// Generation for B sequences in one call: sequence b's prompt is
// prompts[prompt_offsets[b] .. prompt_offsets[b+1]) and fills its cache from position
// start_positions[b] (0 for a fresh cache); the rows are model/det_program.h's. Each step picks
// the next token (det_sample.h: the argmax when sample is null or sample[b] is greedy, else a
// seeded draw keyed by the token's position) and feeds it back while det_decode_continues says
// so. out_tokens is (B, max_new), out_lengths (B,). step_logits, if not null, receives the
// logits of every emitted token, (B, max_new, vocab).
int det_llama_generate(const det_llama_model* m, int64_t B, const int32_t* prompts,
                       const int64_t* prompt_offsets, const int64_t* start_positions,
                       det_kv_cache* const* caches, int64_t max_new, const int32_t* stop_ids,
                       int64_t n_stop, const det_sample_params* sample, int32_t* out_tokens,
                       int64_t* out_lengths, float* step_logits);
