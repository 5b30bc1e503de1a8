// det_sample_cpu.cpp: the CPU engine's sampler (det_sample_cpu.h): its passes over the vocabulary,
// written so that they vectorize, and its ranking by a stable LSD radix sort.
#include "det_sample_cpu.h"

#include <string.h>

#include <vector>

#include "det_kernels_cpu.h"
#include "det_parallel.h"

namespace {

// The least weight a draw can reach (docs/SPEC.md §15): rank 0's weight is 1, so every later running
// sum c is at least 1, and a weight below 2^-24, half an ulp of 1, leaves c as it is. The walk's
// ranks past the last weight of at least 2^-24 keep the last sum, which exceeds the draw's r, so
// the draw picks a rank before them. The sampler ranks only those candidates (a trained model's
// step has far fewer than V: SmolLM2-135M-Instruct, median 7,228 of 49,152 at temperature 1); the
// kept set itself (det_cpu_sample_keep, which log-probabilities use) ranks every id.
constexpr float kLeastCandidate = 0x1p-24f;

// Weights in [+0, 1] (what exp(fl(z - m)) gives when no weight is NaN) compare as their bits, so a
// weight's key is 1.0f's bits minus its own: 30 bits, ascending in descending weight.
constexpr uint32_t kOneBits = 0x3F800000u;

// Whether every weight lies in [+0, 1] (NaN, -0 and anything above 1 do not), with no early exit.
DET_CPU_CLONES bool weights_in_unit_range(const float* e, int64_t V) {
  uint32_t worst = 0;
  for (int64_t i = 0; i < V; ++i) {
    uint32_t bits;
    memcpy(&bits, &e[i], 4);
    worst = bits > worst ? bits : worst;
  }
  return worst <= kOneBits;
}

// The ids whose weight is at least `least` as (key, id) entries, the key in the high half, in id
// order; returns how many. Every entry is written and only the kept ones counted: a trained model's
// candidates fall unpredictably among the ids, and a branch per id mispredicted on many of them.
DET_CPU_CLONES int64_t collect(const float* e, int64_t V, float least, uint64_t* a) {
  int64_t n = 0;
  for (int64_t i = 0; i < V; ++i) {
    uint32_t bits;
    memcpy(&bits, &e[i], 4);
    a[n] = ((uint64_t)(kOneBits - bits) << 32) | (uint32_t)i;
    n += e[i] >= least;
  }
  return n;
}

// Ranks the ids whose weight (in [+0, 1]) is at least `least` into heap[V-1], heap[V-2], ...;
// returns how many. A stable LSD radix sort of collect's entries by key, three digits of 10 bits,
// all three counted in one pass; a digit that every entry shares moves nothing and is skipped. Ties
// (equal bits: the same weight) stay in id order.
int64_t rank_by_weight(const float* e, int64_t V, float least, int32_t* heap) {
  constexpr int kDigits = 3, kBits = 10, kBins = 1 << kBits;
  thread_local std::vector<uint64_t> a, b;
  a.resize(V);
  b.resize(V);
  const int64_t n = collect(e, V, least, a.data());
  int64_t count[kDigits][kBins] = {};
  for (int64_t i = 0; i < n; ++i)
    for (int d = 0; d < kDigits; ++d) ++count[d][(a[i] >> (32 + kBits * d)) & (kBins - 1)];
  uint64_t* src = a.data();
  uint64_t* dst = b.data();
  for (int d = 0; d < kDigits; ++d) {
    const int shift = 32 + kBits * d;
    int64_t* c = count[d];
    if (n == 0 || c[(src[0] >> shift) & (kBins - 1)] == n) continue;
    for (int64_t j = 0, place = 0; j < kBins; ++j) {
      const int64_t k = c[j];
      c[j] = place;
      place += k;
    }
    for (int64_t i = 0; i < n; ++i) dst[c[(src[i] >> shift) & (kBins - 1)]++] = src[i];
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
  // A NaN weight (T so small that z overflows): the heap's own order, which is not a sort, stays the
  // definition. Every weight of exp(fl(z - m)) is otherwise in [+0, 1].
  if (!weights_in_unit_range(e, V)) return det_sample_keep(e, V, S, p, heap, c_out);
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

// Steps 1 and 2 of det_sample.h, vectorizable: whether every logit is finite (no early exit), then
// z_i = fl(l_i / T) and m = max z, by 16 running maxima side by side. Only which of +-0 becomes m
// can differ from a running max over the ids, and that never matters (docs/SPEC.md §15, step 2).
DET_CPU_CLONES bool all_finite(const float* logits, int64_t V) {
  int bad = 0;
  for (int64_t i = 0; i < V; ++i) bad |= !det_sample_finite(logits[i]);
  return !bad;
}

DET_CPU_CLONES float scale_and_max(const float* logits, int64_t V, const det_sample_params& p, float* z) {
  constexpr int kLanes = 16;
  for (int64_t i = 0; i < V; ++i) z[i] = det_sample_scaled(logits[i], p);
  float lane_max[kLanes];
  for (int j = 0; j < kLanes; ++j) lane_max[j] = -__builtin_inff();
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane_max[j] = z[i + j] > lane_max[j] ? z[i + j] : lane_max[j];
  float m = -__builtin_inff();
  for (; i < V; ++i) m = z[i] > m ? z[i] : m;
  for (int j = 0; j < kLanes; ++j) m = lane_max[j] > m ? lane_max[j] : m;
  return m;
}

}  // namespace

int64_t det_cpu_sample_keep(const float* e, int64_t V, float S, const det_sample_params& p, int32_t* heap,
                            float* c_out) {
  return keep_ranked(e, V, S, p, heap, c_out, 0.0f);
}

int32_t det_cpu_sample_f32(const float* logits, int64_t V, det_sample_params p, int64_t position, float* e,
                           int32_t* heap) {
  if (det_sample_greedy(p) || !all_finite(logits, V)) return (int32_t)det_argmax_f32_ref(logits, V);
  const float m = scale_and_max(logits, V, p, e);
  det_exp_sub(e, m, e, V);  // e_i = det_sample_weight(z_i, m), vectorized (bit-equal; in place)
  float c;
  const int64_t n = keep_ranked(e, V, det_sum_f32(e, V), p, heap, &c, kLeastCandidate);
  return det_sample_draw(e, V, heap, n, c, p, position);
}
