// det_logprob_cpu.h: the CPU executor's log-probabilities of rows of logits (contract/det_logprob.h,
// docs/SPEC.md §15.1). Plain C++ (no torch); each entry point pins the FP environment.
#pragma once

#include <stdint.h>

#include "../contract/det_sample.h"

// For each row r of logits (n rows of V): lp[r] = logprob of targets[r] at p.temperature (> 0)
// and rank[r] its rank (1 = the argmax); with k > 0 also the k best ids in the argmax order,
// top_ids[r*k ..], and their logprobs top_lp[r*k ..]. Rows run in parallel.
void det_cpu_logprob_rows(const float* logits, int64_t n, int64_t V, const int64_t* targets,
                          const det_sample_params& p, int64_t k, float* lp, int64_t* rank, int64_t* top_ids,
                          float* top_lp);

// out[r*V + i] = logprob of id i in row r (the whole log-softmax of each of n rows).
void det_cpu_log_softmax_rows(const float* logits, int64_t n, int64_t V, const det_sample_params& p, float* out);

// The sampler's kept set of one row under p's filters, in rank order, and its renormalized
// logprobs: ids[0..n), lp[0..n) (V entries each); returns n.
int64_t det_cpu_logprob_kept(const float* logits, int64_t V, const det_sample_params& p, int32_t* ids, float* lp);

// f[r*V + i] = the compression frequency of id i in row r (contract/det_freq.h, docs/SPEC.md §18.1)
// for each of n rows. Rows run in parallel.
void det_cpu_token_freqs(const float* logits, int64_t n, int64_t V, int32_t* f);
