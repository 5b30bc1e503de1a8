// det_sample_cpu.h: the CPU engine's sampler (docs/SPEC.md §15): contract/det_sample.h's steps with
// the engine's vectorized exp (det_exp_sub) and the ranking done by a stable radix sort instead of
// the heap, in the same total order (weight
// descending, then id ascending), so the kept set, its running sum and the draw are the same bits,
// at O(V) per draw instead of V heap sift-downs (~11 ms at V = 49,152 on a Zen 5). A draw ranks only
// the candidates, the weights of at least 2^-24 (no smaller one can be drawn: det_sample_cpu.cpp).
#pragma once

#include <stdint.h>

#include "../contract/det_sample.h"

// det_sample_keep's output from the weights e (V of them, each in [0, 1]) and their canonical sum S:
// the kept tokens at heap[V-1], heap[V-2], ... in rank order (heap holds the whole ranking, V
// entries); returns their number and sets *c_out to their running sum.
int64_t det_cpu_sample_keep(const float* e, int64_t V, float S, const det_sample_params& p, int32_t* heap,
                            float* c_out);

// The whole pick (det_sample.h's steps, with det_cpu_sample_keep): the token generated at `position`
// from one row of V logits. Scratch: e and heap, V entries each. The caller pins the FP environment.
int32_t det_cpu_sample_f32(const float* logits, int64_t V, det_sample_params p, int64_t position, float* e,
                           int32_t* heap);
