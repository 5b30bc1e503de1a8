// det_attn_chunk_avx2.cpp: one chunk's attention partials (docs/SPEC.md §13.4 steps 1-4) for
// several queries that share its keys and values, with AVX2 + FMA: det_attn_chunk_avx512.cpp's
// key-per-lane schedule at eight keys a vector (half of a cache panel, §13.8). Without it a CPU
// with no AVX-512 ran the contract's loops one query at a time, each copying the chunk's keys out
// of their panels: on an AVX2-only Zen 5 VM (2026-12-07) a 4,000-token prompt took 44.5 s against
// 7.4 s with AVX-512, and decode at 4,000 positions 44.6 ms a token against 15.8.
//  - scores: accumulator l of a key takes dims 8l .. 8l + 7 (and 256 + 8l .. when D > 256) in
//    order, an fma with q's element broadcast, then the tree: det_attn_scores' arithmetic lane for
//    lane, straight from the panels; three queries share each load of a panel;
//  - the max by vectors (the same value up to a zero's sign), the exps and l as the loops give them;
//  - o's accumulators in registers: a slot group (8 slots) is an fma chain per dimension, 32
//    dimensions of up to kQ queries at a time, each V row read once for all of them.
// Only the order of independent work changes; every value is computed by the same operations in
// the same order as the reference (det_attn_cpu.cpp's chunk_partial), which tests hold it to.
#include <immintrin.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../det_kernels_cpu.h"
#include "det_attn_ahead.h"

#define DET_AVX2 __attribute__((target("avx2,fma")))

namespace {

constexpr int kChunk = DET_ATTN_CHUNK;
constexpr int kKeys = 8;                          // keys per vector: half a panel
constexpr int kGroups = kChunk / DET_REDUCE_RUN;  // slot groups: accumulators 0..15 of o and l
constexpr int kQ = 2;                             // queries sharing one pass over V
constexpr int kDBlock = 32;                       // dimensions of o in registers per pass

// score[0..8) of kN queries for the 8 keys of half `half` of one panel (kt): kLive accumulators
// per query take terms; the queries share each load of the panel. 16 ymm registers: 4 accumulators
// a query in flight, 12 for three queries.
template <int kLive, int kN>
DET_AVX2 void block_scores(const float* const* q, const float* kt, int half, int64_t D, float scale,
                           float* const* score) {
  constexpr int kBatch = kLive < 4 ? kLive : 4;
  __m256 acc[kN][kLive];
  for (int l0 = 0; l0 < kLive; l0 += kBatch) {
    __m256 a[kN][kBatch];
    for (int n = 0; n < kN; ++n)
      for (int l = 0; l < kBatch; ++l) a[n][l] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 + DET_REDUCE_RUN * l0 < D; k0 += DET_REDUCE_BLOCK) {
      // The batch's accumulators with terms in this block (all but in a last partial block); D % 8
      // == 0, so each of those takes its whole run of 8.
      const int64_t live = std::min<int64_t>(kBatch, (D - k0) / DET_REDUCE_RUN - l0);
      const float* kb = kt + (k0 + DET_REDUCE_RUN * l0) * DET_KV_PANEL + kKeys * half;
      const int64_t qo = k0 + DET_REDUCE_RUN * l0;
      for (int i = 0; i < DET_REDUCE_RUN; ++i)
        for (int l = 0; l < kBatch; ++l) {
          if (live < kBatch && l >= live) break;
          const __m256 key = _mm256_loadu_ps(kb + (DET_REDUCE_RUN * l + i) * DET_KV_PANEL);
          for (int n = 0; n < kN; ++n)
            a[n][l] = _mm256_fmadd_ps(_mm256_set1_ps(q[n][qo + DET_REDUCE_RUN * l + i]), key, a[n][l]);
        }
    }
    for (int n = 0; n < kN; ++n)
      for (int l = 0; l < kBatch; ++l) acc[n][l0 + l] = a[n][l];
  }
  for (int n = 0; n < kN; ++n) {
    for (int h = DET_REDUCE_LANES / 2; h >= 1; h /= 2)
      for (int j = 0; j < h; ++j)
        if (j + h < kLive) acc[n][j] = _mm256_add_ps(acc[n][j], acc[n][j + h]);
    __m256 v = acc[n][0];
    if (kLive < DET_REDUCE_LANES) v = _mm256_add_ps(v, _mm256_setzero_ps());  // the skipped +0 additions
    _mm256_storeu_ps(score[n], _mm256_mul_ps(v, _mm256_set1_ps(scale)));
  }
}

// Every query's scores over the 8-key halves of panels it sees, half by half (each once from L2).
// Head sizes between the cases run the 32-accumulator loop: the extra accumulators take no term
// and stay +0, and the full tree adds them, as the contract's own loop does.
template <int kLive>
DET_AVX2 void scores(const det_attn_query* qs, int64_t nq, const float* kt, int64_t D, int u0, int u1, float scale,
                     float* score, det_attn_ahead& ahead) {
  constexpr int kN = 3;  // queries per pass over a panel half (12 accumulators in flight; 1 or 2: slower)
  const int first = u0 / kKeys * kKeys, blocks = u1 / kKeys - u0 / kKeys + 1;
  for (int b = first; b <= u1; b += kKeys) {
    ahead.upto(kDetAheadScores * ((b - first) / kKeys + 1), 100 * blocks);
    const float* panel = kt + b / DET_KV_PANEL * DET_KV_PANEL * D;
    const int half = b % DET_KV_PANEL / kKeys;
    const float* qv[kN];
    float* out[kN];
    int n = 0;
    for (int64_t i = 0; i < nq; ++i) {
      if (qs[i].j0 >= b + kKeys || qs[i].j1 < b) continue;
      qv[n] = qs[i].q;
      out[n] = score + i * kChunk + b;
      if (++n == kN) {
        block_scores<kLive, kN>(qv, panel, half, D, scale, out);
        n = 0;
      }
    }
    for (int i = 0; i < n; ++i) block_scores<kLive, 1>(qv + i, panel, half, D, scale, out + i);
  }
}

DET_AVX2 void scores_of(const det_attn_query* qs, int64_t nq, const float* kt, int64_t D, int u0, int u1, float scale,
                        float* score, det_attn_ahead& ahead) {
  switch (std::min<int64_t>(D, DET_REDUCE_BLOCK) / DET_REDUCE_RUN) {
    case 1: return scores<1>(qs, nq, kt, D, u0, u1, scale, score, ahead);
    case 2: return scores<2>(qs, nq, kt, D, u0, u1, scale, score, ahead);
    case 4: return scores<4>(qs, nq, kt, D, u0, u1, scale, score, ahead);
    case 8: return scores<8>(qs, nq, kt, D, u0, u1, scale, score, ahead);
    case 16: return scores<16>(qs, nq, kt, D, u0, u1, scale, score, ahead);
    default: return scores<DET_REDUCE_LANES>(qs, nq, kt, D, u0, u1, scale, score, ahead);
  }
}

// The max of score[j0..j1]: the first, then any larger one, in slot order (§13.4 step 1). Without
// a NaN the vector max is the same value up to the sign of a zero, which never matters (§13.4). (The
// loop in slot order kept m in memory inside the kernel: a store-to-load chain a slot, 29% of a
// prompt chunk's time.)
DET_AVX2 float max_of(const float* score, int j0, int j1) {
  const __m256 first = _mm256_set1_ps(score[j0]);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lo = _mm256_set1_epi32(j0 - 1), hi = _mm256_set1_epi32(j1 + 1);
  __m256 m = first, nan = _mm256_setzero_ps();
  for (int b = j0 / kKeys * kKeys; b <= j1; b += kKeys) {
    const __m256i j = _mm256_add_epi32(lane, _mm256_set1_epi32(b));
    const __m256i live = _mm256_and_si256(_mm256_cmpgt_epi32(j, lo), _mm256_cmpgt_epi32(hi, j));
    const __m256 x = _mm256_blendv_ps(first, _mm256_loadu_ps(score + b), _mm256_castsi256_ps(live));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, x);
  }
  if (!_mm256_movemask_ps(nan)) {
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
    return _mm256_cvtss_f32(m);
  }
  float r = score[j0];
  for (int j = j0 + 1; j <= j1; ++j) r = score[j] > r ? score[j] : r;
  return r;
}

// l (§13.4 step 3): accumulator g adds the e of slots 8g .. 8g + 7 in order; ex is 0 outside the
// visible slots (+0 added to a sum of non-negative terms or NaN changes no bit).
DET_AVX2 float sum_of(const float* ex) {
  float lanes[DET_REDUCE_LANES] = {};
  for (int g = 0; g < kGroups; ++g)
    for (int i = 0; i < DET_REDUCE_RUN; ++i) lanes[g] = det_add_f32(lanes[g], ex[g * DET_REDUCE_RUN + i]);
  return det_reduce_tree_f32(lanes);
}

struct Query {
  int j0, j1;
  const float* ex;  // kChunk floats, 0 outside j0..j1
  float* group_o;   // (kGroups, D)
};

// group_o[g] = the fma chain over group g's visible slots (§13.4 step 4), for n <= kQ queries,
// kDBlock dimensions at a time; a group a query does not see is left alone.
template <int kVec>
DET_AVX2 void values(const float* v, int64_t D, int64_t d0, const Query* qs, int n, det_attn_ahead* ahead) {
  for (int g = 0; g < kGroups; ++g) {
    if (ahead) ahead->upto(kDetAheadExp * kGroups + (100 - kDetAheadExp) * g, 100 * kGroups);
    const int s0 = g * DET_REDUCE_RUN, s1 = s0 + DET_REDUCE_RUN - 1;
    int a = s1 + 1, z = s0 - 1;
    for (int i = 0; i < n; ++i) a = std::min(a, std::max(s0, qs[i].j0)), z = std::max(z, std::min(s1, qs[i].j1));
    if (a > z) continue;
    __m256 acc[kQ][kVec];
    for (int i = 0; i < kQ; ++i)
      for (int c = 0; c < kVec; ++c) acc[i][c] = _mm256_setzero_ps();
    for (int j = a; j <= z; ++j) {
      __m256 row[kVec];
      for (int c = 0; c < kVec; ++c) row[c] = _mm256_loadu_ps(v + j * D + d0 + 8 * c);
      for (int i = 0; i < kQ; ++i) {
        if (i >= n || j < qs[i].j0 || j > qs[i].j1) continue;
        const __m256 e = _mm256_set1_ps(qs[i].ex[j]);
        for (int c = 0; c < kVec; ++c) acc[i][c] = _mm256_fmadd_ps(e, row[c], acc[i][c]);
      }
    }
    for (int i = 0; i < n; ++i) {
      if (std::max(s0, qs[i].j0) > std::min(s1, qs[i].j1)) continue;
      for (int c = 0; c < kVec; ++c) _mm256_storeu_ps(qs[i].group_o + g * D + d0 + 8 * c, acc[i][c]);
    }
  }
}

struct Scratch {
  std::vector<float> kt, score, ex, group_o;
};

}  // namespace

DET_AVX2 void det_attn_chunk_avx2(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs, int64_t nq,
                                  det_attn_rows next) {
  thread_local Scratch s;
  int u0 = kChunk, u1 = -1;
  for (int64_t i = 0; i < nq; ++i) u0 = std::min<int>(u0, (int)qs[i].j0), u1 = std::max<int>(u1, (int)qs[i].j1);
  if (u0 > u1) return;
  det_attn_ahead ahead(next, D);
  s.score.resize(nq * kChunk);
  s.ex.resize(nq * kChunk);
  s.group_o.resize(kQ * kGroups * D);
  scores_of(qs, nq, det_attn_wide_panels(rows, D, u0, u1, s.kt), D, u0, u1, scale, s.score.data(), ahead);
  for (int64_t i = 0; i < nq; ++i) {
    ahead.upto(kDetAheadScores * nq + (kDetAheadExp - kDetAheadScores) * i, 100 * nq);
    const int j0 = (int)qs[i].j0, j1 = (int)qs[i].j1;
    const float* score = s.score.data() + i * kChunk;
    float* ex = s.ex.data() + i * kChunk;
    const float m = max_of(score, j0, j1);
    memset(ex, 0, kChunk * sizeof(float));
    det_exp_sub_avx2(score + j0, m, ex + j0, j1 - j0 + 1);
    *qs[i].part = {m, sum_of(ex)};
  }
  for (int64_t q0 = 0; q0 < nq; q0 += kQ) {
    const int n = (int)std::min<int64_t>(kQ, nq - q0);
    Query batch[kQ];
    for (int i = 0; i < n; ++i)
      batch[i] = {(int)qs[q0 + i].j0, (int)qs[q0 + i].j1, s.ex.data() + (q0 + i) * kChunk,
                  s.group_o.data() + i * kGroups * D};
    det_attn_ahead* paced = q0 == 0 && D <= kDBlock ? &ahead : nullptr;  // V's one pass when there is one
    for (int64_t d0 = 0; d0 < D; d0 += kDBlock) {
      switch (std::min<int64_t>(kDBlock, D - d0) / 8) {
        case 1: values<1>(rows.v, D, d0, batch, n, paced); break;
        case 2: values<2>(rows.v, D, d0, batch, n, paced); break;
        case 3: values<3>(rows.v, D, d0, batch, n, paced); break;
        default: values<4>(rows.v, D, d0, batch, n, paced); break;
      }
    }
    ahead.upto(1, 1);
    for (int i = 0; i < n; ++i) {
      det_attn_group_tree(batch[i].group_o, D, batch[i].j0, batch[i].j1);
      memcpy(qs[q0 + i].o, batch[i].group_o, D * sizeof(float));
    }
  }
}
