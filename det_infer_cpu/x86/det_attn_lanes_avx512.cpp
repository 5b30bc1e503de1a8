// det_attn_lanes_avx512.cpp: one chunk's attention partials (docs/SPEC.md §13.4 steps 1-4) for
// many queries, one query per lane: a prompt's rows of one sequence with the query heads of one
// KV head (16 rows x 3 heads for SmolLM2-135M).
//
// Why: det_attn_chunk_avx512.cpp holds one key per lane, so every fma of its scores broadcasts a
// query element and every fma of its V sums broadcasts a weight, and a 4,000-token prompt spent
// half its time there. Here a vector holds 16 queries: one broadcast key element feeds up to
// three query vectors and two keys share each load of the queries; one broadcast value element
// feeds up to three vectors of weights. Each lane runs exactly the contract's loops for its own
// query: the dot's chains in order and its tree, the max in slot order, the group sums and the
// tree over groups. Only which lane computes what changes; tests hold the bits to the loops.
// Measured 2026-12-05 (Zen 5): one chunk of 48 queries, D = 64, 5.7 -> 3.0 ns per (key, query);
// a 4,000-token SmolLM2-135M prefill on 2 threads 404-435 -> 556-583 tok/s.
#include <string.h>

#include <algorithm>
#include <vector>

#include "det_attn_chunk_avx512.h"
#include "det_transpose_avx512.h"

#define DET_INL inline __attribute__((always_inline)) DET_AVX512

namespace {

constexpr int kChunk = DET_ATTN_CHUNK;
constexpr int kLanes = 16;
constexpr int kGroups = kChunk / DET_REDUCE_RUN;  // slot groups: o's and l's accumulators 0..15
constexpr int kJ = 2;                             // keys per pass of the scores
constexpr int kVecs = 3;                          // query vectors per pass, at most
constexpr int kDv = 8;                            // dimensions of o per pass of the V sums
static_assert(kGroups == 16, "the tree over slot groups below walks 16 leaves");

// Query vectors per pass: the scores' tree keeps up to log2(kLive) + 1 partials of kVecs x kJ
// vectors live, and 32 zmm registers hold them for kLive <= 8 with three query vectors, two above.
constexpr int vecs_per_pass(int kLive) { return kLive <= 8 ? kVecs : 2; }

// One pass: up to kVecs query vectors, their visible slots and their scratch.
struct Pass {
  int nv = 0;      // query vectors
  int u0, u1;      // the slots any of their lanes sees
  const float* qt;  // (nv, D, 16): lane t of vector v holds query 16 v + t
  float* st;        // (nv, kChunk, 16): scores, then the weights e (anything where the lane does not see the slot)
  __mmask16 vis[kVecs][kChunk];  // lane t of vector v sees slot j
  bool full[kGroups];            // every lane sees every slot of group g within u0..u1
};

// Leaf J of the dot's tree, accumulator J's chain (docs/SPEC.md §9): dims k0 + 8J .. k0 + 8J + 7
// of each 256-block in order, fma(q, k, acc) from +0, for kV query vectors and kJ keys (key[jj]'s
// element d at key[jj][16 d], its panel's layout, §13.8). kD: D when known at compile time (the
// loops then unroll to constant offsets), else 0. Each query load serves the kJ keys from a register.
template <int kV, int J, int kD>
DET_INL void leaf(const float* qt, const float* const* key, int64_t D, __m512 (&out)[kV][kJ]) {
  const int64_t Dv = kD ? kD : D;
  for (int v = 0; v < kV; ++v)
    for (int jj = 0; jj < kJ; ++jj) out[v][jj] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 + DET_REDUCE_RUN * J < Dv; k0 += DET_REDUCE_BLOCK)
    for (int i = 0; i < DET_REDUCE_RUN; ++i) {
      const int64_t d = k0 + DET_REDUCE_RUN * J + i;
      __m512 kb[kJ];
      for (int jj = 0; jj < kJ; ++jj) kb[jj] = _mm512_set1_ps(key[jj][d * DET_KV_PANEL]);
      for (int v = 0; v < kV; ++v) {
        __m512 q = _mm512_loadu_ps(qt + (v * Dv + d) * kLanes);
        __asm__("" : "+v"(q));  // one load in a register for the kJ fmas, not a memory operand in each
        for (int jj = 0; jj < kJ; ++jj) out[v][jj] = _mm512_fmadd_ps(q, kb[jj], out[v][jj]);
      }
    }
}

// S(J, H): the halving tree's value at accumulator J after its level H (§9: for s = 16 .. 1,
// acc[j] += acc[j + s]), i.e. leaf J plus the subtrees J + H, added in the loop's order. Leaves
// from kLive on took no term: their additions are skipped (the caller adds +0 once at the end).
// Evaluated depth first, so only the partials on the path to the current leaf are live.
template <int kLive, int kV, int kD, int J, int H>
DET_INL void subtree(const float* qt, const float* const* key, int64_t D, __m512 (&out)[kV][kJ]) {
  if constexpr (H == DET_REDUCE_LANES) {
    leaf<kV, J, kD>(qt, key, D, out);
  } else {
    subtree<kLive, kV, kD, J, 2 * H>(qt, key, D, out);
    if constexpr (J + H < kLive) {
      __m512 r[kV][kJ];
      subtree<kLive, kV, kD, J + H, 2 * H>(qt, key, D, r);
      for (int v = 0; v < kV; ++v)
        for (int jj = 0; jj < kJ; ++jj) out[v][jj] = _mm512_add_ps(out[v][jj], r[v][jj]);
    }
  }
}

// Step 1's scores of every lane for the pass's slots, kJ keys at a time (a last odd key is scored
// beside a copy of itself); kt: the chunk's key panels, each 16 wide (det_attn_wide_panels).
template <int kLive, int kV, int kD>
DET_AVX512 void scores(Pass& p, const float* kt, int64_t D, float scale, det_attn_ahead& ahead) {
  const int n = p.u1 - p.u0 + 1;
  for (int j = p.u0; j <= p.u1; j += kJ) {
    ahead.upto(kDetAheadScores * (j - p.u0 + kJ), 100 * n);
    const float* key[kJ];
    for (int jj = 0; jj < kJ; ++jj) {
      const int s = std::min(j + jj, p.u1);
      key[jj] = kt + s / DET_KV_PANEL * DET_KV_PANEL * D + s % DET_KV_PANEL;
    }
    __m512 r[kV][kJ];
    subtree<kLive, kV, kD, 0, 1>(p.qt, key, D, r);
    for (int v = 0; v < kV; ++v)
      for (int jj = 0; jj < kJ && j + jj <= p.u1; ++jj) {
        __m512 x = r[v][jj];
        if (kLive < DET_REDUCE_LANES) x = _mm512_add_ps(x, _mm512_setzero_ps());  // the skipped +0 additions
        _mm512_storeu_ps(p.st + ((int64_t)v * kChunk + j + jj) * kLanes, _mm512_mul_ps(x, _mm512_set1_ps(scale)));
      }
  }
}

// Steps 1 (the max) to 3 for the pass's vectors: m = the first visible score, then any larger one,
// in slot order; e = exp(fl(s - m)) in place (lanes that do not see a slot hold a value that no
// later step reads); l = the group sums of the e a lane sees and the full tree over 32 accumulators,
// 16..31 being +0 (each e is >= +0 or NaN, so adding +0 changes no bit).
template <int kV>
DET_AVX512 void weights(Pass& p, float* ml) {
  __m512 m[kV];
  __mmask16 started[kV];
  for (int v = 0; v < kV; ++v) m[v] = _mm512_setzero_ps(), started[v] = 0;
  for (int j = p.u0; j <= p.u1; ++j)
    for (int v = 0; v < kV; ++v) {
      const __m512 s = _mm512_loadu_ps(p.st + ((int64_t)v * kChunk + j) * kLanes);
      const __mmask16 vis = p.vis[v][j];
      m[v] = _mm512_mask_mov_ps(m[v], vis & (__mmask16)(~started[v] | _mm512_cmp_ps_mask(s, m[v], _CMP_GT_OQ)), s);
      started[v] |= vis;
    }
  for (int v = 0; v < kV; ++v) {
    float* st = p.st + ((int64_t)v * kChunk + p.u0) * kLanes;
    _mm512_storeu_ps(ml + 2 * v * kLanes, m[v]);
    det_exp_sub_lanes_avx512(st, ml + 2 * v * kLanes, st, (int64_t)(p.u1 - p.u0 + 1) * kLanes);
  }
  __m512 acc[DET_REDUCE_LANES][kV];
  for (int g = 0; g < DET_REDUCE_LANES; ++g)
    for (int v = 0; v < kV; ++v) acc[g][v] = _mm512_setzero_ps();
  for (int j = p.u0; j <= p.u1; ++j)
    for (int v = 0; v < kV; ++v) {
      __m512& a = acc[j / DET_REDUCE_RUN][v];
      a = _mm512_mask_add_ps(a, p.vis[v][j], a, _mm512_loadu_ps(p.st + ((int64_t)v * kChunk + j) * kLanes));
    }
  for (int s = DET_REDUCE_LANES / 2; s >= 1; s /= 2)
    for (int g = 0; g < s; ++g)
      for (int v = 0; v < kV; ++v) acc[g][v] = _mm512_add_ps(acc[g][v], acc[g + s][v]);
  for (int v = 0; v < kV; ++v) _mm512_storeu_ps(ml + (2 * v + 1) * kLanes, acc[0][v]);
}

// acc = slot group a..z's fma chains fma(e_j, v_j[d], acc) for dims d0 .. d0 + kDv. Masked: only
// where the lane sees the slot (an unseen slot's e may be anything); unmasked where every lane
// sees every slot of the group (k registers are few: the masked loop reloads them).
template <int kV, bool kMasked>
DET_INL void chain(const Pass& p, const float* vrows, int64_t D, int64_t d0, int a, int z, __m512 (&acc)[kV][kDv]) {
  for (int j = a; j <= z; ++j) {
    __m512 e[kV];
    for (int v = 0; v < kV; ++v) e[v] = _mm512_loadu_ps(p.st + ((int64_t)v * kChunk + j) * kLanes);
    const float* row = vrows + j * D + d0;
    for (int c = 0; c < kDv; ++c) {
      const __m512 x = _mm512_set1_ps(row[c]);
      for (int v = 0; v < kV; ++v)
        acc[v][c] = kMasked ? _mm512_mask3_fmadd_ps(e[v], x, acc[v][c], p.vis[v][j]) : _mm512_fmadd_ps(e[v], x, acc[v][c]);
    }
  }
}

// Step 4 for the pass: ot[(v D + d) 16 + t] = o_d of lane t of vector v. For kDv dimensions at a
// time, each slot group's chain fma(e_j, v_j[d], acc) from +0 over the slots the lane sees, then
// the tree over the 16 groups, walked depth first (leaves in bit-reversed order, partials on a
// stack) with every group a leaf: a group the lane does not see is +0, and adding it changes at
// most the sign of a zero, which the +0 added at the end restores (§9, signed zeros).
template <int kV>
DET_AVX512 void values(const Pass& p, const float* vrows, int64_t D, float* ot, det_attn_ahead& ahead) {
  constexpr int kOrder[kGroups] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
  __m512 stack[4][kV][kDv];
  for (int64_t d0 = 0; d0 < D; d0 += kDv) {
    ahead.upto(kDetAheadExp * D + (100 - kDetAheadExp) * d0, 100 * D);
    int sp = 0;
    __m512 acc[kV][kDv];
    for (int i = 0; i < kGroups; ++i) {
      const int g = kOrder[i];
      for (int v = 0; v < kV; ++v)
        for (int c = 0; c < kDv; ++c) acc[v][c] = _mm512_setzero_ps();
      const int a = std::max(p.u0, g * DET_REDUCE_RUN), z = std::min(p.u1, g * DET_REDUCE_RUN + DET_REDUCE_RUN - 1);
      if (p.full[g])
        chain<kV, false>(p, vrows, D, d0, a, z, acc);
      else
        chain<kV, true>(p, vrows, D, d0, a, z, acc);
      for (int t = i; t & 1; t >>= 1) {  // close every subtree this leaf completes
        --sp;
        for (int v = 0; v < kV; ++v)
          for (int c = 0; c < kDv; ++c) acc[v][c] = _mm512_add_ps(stack[sp][v][c], acc[v][c]);
      }
      if (i + 1 < kGroups) {
        for (int v = 0; v < kV; ++v)
          for (int c = 0; c < kDv; ++c) stack[sp][v][c] = acc[v][c];
        ++sp;
      }
    }
    for (int v = 0; v < kV; ++v)
      for (int c = 0; c < kDv; ++c)
        _mm512_storeu_ps(ot + ((int64_t)v * D + d0 + c) * kLanes, _mm512_add_ps(acc[v][c], _mm512_setzero_ps()));
  }
}

template <int kLive, int kV>
DET_AVX512 void run_pass(Pass& p, const det_attn_rows& rows, const float* kt, int64_t D, float scale, float* ot,
                         float* ml, det_attn_ahead& ahead) {
  if (D == 8 * kLive && D <= DET_REDUCE_BLOCK)
    scores<kLive, kV, 8 * kLive>(p, kt, D, scale, ahead);
  else
    scores<kLive, kV, 0>(p, kt, D, scale, ahead);
  weights<kV>(p, ml);
  ahead.upto(kDetAheadExp, 100);
  values<kV>(p, rows.v, D, ot, ahead);
}

template <int kLive>
DET_AVX512 void run_pass_of(Pass& p, const det_attn_rows& rows, const float* kt, int64_t D, float scale, float* ot,
                            float* ml, det_attn_ahead& ahead) {
  switch (p.nv) {
    case 1: return run_pass<kLive, 1>(p, rows, kt, D, scale, ot, ml, ahead);
    case 2: return run_pass<kLive, 2>(p, rows, kt, D, scale, ot, ml, ahead);
    default:
      if constexpr (vecs_per_pass(kLive) >= 3) return run_pass<kLive, 3>(p, rows, kt, D, scale, ot, ml, ahead);
  }
}

struct Scratch {
  std::vector<float> qt, st, ot, kt;
};

}  // namespace

DET_AVX512 void det_attn_chunk_lanes_avx512(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs,
                                            int64_t nq, det_attn_ahead& ahead) {
  thread_local Scratch s;
  thread_local Pass p;
  // Accumulators with terms (D % 16 == 0): 2, 4, 6, .. 32; the trees of the cases between the
  // powers of two are the 32-leaf tree with the absent leaves skipped, as in the loops.
  const int live = (int)(std::min<int64_t>(D, DET_REDUCE_BLOCK) / DET_REDUCE_RUN);
  const int64_t nvec = (nq + kLanes - 1) / kLanes, passes = (nvec + vecs_per_pass(live) - 1) / vecs_per_pass(live);
  const int per = (int)((nvec + passes - 1) / passes);  // even passes: 4 vectors as 2 + 2, not 3 + 1
  s.qt.resize(per * D * kLanes);
  s.st.resize(per * kChunk * kLanes);
  s.ot.resize(per * D * kLanes);
  alignas(64) float ml[2 * kVecs * kLanes];
  for (int64_t v0 = 0; v0 < nvec; v0 += per) {
    p.nv = (int)std::min<int64_t>(per, nvec - v0);
    p.u0 = kChunk;
    p.u1 = -1;
    // The pass's queries, transposed 16 x 16 at a time; lanes past nq are 0.
    for (int v = 0; v < p.nv; ++v) {
      const int64_t i0 = (v0 + v) * kLanes;
      int32_t j0[kLanes], j1[kLanes];
      for (int t = 0; t < kLanes; ++t) {
        const bool real = i0 + t < nq;
        // A lane past nq (q = 0, results dropped) sees every slot, so that groups stay full.
        j0[t] = real ? (int32_t)qs[i0 + t].j0 : 0;
        j1[t] = real ? (int32_t)qs[i0 + t].j1 : kChunk - 1;
        if (real) p.u0 = std::min(p.u0, j0[t]), p.u1 = std::max(p.u1, j1[t]);
      }
      for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
        __m512 r[kLanes];
        for (int t = 0; t < kLanes; ++t)
          r[t] = i0 + t < nq ? _mm512_loadu_ps(qs[i0 + t].q + d0) : _mm512_setzero_ps();
        det_transpose16(r);
        for (int c = 0; c < kLanes; ++c) _mm512_storeu_ps(s.qt.data() + ((int64_t)v * D + d0 + c) * kLanes, r[c]);
      }
      const __m512i lo = _mm512_loadu_si512(j0), hi = _mm512_loadu_si512(j1);
      for (int j = 0; j < kChunk; ++j) {
        const __m512i jv = _mm512_set1_epi32(j);
        p.vis[v][j] = _mm512_cmple_epi32_mask(lo, jv) & _mm512_cmple_epi32_mask(jv, hi);
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      p.full[g] = true;
      const int a = std::max(p.u0, g * DET_REDUCE_RUN), z = std::min(p.u1, g * DET_REDUCE_RUN + DET_REDUCE_RUN - 1);
      for (int v = 0; v < p.nv; ++v)
        for (int j = a; j <= z; ++j) p.full[g] = p.full[g] && p.vis[v][j] == 0xffff;
    }
    p.qt = s.qt.data();
    p.st = s.st.data();
    const float* kt = det_attn_wide_panels(rows, D, p.u0, p.u1, s.kt);
    switch (live) {
      case 2: run_pass_of<2>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
      case 4: run_pass_of<4>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
      case 6: run_pass_of<6>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
      case 8: run_pass_of<8>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
      case 16: run_pass_of<16>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
      default: run_pass_of<DET_REDUCE_LANES>(p, rows, kt, D, scale, s.ot.data(), ml, ahead); break;
    }
    for (int v = 0; v < p.nv; ++v) {
      const int64_t i0 = (v0 + v) * kLanes, n = std::min<int64_t>(kLanes, nq - i0);
      for (int t = 0; t < n; ++t) *qs[i0 + t].part = {ml[2 * v * kLanes + t], ml[(2 * v + 1) * kLanes + t]};
      for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
        __m512 r[kLanes];
        for (int c = 0; c < kLanes; ++c) r[c] = _mm512_loadu_ps(s.ot.data() + ((int64_t)v * D + d0 + c) * kLanes);
        det_transpose16(r);
        for (int t = 0; t < n; ++t) _mm512_storeu_ps(qs[i0 + t].o + d0, r[t]);
      }
    }
  }
}
