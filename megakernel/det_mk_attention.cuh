// det_mk_attention.cuh: the megakernel's ATTEND step (docs/SPEC.md §13.4, §14.2) in its two
// schedules (geometry attn): ATTN, one warp per (row, query head) walking its chunks in order; and
// split attention, units of (row, KV head, query pair, chunk) over the whole grid (ATTN_CHUNKS,
// det_mk_attn_group.cuh), each pair's last unit of a pass folding the pair's partials in increasing
// chunk order (det_mk_attn_arrive). Both compute each chunk's partial and the left fold exactly as
// the contract writes them; det_mk_forward_tile picks one.
#pragma once

#include "../contract/det_act.h"
#include "../contract/det_attention.h"
#include "../contract/det_norm.h"
#include "det_mk_warp.cuh"

static_assert(DET_ATTN_CHUNK == 128, "det_mk_attn_scratch_floats assumes 128-position chunks");

// The first position a row at position p sees in layer L (its window, or 0).
DET_DEV int64_t det_mk_attn_lo(const det_llama_layer& L, int64_t p) {
  return L.window > 0 && p - L.window + 1 > 0 ? p - L.window + 1 : 0;
}

// One query head's view of one row's attention in layer l: its q slice in the lane's registers (q
// elements 8 lane + 256 h + i, h < DET_MK_HEAD_DIM_MAX / 256, those below D: the lane's runs of the
// score's reduction, §9) and where the cache's keys and values of its KV head start.
struct det_mk_attn_head {
  static constexpr int NH = DET_MK_HEAD_DIM_MAX / (8 * DET_WARP);
  bool lane_q[NH];
  float qv[NH][8];
  const float* kc;  // the head's keys and values (det_kv_head_base): position j's element d at
  const float* vc;  // kc + det_kv_key_at(capacity, D, j, d) and vc + det_kv_value_at(D, j, d)
  int64_t capacity;
  int64_t lo, p;    // the visible positions lo..p
};

DET_DEV det_mk_attn_head det_mk_attn_head_of(const det_mk_ctx& c, int64_t l, int64_t b, int64_t hq) {
  const det_llama_model& m = c.P->model;
  const det_llama_layer& L = m.layers[l];
  const int64_t D = L.head_dim, QD = m.n_heads * D, g = hq / (m.n_heads / m.n_kv_heads);
  const int64_t p = c.tile->pos[b];
  const det_mk_seq& sq = c.P->prog.seqs[c.tile->seq[b]];
  const int lane = det_lane();
  det_mk_attn_head a;
  a.kc = sq.k + det_kv_head_base(L, sq.capacity, g);
  a.vc = sq.v + det_kv_head_base(L, sq.capacity, g);
  a.capacity = sq.capacity;
  a.lo = det_mk_attn_lo(L, p);
  a.p = p;
  for (int h = 0; h < det_mk_attn_head::NH; ++h) {
    a.lane_q[h] = 8 * lane + 8 * DET_WARP * h < D;
    for (int i = 0; i < 8; ++i)
      a.qv[h][i] = a.lane_q[h] ? det_ld(c.P->ws.q + b * QD + hq * D + 8 * DET_WARP * h + 8 * lane + i) : 0.0f;
  }
  return a;
}

// Chunk ch of a row that sees positions lo..p (ch from lo / 128 to p / 128): its first position and
// its visible slot range j0..j1.
struct det_mk_chunk {
  int64_t base, j0, j1;
};
DET_DEV det_mk_chunk det_mk_chunk_of(int64_t lo, int64_t p, int64_t ch) {
  const int64_t base = ch * DET_ATTN_CHUNK;
  return {base, (lo > base ? lo : base) - base, (p < base + DET_ATTN_CHUNK - 1 ? p : base + DET_ATTN_CHUNK - 1) - base};
}

// The chunk's scores (8 slots per tree), the max in slot order, e = exp(s - m) into ex, and the
// canonical sum l with slot j in lane j/8's chain: the chunk's (m, l), on every lane.
DET_DEV det_attn_acc det_mk_attn_chunk_stats(const det_mk_attn_head& a, const det_mk_chunk& k, int64_t stride,
                                             float scale, float* score, float* ex) {
  const int lane = det_lane();
  const int64_t j0 = k.j0, j1 = k.j1;
  for (int64_t jg = j0; jg <= j1; jg += 8) {
    float dot[8];  // the lane's accumulator of q . k for keys jg .. jg + 7
    for (int s = 0; s < 8; ++s) {
      const int64_t p = k.base + jg + s, w = det_kv_panel_width(a.capacity, p);  // element d at kj + d * w
      const float* kj = a.kc + det_kv_key_at(a.capacity, stride, p, 8 * lane);
      dot[s] = 0.0f;
      for (int h = 0; h < det_mk_attn_head::NH; ++h)
        if (a.lane_q[h] && jg + s <= j1) {
          for (int i = 0; i < 8; ++i)
            dot[s] = det_fma_f32(a.qv[h][i], det_ld(kj + (8 * DET_WARP * h + i) * w), dot[s]);
          det_work_fma(8);
        }
    }
    det_mk_warp_tree<8>(dot);
    if (lane == 0)
      for (int s = 0; s < 8 && jg + s <= j1; ++s) score[jg + s] = det_mul_f32(dot[s], scale);
  }
  det_sync_warp();
  float mx = det_ld(score + j0);
  for (int64_t j = j0 + 1; j <= j1; ++j) {
    const float sj = det_ld(score + j);
    mx = sj > mx ? sj : mx;
  }
  for (int64_t j = j0 + lane; j <= j1; j += DET_WARP) ex[j] = det_exp_f32(det_sub_f32(det_ld(score + j), mx));
  det_sync_warp();
  // The chunk's length-128 reductions (§9): lane l (l < 16) takes the visible slots of 8l .. 8l + 7
  // in one chain; lanes 16..31 take none and hold +0.
  float e_sum[1] = {0.0f};  // the lane's accumulator of l = sum_j e_j
  for (int i = 0; i < 8; ++i) {
    const int64_t j = 8 * lane + i;
    if (j >= j0 && j <= j1) e_sum[0] = det_add_f32(e_sum[0], det_ld(ex + j));
  }
  det_mk_warp_tree<1>(e_sum);
  det_shfl_idx_n(e_sum, 1, 0);
  return {mx, e_sum[0]};
}

// The chunk's o_d = sum_j e_j v_j[d] (canonical, slot j in lane j/8's chain) for d < D, eight at a
// time: emit(d, o_d) on lane 0.
template <class Emit>
DET_DEV void det_mk_attn_chunk_values(const det_mk_attn_head& a, const det_mk_chunk& k, int64_t stride, int64_t D,
                                      const float* ex, Emit emit) {
  const int lane = det_lane();
  for (int64_t d0 = 0; d0 < D; d0 += 8) {
    float ev_sum[8] = {};  // the lane's accumulator of o_d, d = d0 .. d0 + 7
    for (int i = 0; i < 8; ++i) {
      const int64_t j = 8 * lane + i;
      if (j < k.j0 || j > k.j1) continue;
      const float* vj = a.vc + det_kv_value_at(stride, k.base + j, d0);
      const float ej = det_ld(ex + j);
      for (int s = 0; s < 8; ++s) ev_sum[s] = det_fma_f32(ej, det_ld(vj + s), ev_sum[s]);
      det_work_fma(8);
    }
    det_mk_warp_tree<8>(ev_sum);
    if (lane == 0)
      for (int s = 0; s < 8; ++s) emit(d0 + s, ev_sum[s]);
  }
}

// The attention scale 1/sqrt(attn_scale_dim), and the warp's scratch in the phase area: with attn
// 0, one chunk's scores and exps, and the running numerator O; split, a unit's (det_mk_attn_unit_new_key),
// then its fold's numerators at the start.
DET_DEV float det_mk_attn_scale(const det_llama_model& m) { return det_rsqrt_f32((float)m.attn_scale_dim); }
DET_DEV float* det_mk_attn_scratch(const det_mk_ctx& c) {
  return c.area + det_warp() * det_mk_attn_scratch_floats(&c.P->model, c.P->geo.attn);
}

// ATTN (geometry attn 0): one warp per (row, query head) walks its chunks in order, merging each
// into the running (M, L, O), then att = O / L.
DET_DEV_NOINLINE void det_mk_phase_attn(const det_mk_ctx& c, int64_t l) {
  const det_llama_model& m = c.P->model;
  const det_mk_workspace& ws = c.P->ws;
  const int64_t D = m.layers[l].head_dim, QD = m.n_heads * D;
  const float scale = det_mk_attn_scale(m);
  float* score = det_mk_attn_scratch(c);
  float* ex = score + DET_ATTN_CHUNK;
  float* O = ex + DET_ATTN_CHUNK;
  for (int64_t task = c.gwarp; task < c.tile->n * m.n_heads; task += c.nwarps) {
    const int64_t b = task / m.n_heads, hq = task % m.n_heads;
    const det_mk_attn_head a = det_mk_attn_head_of(c, l, b, hq);
    det_attn_acc run = {0.0f, 0.0f};
    for (int64_t ch = a.lo / DET_ATTN_CHUNK; ch <= a.p / DET_ATTN_CHUNK; ++ch) {
      const bool first = ch == a.lo / DET_ATTN_CHUNK;
      const det_mk_chunk k = det_mk_chunk_of(a.lo, a.p, ch);
      const det_attn_acc part = det_mk_attn_chunk_stats(a, k, D, scale, score, ex);
      det_attn_weights w = {1.0f, 1.0f};
      if (first) run = part;
      else w = det_attn_merge_stats(&run, part);
      det_mk_attn_chunk_values(a, k, D, D, ex, [&](int64_t d, float o) {
        O[d] = first ? o : det_attn_merge_value(det_ld(O + d), o, w);
      });
      det_sync_warp();
    }
    for (int64_t d = det_lane(); d < D; d += DET_WARP) ws.att[b * QD + hq * D + d] = det_div_f32(det_ld(O + d), run.l);
    det_sync_warp();
  }
}

// Split attention (geometry attn = C > 0). Row b's chunks are numbered from its first visible one;
// pass `pass` covers chunk numbers pass * C .. pass * C + C - 1.
DET_DEV int64_t det_mk_attn_chunks(const det_llama_layer& L, int64_t p) {
  return p / DET_ATTN_CHUNK - det_mk_attn_lo(L, p) / DET_ATTN_CHUNK + 1;
}
DET_DEV int64_t det_mk_attn_most_chunks(const det_mk_ctx& c, int64_t l) {  // the same in every block
  const det_llama_layer& L = c.P->model.layers[l];
  int64_t most = 0;
  for (int b = 0; b < c.tile->n; ++b) {
    const int64_t n = det_mk_attn_chunks(L, c.tile->pos[b]);
    most = n > most ? n : most;
  }
  return most;
}
DET_DEV int64_t det_mk_attn_passes(const det_mk_ctx& c, int64_t l) {
  return (det_mk_attn_most_chunks(c, l) + c.P->geo.attn - 1) / c.P->geo.attn;
}
DET_DEV int64_t det_mk_attn_in_pass(const det_mk_ctx& c, int64_t chunks, int64_t pass) {
  const int64_t per = c.P->geo.attn, left = chunks - pass * per;
  return left <= 0 ? 0 : left < per ? left : per;
}
// Where (row b, query head hq)'s partial of chunk slot k (k < C) lives: (m, l, o[0..D)).
DET_DEV int64_t det_mk_attn_part_stride(const det_llama_model& m) {  // from query head hq's to hq + 1's
  return DET_MK_ATTN_PASS_CHUNKS * (m.head_dim + 2);
}
DET_DEV float* det_mk_attn_part(const det_mk_ctx& c, int64_t b, int64_t hq, int64_t k) {
  const det_llama_model& m = c.P->model;
  return c.P->ws.attn_part + (b * m.n_heads + hq) * det_mk_attn_part_stride(m) + k * (m.head_dim + 2);
}

// The fold of (row b, query heads hq0 .. hq0 + nq - 1: a query pair) in pass `pass`: each head's
// chunk partials into its running (M, L, O) in increasing chunk order (the left fold of SPEC
// §13.4, as ATTN merges), starting from the previous pass's state; on the row's last pass, att =
// O / L. One warp, the pass's last unit of the pair (det_mk_attn_arrive); the heads' chains side by
// side, each O in the warp's scratch (the unit's queries, no longer needed).
DET_DEV_NOINLINE void det_mk_attn_fold(const det_mk_ctx& c, int l, int pass, int b, int hq0, int nq) {
  constexpr int QG = DET_MK_ATTN_GROUP;
  const det_llama_model& m = c.P->model;
  const det_llama_layer& L = m.layers[l];
  const int64_t D = L.head_dim, QD = m.n_heads * D, R = m.head_dim + 2;
  float* O = det_mk_attn_scratch(c);  // head hq0 + q's at O + q D
  const int64_t chunks = det_mk_attn_chunks(L, c.tile->pos[b]), here = det_mk_attn_in_pass(c, chunks, pass);
  const bool more = (int64_t)(pass + 1) * c.P->geo.attn < chunks;  // more passes: keep the state
  float* state = c.P->ws.attn_run + ((int64_t)b * m.n_heads + hq0) * R;  // head hq0 + q's at state + q R
  det_attn_acc run[QG] = {};
  if (pass > 0) {
    DET_UNROLL for (int q = 0; q < QG; ++q)
      if (q < nq) {
        run[q] = {det_ld(state + q * R), det_ld(state + q * R + 1)};
        for (int64_t d = det_lane(); d < D; d += DET_WARP) O[q * D + d] = det_ld(state + q * R + 2 + d);
      }
    det_sync_warp();  // every lane has read (m, l) before lane 0 may write the new ones below
  }
  for (int64_t k = 0; k < here; ++k) {
    const bool first = pass == 0 && k == 0;
    DET_UNROLL for (int q = 0; q < QG; ++q)
      if (q < nq) {
        const float* src = det_mk_attn_part(c, b, hq0 + q, k);
        const det_attn_acc part = {det_ld(src), det_ld(src + 1)};
        det_attn_weights w = {1.0f, 1.0f};
        if (first) run[q] = part;
        else w = det_attn_merge_stats(&run[q], part);
        for (int64_t d = det_lane(); d < D; d += DET_WARP)
          O[q * D + d] = first ? det_ld(src + 2 + d) : det_attn_merge_value(O[q * D + d], det_ld(src + 2 + d), w);
      }
  }
  DET_UNROLL for (int q = 0; q < QG; ++q)
    if (q < nq) {
      if (more) {
        if (det_lane() == 0) state[q * R] = run[q].m, state[q * R + 1] = run[q].l;
        for (int64_t d = det_lane(); d < D; d += DET_WARP) state[q * R + 2 + d] = O[q * D + d];
      } else {
        float* att = c.P->ws.att + b * QD + (hq0 + q) * D;
        for (int64_t d = det_lane(); d < D; d += DET_WARP) att[d] = det_div_f32(O[q * D + d], run[q].l);
      }
    }
  det_sync_warp();
}

// A unit's arrival, once its partials are written (SPEC §14.2): the warp counts itself among the
// pass's units of its row and query pair (the pair's first query head hq0); the last of them folds
// the pair's query heads and sets the count back to zero, which nothing reads again before a grid
// barrier. Which unit comes last is scheduling; what the fold reads, and its order, are not. So
// the fold needs no phase of its own: it waits for exactly the units it reads.
DET_DEV_NOINLINE void det_mk_attn_arrive(const det_mk_ctx& c, int l, int pass, int b, int hq0) {
  const det_llama_model& m = c.P->model;
  const int64_t here = det_mk_attn_in_pass(c, det_mk_attn_chunks(m.layers[l], c.tile->pos[b]), pass);
  unsigned int* count = c.P->ws.attn_count + (int64_t)b * m.n_heads + hq0;
  if ((int64_t)det_warp_arrive(count) != here - 1) return;
  const int G = (int)(m.n_heads / m.n_kv_heads), left = G - hq0 % G;
  det_mk_attn_fold(c, l, pass, b, hq0, left < DET_MK_ATTN_GROUP ? left : DET_MK_ATTN_GROUP);
  if (det_lane() == 0) *count = 0;
}
