// det_attn_cpu.h: the CPU engine's ATTEND step (docs/SPEC.md §13.4) for a block of rows.
#pragma once

#include <stdint.h>

#include "../model/det_llama_model.h"

// Each row b's query heads (q: (B, n_heads * head_dim)) attend over its cache caches[b] at
// positions[b] (visible positions: layer L's window before it, or all), into out (same shape).
// Every row's K and V are already in its cache (rows of one sequence see each other's). Consecutive
// rows that share a cache share K and V reads.
void det_cpu_attend(const det_llama_model* m, const det_llama_layer& L, int64_t B, const int64_t* positions,
                    det_kv_cache* const* caches, const float* q, float* out);
