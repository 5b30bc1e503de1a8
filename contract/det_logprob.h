// det_logprob.h: log-probabilities of one row of logits (docs/SPEC.md §15.1), on the sampler's own
// steps (det_sample.h) so that a logprob and a draw see the same z, m, e and S.
//
//   At temperature T > 0 (T = 1: z = l exactly): z_i = fl(l_i / T); m = max z (the sampler's m);
//   d_i = fl(z_i - m); S = canonical sum (§9) of e_i = exp(d_i); L = log(S) (§4.5);
//   logprob_i = fl(d_i - L). IEEE rules carry NaN and inf through (a NaN or +inf logit makes every
//   logprob NaN; a -inf logit has logprob -inf).
//   Under top_k / top_p / min_p: K = the sampler's kept set (det_sample_keep) and c its running sum;
//   kept logprob_i = fl(d_i - log(c)) for i in K (the draw's probability e_i / c), -inf outside K.
//   With a NaN or infinite logit the sampler takes the argmax, so K = {argmax} with logprob 0.
//   rank_i = 1 + the number of ids ranking above i in the argmax order of the logits (§10): NaN
//   first, then larger values, ties to the lower id; rank 1 is the greedy choice.
#pragma once

#include "det_log.h"
#include "det_sample.h"

// m = the max of z_i = det_sample_scaled(l_i) over ids in increasing order (the sampler's m).
DET_HD float det_logprob_max(const float* logits, int64_t V, const det_sample_params& p) {
  float m = det_sample_scaled(logits[0], p);
  for (int64_t i = 1; i < V; ++i) {
    const float z = det_sample_scaled(logits[i], p);
    m = z > m ? z : m;
  }
  return m;
}

// d_i = fl(z_i - m): the argument of e_i = exp(d_i) (det_sample_weight).
DET_HD float det_logprob_shifted(float logit, float m, const det_sample_params& p) {
  return det_sub_f32(det_sample_scaled(logit, p), m);
}

// logprob_i from d_i and L = log of the sum its set is normalized by (S, or the kept c).
DET_HD float det_logprob_f32(float d, float log_sum) { return det_sub_f32(d, log_sum); }

// rank_t = 1 + #{j : j ranks above t in the argmax order}.
DET_HD int64_t det_logprob_rank(const float* logits, int64_t V, int64_t t) {
  int64_t above = 0;
  for (int64_t j = 0; j < V; ++j) above += det_argmax_better(logits[j], j, logits[t], t) ? 1 : 0;
  return above + 1;
}

// Sequential reference of the log-softmax: lp[0..V) at temperature p.temperature > 0; scratch e (V).
DET_HD void det_log_softmax_f32_ref(const float* logits, int64_t V, const det_sample_params& p, float* lp,
                                    float* e) {
  const float m = det_logprob_max(logits, V, p);
  for (int64_t i = 0; i < V; ++i) e[i] = det_exp_f32(det_logprob_shifted(logits[i], m, p));
  const float L = det_log_f32(det_sum_f32_ref(e, V));
  for (int64_t i = 0; i < V; ++i) lp[i] = det_logprob_f32(det_logprob_shifted(logits[i], m, p), L);
}

// The renormalized logprobs of a kept set: the n tokens heap[V-1], ..., heap[V-n] (rank order) with
// running sum c (det_sample_keep's output) to ids[0..n) and lp[0..n).
DET_HD void det_logprob_of_kept(const float* logits, int64_t V, float m, const det_sample_params& p,
                                const int32_t* heap, int64_t n, float c, int32_t* ids, float* lp) {
  const float L = det_log_f32(c);
  for (int64_t j = 0; j < n; ++j) {
    ids[j] = heap[V - 1 - j];
    lp[j] = det_logprob_f32(det_logprob_shifted(logits[ids[j]], m, p), L);
  }
}

// The sampler's kept set under p's filters and its renormalized logprobs: ids[0..n) in rank order,
// lp[0..n) theirs; returns n. e holds exp(d_i) for the row (as det_log_softmax_f32_ref makes it)
// and S their canonical sum; m the row's max. Scratch: heap (V).
DET_HD int64_t det_logprob_kept(const float* logits, const float* e, int64_t V, float S, float m,
                                const det_sample_params& p, int32_t* ids, float* lp, int32_t* heap) {
  for (int64_t i = 0; i < V; ++i) {
    if (!det_sample_finite(logits[i])) {
      ids[0] = (int32_t)det_argmax_f32_ref(logits, V);
      lp[0] = 0.0f;
      return 1;
    }
  }
  float c;
  const int64_t n = det_sample_keep(e, V, S, p, heap, &c);
  det_logprob_of_kept(logits, V, m, p, heap, n, c, ids, lp);
  return n;
}
