// det_sample_cpu.cpp: the sampler's ranking by a stable LSD radix sort (det_sample_cpu.h).
#include "det_sample_cpu.h"

#include <string.h>

#include <vector>

#include "det_kernels_cpu.h"

namespace {

// The least weight a draw can reach (docs/SPEC.md §15): rank 0's weight is 1, so every later running
// sum c is at least 1, and a weight below 2^-24, half an ulp of 1, leaves c as it is. The walk's
// ranks past the last weight of at least 2^-24 keep the last sum, which exceeds the draw's r, so
// the draw picks a rank before them. The sampler ranks only those candidates (a trained model's
// step has far fewer than V: SmolLM2-135M-Instruct, median 7,228 of 49,152 at temperature 1); the
// kept set itself (det_cpu_sample_keep, which log-probabilities use) ranks every id.
constexpr float kLeastCandidate = 0x1p-24f;

// For e >= +0 the IEEE bits grow with the value, so ~bits sorts ascending in descending weight; a
// stable sort of ids in ascending order keeps ties (equal bits: the same weight) in id order.
// Three passes of 11 bits cover the 32-bit key. The key rides in the high half of each entry.
// Ranks the ids whose weight is at least `least` into heap[V-1], heap[V-2], ...; returns how many.
int64_t rank_by_weight(const float* e, int64_t V, float least, int32_t* heap) {
  thread_local std::vector<uint64_t> a, b;
  a.resize(V);
  b.resize(V);
  int64_t n = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (!(e[i] >= least)) continue;
    uint32_t bits;
    memcpy(&bits, &e[i], 4);
    a[n++] = ((uint64_t)~bits << 32) | (uint32_t)i;
  }
  uint64_t* src = a.data();
  uint64_t* dst = b.data();
  for (int shift = 32; shift < 64; shift += 11) {
    int64_t count[2049] = {0};
    for (int64_t i = 0; i < n; ++i) ++count[((src[i] >> shift) & 2047) + 1];
    for (int d = 0; d < 2048; ++d) count[d + 1] += count[d];
    for (int64_t i = 0; i < n; ++i) dst[count[(src[i] >> shift) & 2047]++] = src[i];
    uint64_t* t = src;
    src = dst;
    dst = t;
  }
  for (int64_t j = 0; j < n; ++j) heap[V - 1 - j] = (int32_t)(uint32_t)src[j];  // rank j at heap[V-1-j]
  return n;
}

// det_sample_keep's walk over the ranks of the ids whose weight is at least `least` (0: every id).
int64_t keep_ranked(const float* e, int64_t V, float S, const det_sample_params& p, int32_t* heap, float* c_out,
                    float least) {
  for (int64_t i = 0; i < V; ++i)
    if (e[i] != e[i]) return det_sample_keep(e, V, S, p, heap, c_out);  // a NaN weight (T so small that
  // z overflows): the heap's own order, which is not a sort, stays the definition
  const float target = det_sample_target(S, p);
  const int64_t ranked = rank_by_weight(e, V, least, heap);
  int64_t n = 0;
  float c = 0.0f;
  for (int64_t j = 0; j < ranked; ++j) {  // det_sample_keep's walk over the same order
    const int32_t tok = heap[V - 1 - j];
    if (det_sample_refused(e[tok], n, p)) break;
    c = det_add_f32(c, e[tok]);
    ++n;
    if (det_sample_full(n, c, target, p)) break;
  }
  *c_out = c;
  return n;
}

}  // namespace

int64_t det_cpu_sample_keep(const float* e, int64_t V, float S, const det_sample_params& p, int32_t* heap,
                            float* c_out) {
  return keep_ranked(e, V, S, p, heap, c_out, 0.0f);
}

int32_t det_cpu_sample_f32(const float* logits, int64_t V, det_sample_params p, int64_t position, float* e,
                           int32_t* heap) {
  if (det_sample_greedy(p)) return (int32_t)det_argmax_f32_ref(logits, V);
  for (int64_t i = 0; i < V; ++i)
    if (!det_sample_finite(logits[i])) return (int32_t)det_argmax_f32_ref(logits, V);
  float m = det_sample_scaled(logits[0], p);
  for (int64_t i = 0; i < V; ++i) {
    e[i] = det_sample_scaled(logits[i], p);
    m = e[i] > m ? e[i] : m;
  }
  det_exp_sub(e, m, e, V);  // e_i = det_sample_weight(z_i, m), vectorized (bit-equal; in place)
  float c;
  const int64_t n = keep_ranked(e, V, det_sum_f32_ref(e, V), p, heap, &c, kLeastCandidate);
  return det_sample_draw(e, V, heap, n, c, p, position);
}
