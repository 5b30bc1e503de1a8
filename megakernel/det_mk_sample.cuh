// det_mk_sample.cuh: a sampled pick by one block (docs/SPEC.md §15, contract/det_sample.h). The
// block computes z, m and e, warp 0 the canonical sum S. Then, when every weight lies in [+0, 1]
// (always, unless the temperature is so small that some z overflows), the block ranks the
// candidates by a stable radix sort, warp 0 walks the ranks with the contract's filters and keeps
// the running sums, and thread 0 finds the draw among them by a binary search. Otherwise thread 0
// runs the contract's heap walk, which defines the order (a NaN weight is not a sort's).
//
// The candidates are the weights of at least 2^-24, half an ulp of 1: rank 0's weight is 1, so
// every later running sum c is at least 1 and a weight below 2^-24 lies below half an ulp of c,
// where the walk ends (det_mk_rank_walk). The ranks the walk can reach are all candidates, and
// they rank in the same order among themselves. A trained model's step has far fewer candidates
// than ids: SmolLM2-135M-Instruct, median 7,228 of 49,152 at temperature 1 and 366 at 0.7.
//
// The ranks are the contract's: weights in [2^-24, 1] compare as their bits do, so an ascending sort
// of key = DET_MK_RANK_E_MAX - bits (28 bits) is e descending, and a stable sort of (key, id) pairs
// that start in id order keeps equal weights in id order. The sort is least significant digit
// first, 7 bits a pass (det_megakernel.h), each pass stable: warp w takes the w-th of det_warps()
// equal chunks of the sequence (pass 0: the ids, the others: the candidates), 32 pairs a step,
// and a pair's place is the count of pairs before it with its digit: in lower (digit, warp) bins (a
// scan of the counts), earlier in its warp's chunk, and at lower lanes of its 32 (a ballot per
// digit bit). Each pass counts the next pass's bins as it places the pairs (integer adds, in any
// order). Places and chunks are 32-bit (V <= 2^30, as det_mk_check_model requires): a 64-bit
// division is a subroutine call on a GPU.
//
// Cost per sampled token (V ids, n candidates, 8 warps): the loops over V (z and the max, e and
// pass 0's counts, warp 0's S) issue DET_MK_SAMPLE_BATCH loads a thread together, so that a load
// round trip serves 4 elements (4 runs of 8 for S); pass 0 reads the V weights, V/256 steps a
// warp, then 3 passes of n/256 steps; a step is one coalesced 8-byte load (4 steps' loads in
// flight together), 8 ballots and a scattered store. Then warp 0's walk, 32 ranks a round and one
// dependent add a rank, until a filter stops it or the weights fall below half an ulp of the sum
// (at most n adds), where the contract's heap took about 750,000 dependent sift levels at 49,152
// ids on one thread.
#pragma once

#include "../contract/det_sample.h"
#include "det_mk_warp.cuh"

#define DET_MK_RANK_E_MAX 0x3F800000u  // the bits of 1.0f, the largest weight
#define DET_MK_RANK_E_MIN 0x33800000u  // the bits of 2^-24, the least candidate
#define DET_MK_SAMPLE_BATCH 4          // loads a thread issues together in the loops over V (and steps of 32 pairs)

DET_DEV uint64_t det_mk_rank_pair(float e, int64_t id) {
  return (uint64_t)(DET_MK_RANK_E_MAX - det_f32_bits(e)) << 32 | (uint32_t)id;
}
DET_DEV float det_mk_rank_weight(uint64_t pair) { return det_bits_f32(DET_MK_RANK_E_MAX - (uint32_t)(pair >> 32)); }
DET_DEV int det_mk_rank_digit(uint64_t pair, int pass) {
  return (int)(pair >> (32 + DET_MK_RANK_BITS * pass)) & (DET_MK_RANK_BINS - 1);
}
// Whether a weight in [+0, 1] is a candidate.
DET_DEV bool det_mk_rank_candidate(float e) { return det_f32_bits(e) >= DET_MK_RANK_E_MIN; }
DET_DEV int64_t det_mk_rank_chunk(int64_t n) { return (n + det_warps() - 1) / det_warps(); }

// The canonical sum (§9, sum form) of x[0..K) on one warp, returned on every lane. A lane loads the
// runs of DET_MK_SAMPLE_BATCH blocks before it adds them in order, so that its loads are in flight
// together rather than one block's after the last's adds.
DET_DEV float det_mk_warp_sum_f32(const float* x, int64_t K) {
  constexpr int B = DET_MK_SAMPLE_BATCH;
  float acc[1] = {0.0f};
  for (int64_t k0 = DET_REDUCE_RUN * det_lane(); k0 < K; k0 += B * DET_REDUCE_BLOCK) {
    float v[B * DET_REDUCE_RUN];
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) {
        const int64_t k = k0 + b * DET_REDUCE_BLOCK + i;
        v[b * DET_REDUCE_RUN + i] = k < K ? x[k] : 0.0f;
      }
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < DET_REDUCE_RUN && k0 + b * DET_REDUCE_BLOCK + i < K; ++i)
        acc[0] = det_add_f32(acc[0], v[b * DET_REDUCE_RUN + i]);
  }
  det_mk_warp_tree<1>(acc);
  det_shfl_idx_n(acc, 1, 0);
  return acc[0];
}

// Every thread of the block: f(i, x[i]) for its elements i = thread, thread + threads, ... of [0, n),
// DET_MK_SAMPLE_BATCH of them loaded before f sees any (one load round trip for the batch; f may
// store to x[i] itself).
template <typename F>
DET_DEV void det_mk_each_batched(const float* x, int64_t n, F f) {
  const int64_t T = det_threads();
  for (int64_t i0 = det_thread(); i0 < n; i0 += DET_MK_SAMPLE_BATCH * T) {
    float v[DET_MK_SAMPLE_BATCH];
    for (int u = 0; u < DET_MK_SAMPLE_BATCH; ++u) v[u] = i0 + u * T < n ? x[i0 + u * T] : 0.0f;
    for (int u = 0; u < DET_MK_SAMPLE_BATCH && i0 + u * T < n; ++u) f(i0 + u * T, v[u]);
  }
}

// On one warp: count[0..n) (n a multiple of 32) becomes its exclusive prefix sums; returns the
// total on every lane.
DET_DEV int det_mk_rank_scan(int* count, int n) {
  const int lane = det_lane(), per = n / DET_WARP, lo = lane * per;
  int sum = 0;
  for (int i = 0; i < per; ++i) sum += count[lo + i];
  int below = sum;  // inclusive over lanes 0..lane, by doubling steps
  for (int d = 1; d < DET_WARP; d *= 2) {
    int v = below;
    det_shfl_idx_n(&v, 1, lane >= d ? lane - d : lane);
    if (lane >= d) below += v;
  }
  int run = below - sum;
  for (int i = 0; i < per; ++i) {
    const int n_i = count[lo + i];
    count[lo + i] = run;
    run += n_i;
  }
  int total = below;
  det_shfl_idx_n(&total, 1, DET_WARP - 1);
  return total;
}

// One pass over n pairs in chunks of `chunk`: the pairs (pass 0: the candidates among e[0..n), made
// in id order; later passes: src[0..n)) placed stably by their digit into dst, with place[bin *
// warps + warp] the first free place of each (digit, warp) bin. Counts the next pass's bins, whose
// chunks are of next_chunk pairs, into next (null on the last pass).
DET_DEV void det_mk_rank_pass(const float* e, const uint64_t* src, uint64_t* dst, int64_t n, int64_t chunk,
                              int pass, int* place, int* next, int64_t next_chunk) {
  const int nw = det_warps(), w = det_warp(), lane = det_lane();
  const int64_t hi = (w + 1) * chunk < n ? (w + 1) * chunk : n;
  const uint32_t lower = (1u << lane) - 1u;
  for (int64_t base = w * chunk; base < hi; base += DET_MK_SAMPLE_BATCH * DET_WARP) {
    uint64_t pairs[DET_MK_SAMPLE_BATCH];
    bool lives[DET_MK_SAMPLE_BATCH];
    for (int u = 0; u < DET_MK_SAMPLE_BATCH; ++u) {  // every step's load in flight before the first placing
      const int64_t i = base + u * DET_WARP + lane;
      lives[u] = i < hi;
      pairs[u] = 0;
      if (lives[u] && pass == 0) {
        const float v = e[i];
        lives[u] = det_mk_rank_candidate(v);
        pairs[u] = det_mk_rank_pair(v, i);
      } else if (lives[u]) {
        pairs[u] = src[i];
      }
    }
    for (int u = 0; u < DET_MK_SAMPLE_BATCH; ++u) {
      const uint64_t pair = pairs[u];
      const bool live = lives[u];
      const int d = det_mk_rank_digit(pair, pass);
      uint32_t same = det_ballot(live);  // the live lanes with this lane's digit
      for (int b = 0; b < DET_MK_RANK_BITS; ++b) {
        const uint32_t on = det_ballot((d >> b) & 1);
        same &= (d >> b) & 1 ? on : ~on;
      }
      int* bin = place + d * nw + w;
      const int first = live ? *bin : 0;
      det_sync_warp();  // every lane has read its bin before the lowest lane of each digit moves it
      if (live) {
        const int64_t k = first + det_popc(same & lower);
        dst[k] = pair;
        if (next)
          det_atomic_add_shared(next + det_mk_rank_digit(pair, pass + 1) * nw + (uint32_t)k / (uint32_t)next_chunk, 1);
        if ((same & lower) == 0) *bin = first + det_popc(same);
      }
      det_sync_warp();
    }
  }
}

// The ranking of the candidates among e[0..V) (every weight in [+0, 1]) into a (rank order), b the
// other buffer; count holds the two tables, the first already counted for pass 0 (det_mk_sample).
// Returns the number of candidates (kept in *n_kept, a word of the block's shared area).
DET_DEV int64_t det_mk_rank(const float* e, int64_t V, uint64_t* a, uint64_t* b, int* count, int* n_kept) {
  const int bins = DET_MK_RANK_BINS * det_warps();
  for (int pass = 0; pass < DET_MK_RANK_PASSES; ++pass) {
    int* place = count + (pass & 1) * bins;
    int* next = pass + 1 < DET_MK_RANK_PASSES ? count + ((pass + 1) & 1) * bins : nullptr;
    det_sync_block();  // the pass's counts are complete (and the last pass's pairs written)
    if (det_warp() == 0) {
      const int total = det_mk_rank_scan(place, bins);
      if (pass == 0 && det_lane() == 0) *n_kept = total;
    }
    for (int i = det_thread(); next && i < bins; i += det_threads()) next[i] = 0;
    det_sync_block();
    const int64_t n = pass == 0 ? V : *n_kept, kept_chunk = det_mk_rank_chunk(*n_kept);
    uint64_t* dst = (DET_MK_RANK_PASSES - 1 - pass) % 2 == 0 ? a : b;  // the last pass writes a
    det_mk_rank_pass(e, dst == a ? b : a, dst, n, pass == 0 ? det_mk_rank_chunk(V) : kept_chunk, pass, place, next,
                     kept_chunk);
  }
  det_sync_block();
  return *n_kept;
}

// Half the spacing of floats at c (c >= 1, so normal): adding a weight below it leaves c as it is.
DET_DEV float det_mk_half_ulp(float c) { return det_bits_f32((det_f32_bits(c) & 0x7F800000u) - (24u << 23)); }

// What the walk found: n ranks kept, c their sum, run[j] the running sum after rank j (j < n).
struct det_mk_walk {
  int64_t n;
  float c;
};

// On warp 0, the contract's walk (det_sample_keep's rules) over the n ranked candidates, 32 ranks a
// round. Every lane adds the round's 32 weights in rank order (from w32, 16-byte aligned: one
// dependent add a rank, nothing else on that chain), so lane k holds the running sum after the
// round's k-th rank and, from lane k - 1, the sum before it. Then each lane tests its own rank as
// the walk would reach it (every earlier rank kept): refused by min_p, or below half an ulp of the
// sum before it (from there no add changes the sum: weights never rise in rank order, and the draw
// never reaches those ranks, det_mk_rank_draw), so the walk ends before it; top_k or top_p reached,
// so it ends after it. The first such rank by ballot ends the walk where the rank-by-rank walk
// would; the sums past it are never read. Past the n candidates every weight lies below half an
// ulp of the sum (their end is a stop too). Each running sum is stored at once, to run.
DET_DEV det_mk_walk det_mk_rank_walk(const uint64_t* ranked, int64_t n, float S, const det_sample_params& params,
                                     float* run, float* w32) {
  const det_sample_params p = params;  // in registers: the stores below might alias the caller's copy
  const int lane = det_lane();
  const float target = det_sample_target(S, p);
  det_mk_walk w = {0, 0.0f};
  for (int64_t base = 0; base < n; base += DET_WARP) {
    const int64_t j = base + lane;
    const float v = j < n ? det_mk_rank_weight(ranked[j]) : 0.0f;
    det_sync_warp();  // every lane is done with the last 32
    w32[lane] = v;
    det_sync_warp();
    float c = w.c, mine = 0.0f;
    for (int k = 0; k < DET_WARP; k += 4) {  // four weights a shared load, added one at a time
      const det_vec_f32x4 q = det_load_f32x4(w32 + k);
      c = det_add_f32(c, q.x), mine = lane == k ? c : mine;
      c = det_add_f32(c, q.y), mine = lane == k + 1 ? c : mine;
      c = det_add_f32(c, q.z), mine = lane == k + 2 ? c : mine;
      c = det_add_f32(c, q.w), mine = lane == k + 3 ? c : mine;
    }
    float before = mine;
    det_shfl_idx_n(&before, 1, lane > 0 ? lane - 1 : 0);
    if (lane == 0) before = w.c;
    const int64_t kept_before = w.n + lane;  // ranks kept before this one if the walk reaches it
    const bool end_before = j >= n || det_sample_refused(v, kept_before, p) ||
                            (kept_before >= 1 && v < det_mk_half_ulp(before));
    const bool end_after = det_sample_full(kept_before + 1, mine, target, p);
    const uint32_t eb = det_ballot(end_before), ea = det_ballot(end_after);
    const int first_eb = eb ? det_popc((eb & (0u - eb)) - 1u) : DET_WARP;  // the lowest lane set
    const int first_ea = ea ? det_popc((ea & (0u - ea)) - 1u) : DET_WARP;
    const int kept = first_eb <= first_ea ? first_eb : first_ea + 1;  // ranks of this round kept
    if (j < n) run[j] = mine;
    float last = mine;
    det_shfl_idx_n(&last, 1, kept > 0 ? kept - 1 : 0);
    if (kept > 0) w.c = last;
    w.n += kept;
    if (eb | ea) break;
  }
  return w;
}

// The draw (det_sample_draw) over the running sums: the first kept rank whose sum exceeds r =
// fl(u c), by a binary search (the sums never fall: adds of weights >= +0). One always does: u <=
// 1 - 2^-24 makes r < c (c >= 1, and c 2^-24 is at least half an ulp of c, a tie only at a power of
// two, where the float below is exact), and c is the last sum. So the contract's "else the last
// kept token" never happens, and neither do the ranks of a walk that ended early.
DET_DEV int32_t det_mk_rank_draw(const uint64_t* ranked, const float* run, const det_mk_walk& w,
                                 const det_sample_params& p, int64_t position) {
  const float r = det_mul_f32(det_sample_uniform(p.seed, position), w.c);
  int64_t lo = 0, hi = w.n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (run[mid] > r) hi = mid;
    else lo = mid + 1;
  }
  return (int32_t)(uint32_t)ranked[lo < w.n ? lo : w.n - 1];
}

// A sampled pick by the block: the elementwise steps and the max over the block's threads, the
// canonical sum on warp 0, the ranks (above) and the draw. Returns false (nothing written) when a
// logit is not finite: the caller then takes the argmax, as the contract says.
DET_DEV_NOINLINE bool det_mk_sample(const det_mk_ctx& c, const float* lg, const det_sample_params& sp,
                                    int64_t position, int j, int s) {
  const int64_t V = c.P->model.vocab;
  float* e = c.P->ws.sample_e + j * V;
  uint64_t* ranked = c.P->ws.sample_rank + 2 * j * V;
  uint64_t* other = ranked + V;
  const int nw = det_warps();
  // The area (det_mk_sample_area_floats): per-warp maxima, then [nw]: m, [nw + 1]: S, [nw + 2]: a
  // logit not finite, [nw + 3]: a weight outside [+0, 1], [nw + 4]: the count of candidates (an
  // int); from the next multiple of 4, 32 weights of the walk; the count tables.
  float* part = det_mk_area_of(c.P->geo);  // from the shared base: shared loads, stores and adds
  float* w32 = part + det_mk_sample_w32_offset(nw);  // 16-byte aligned
  int* count = (int*)(w32 + DET_WARP);
  const int64_t chunk = det_mk_rank_chunk(V);
  if (det_thread() == 0) part[nw + 2] = 0.0f, part[nw + 3] = 0.0f;
  for (int i = det_thread(); i < DET_MK_RANK_BINS * nw; i += det_threads()) count[i] = 0;
  det_sync_block();
  float mx = det_sample_scaled(lg[0], sp);
  det_mk_each_batched(lg, V, [&](int64_t i, float l) {
    if (!det_sample_finite(l)) part[nw + 2] = 1.0f;  // any thread may raise it
    const float z = det_sample_scaled(l, sp);
    e[i] = z;
    mx = z > mx ? z : mx;
  });
  det_shfl_down_combine_n(&mx, 1, 16, [](float a, float b) { return b > a ? b : a; });
  det_shfl_down_combine_n(&mx, 1, 8, [](float a, float b) { return b > a ? b : a; });
  det_shfl_down_combine_n(&mx, 1, 4, [](float a, float b) { return b > a ? b : a; });
  det_shfl_down_combine_n(&mx, 1, 2, [](float a, float b) { return b > a ? b : a; });
  det_shfl_down_combine_n(&mx, 1, 1, [](float a, float b) { return b > a ? b : a; });
  if (det_lane() == 0) part[det_warp()] = mx;
  det_sync_block();
  if (part[nw + 2] != 0.0f) {
    det_sync_block();  // everyone has read the flag before the area is reused
    return false;
  }
  if (det_thread() == 0) {
    for (int w = 1; w < nw; ++w) mx = part[w] > mx ? part[w] : mx;
    part[nw] = mx;
  }
  det_sync_block();
  const float m = part[nw];
  det_mk_each_batched(e, V, [&](int64_t i, float z) {
    const float v = det_sample_weight(z, m);
    e[i] = v;
    if (det_f32_bits(v) > DET_MK_RANK_E_MAX) part[nw + 3] = 1.0f;  // NaN (z overflowed): the heap's order
    else if (det_mk_rank_candidate(v))
      det_atomic_add_shared(count + det_mk_rank_digit(det_mk_rank_pair(v, i), 0) * nw + (uint32_t)i / (uint32_t)chunk, 1);
  });
  det_sync_block();
  if (det_warp() == 0) {
    const float S = det_mk_warp_sum_f32(e, V);
    if (det_lane() == 0) part[nw + 1] = S;
  }
  det_sync_block();
  const float S = part[nw + 1];
  if (part[nw + 3] != 0.0f) {
    if (det_thread() == 0) c.P->ws.next_token[s] = det_sample_walk(e, V, S, sp, position, (int32_t*)ranked);
  } else {
    const int64_t n = det_mk_rank(e, V, ranked, other, count, (int*)(part + nw + 4));
    if (det_warp() == 0) {
      float* run = (float*)other;
      const det_mk_walk w = det_mk_rank_walk(ranked, n, S, sp, run, w32);
      det_sync_warp();
      if (det_lane() == 0) c.P->ws.next_token[s] = det_mk_rank_draw(ranked, run, w, sp, position);
    }
  }
  det_sync_block();
  return true;
}
