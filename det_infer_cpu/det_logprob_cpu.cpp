// det_logprob_cpu.cpp: rows of logits to the contract's logprobs (contract/det_logprob.h). The
// exponentials run through the engine's vectorized exp(fl(z - m)) (det_exp_sub, bit-equal to
// det_sample_weight) and their sums through its vectorized canonical sum (det_sum_f32, bit-equal to
// det_sum_f32_ref); everything else is the contract header's own code.
#include "det_logprob_cpu.h"

#include <algorithm>
#include <vector>

#include "../contract/det_freq.h"
#include "../contract/det_logprob.h"
#include "det_kernels_cpu.h"
#include "det_parallel.h"
#include "det_sample_cpu.h"

namespace {

// z (the scaled logits), m and e = exp(fl(z - m)) of one row; returns S, the canonical sum of e.
float row_terms(const float* logits, int64_t V, const det_sample_params& p, float* z, float* e, float* m) {
  *m = det_logprob_max(logits, V, p);
  for (int64_t i = 0; i < V; ++i) z[i] = det_sample_scaled(logits[i], p);
  det_exp_sub(z, *m, e, V);
  return det_sum_f32(e, V);
}

}  // namespace

void det_cpu_logprob_rows(const float* logits, int64_t n, int64_t V, const int64_t* targets,
                          const det_sample_params& p, int64_t k, float* lp, int64_t* rank, int64_t* top_ids,
                          float* top_lp) {
  det_fpenv_guard env;
  det_parallel_chunks(n, [&](int64_t r0, int64_t r1) {
    std::vector<float> z(V), e(V);
    std::vector<int32_t> ids(k > 0 ? V : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = logits + r * V;
      float m;
      const float L = det_log_f32(row_terms(row, V, p, z.data(), e.data(), &m));
      const int64_t t = targets[r];
      lp[r] = det_canonical_f32(det_logprob_f32(det_sub_f32(z[t], m), L));
      rank[r] = det_logprob_rank(row, V, t);
      if (k <= 0) continue;
      for (int64_t i = 0; i < V; ++i) ids[i] = (int32_t)i;
      // The argmax order is total, so the k best are one set in one order whatever the sort.
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                        [&](int32_t a, int32_t b) { return det_argmax_better(row[a], a, row[b], b); });
      for (int64_t j = 0; j < k; ++j) {
        top_ids[r * k + j] = ids[j];
        top_lp[r * k + j] = det_canonical_f32(det_logprob_f32(det_sub_f32(z[ids[j]], m), L));
      }
    }
  }, 2);
}

void det_cpu_log_softmax_rows(const float* logits, int64_t n, int64_t V, const det_sample_params& p, float* out) {
  det_fpenv_guard env;
  det_parallel_chunks(n, [&](int64_t r0, int64_t r1) {
    std::vector<float> z(V), e(V);
    for (int64_t r = r0; r < r1; ++r) {
      float m;
      const float L = det_log_f32(row_terms(logits + r * V, V, p, z.data(), e.data(), &m));
      for (int64_t i = 0; i < V; ++i) out[r * V + i] = det_canonical_f32(det_logprob_f32(det_sub_f32(z[i], m), L));
    }
  }, 2);
}

int64_t det_cpu_logprob_kept(const float* logits, int64_t V, const det_sample_params& p, int32_t* ids, float* lp) {
  det_fpenv_guard env;
  std::vector<float> z(V), e(V);
  std::vector<int32_t> heap(V);
  float m;
  const float S = row_terms(logits, V, p, z.data(), e.data(), &m);
  for (int64_t i = 0; i < V; ++i) {  // det_logprob_kept's rule: a non-finite row keeps its argmax alone
    if (!det_sample_finite(logits[i])) {
      ids[0] = (int32_t)det_argmax_f32_ref(logits, V);
      lp[0] = 0.0f;
      return 1;
    }
  }
  float c;
  const int64_t n = det_cpu_sample_keep(e.data(), V, S, p, heap.data(), &c);  // det_sample_keep's set
  det_logprob_of_kept(logits, V, m, p, heap.data(), n, c, ids, lp);
  for (int64_t j = 0; j < n; ++j) lp[j] = det_canonical_f32(lp[j]);
  return n;
}

void det_cpu_token_freqs(const float* logits, int64_t n, int64_t V, int32_t* f) {
  det_fpenv_guard env;
  det_parallel_chunks(n, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(V);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = logits + r * V;
      int32_t* out = f + r * V;
      bool finite = true;
      for (int64_t i = 0; i < V && finite; ++i) finite = det_sample_finite(row[i]);
      if (!finite) {
        det_freq_f32_ref(row, V, out, e.data());  // the header's own rule for a non-finite row
        continue;
      }
      float m = row[0];
      for (int64_t i = 1; i < V; ++i) m = row[i] > m ? row[i] : m;
      det_exp_sub(row, m, e.data(), V);  // det_sample_weight, vectorized (the same bits)
      const float c = det_freq_scale(det_sum_f32(e.data(), V));
      for (int64_t i = 0; i < V; ++i) out[i] = det_freq_of(e[i], c);
    }
  }, 2);
}
