// det_mk_attn_group.cuh: split attention's unit (geometry attn > 0; docs/SPEC.md §13.4, §14.2):
// one 128-position chunk of one row for a group of query heads that share a KV head, so that the
// group reads the chunk's keys and values once.
//
// Scores by key: lane L holds the chunk's slots 4L .. 4L + 3, which lie in one key panel (§13.8),
// so element d of its four keys is one 16-byte load and the warp's load of element d reads eight
// panels' 64-byte runs. Each lane computes its keys' whole dots (the §9 tree over the accumulators
// in registers, no shuffles), their max, and their exps. Values by dimension: lane L holds o_d for
// d = 64t + 2L and 64t + 2L + 1, each §13.4's reduction over the slots in its registers; the exps
// come from shared memory. Only the max (whose order does not matter, see det_mk_max_skip_nan)
// and l (the old warp tree) cross lanes.
#pragma once

#include "../contract/det_trig.h"
#include "det_mk_attention.cuh"

// A value per (query of the group, one of the lane's keys or dimensions).
template <int QG, int N>
struct det_mk_attn_vals {
  float v[QG][N];
};
template <int QG, int N>
DET_DEV det_mk_attn_vals<QG, N> det_mk_attn_vals_add(const det_mk_attn_vals<QG, N>& a, const det_mk_attn_vals<QG, N>& b) {
  det_mk_attn_vals<QG, N> r;
  for (int q = 0; q < QG; ++q)
    for (int i = 0; i < N; ++i) r.v[q][i] = det_add_f32(a.v[q][i], b.v[q][i]);
  return r;
}

// §9's halving tree over N accumulators (for s = N/2 .. 1: acc[j] += acc[j + s]) as a pairwise
// sum from the left: the leaves in bit-reversed order (acc[j] meets acc[j + N/2] first), two equal
// subtrees added as soon as both exist, left + right. A stack of log2(N) partial sums stays in
// registers (its indices are constants), and the leaf's code is one copy (a loop not unrolled).
template <int N, class Leaf>
DET_DEV auto det_mk_tree(Leaf leaf) {
  constexpr int LOG = N <= 1 ? 0 : N <= 2 ? 1 : N <= 4 ? 2 : N <= 8 ? 3 : N <= 16 ? 4 : 5;
  static_assert(N == 1 << LOG, "a tree over a power of two <= 32 leaves");
  decltype(leaf(0)) x = {}, stack[LOG > 0 ? LOG : 1] = {};
  DET_NO_UNROLL
  for (int i = 0; i < N; ++i) {
    int a = 0;  // leaf number: i's LOG bits reversed
    for (int k = 0; k < LOG; ++k) a |= (i >> k & 1) << (LOG - 1 - k);
    x = leaf(a);
    bool open = true;
    for (int k = 0; k < LOG; ++k)
      if (open) {
        if (i >> k & 1) x = det_mk_attn_vals_add(stack[k], x);
        else stack[k] = x, open = false;
      }
  }
  return x;  // i = N - 1 closed every level: the root
}

// The max of §13.4 step 1 in any order: the first visible score if it is NaN (slot order never
// replaces a NaN), else the largest of the others, NaNs skipped (s > m is false for a NaN s).
// Ties of +0 and -0 may give either zero, whose sign never matters (§13.4).
DET_DEV float det_mk_max_skip_nan(float a, float b) { return a != a || b > a ? b : a; }

// One unit: the chunk ck of a row for query heads hq0 .. hq0 + nq - 1 (nq <= QG) of one KV head.
// Plain values, so that the unit's code reads none of the launch context (a reference, which
// would be reloaded from local memory at every use).
struct det_mk_attn_unit {
  int64_t D;        // head size
  float scale;      // the scores' scale (det_mk_attn_scale)
  const float* q;   // query head hq0's q; head hq0 + i at q + i D
  const float* kc;  // the KV head's keys and values (det_mk_attn_head's)
  const float* vc;
  int64_t capacity;
  det_mk_chunk ck;
  int nq;
  float* scratch;   // the warp's attention scratch
  // ROPE folded in (a tile whose rows are distinct sequences: det_mk_forward_tile): the unit makes
  // its queries, and the row's new key and value when its chunk holds the row's position, as ROPE
  // would (SPEC §13.3), from the raw ws.q / ws.k / ws.v. Null layer: ROPE ran as a phase.
  const det_llama_layer* rope_layer;
  const det_rope_table* table;
  const float* sincos;   // the row's (sin, cos) pairs of the layer's table
  float eps;
  int64_t jn;            // the slot of the row's position in this chunk, or -1 (then the rest is unused)
  const float* k_raw;    // the row's raw k and v of the unit's KV head
  const float* v_raw;
  float* k_head;         // the first pair's unit stores the new k and v at the cache's KV head (else null)
  float* v_head;
};

// A unit's scratch (det_mk_attn_scratch_floats): the pair's queries (QG x D), their exps (QG x
// 128), then the row's new key (D) and value (D) when ROPE is folded in. Where the new key starts.
DET_DEV float* det_mk_attn_unit_new_key(float* scratch, int64_t D) {
  return scratch + DET_MK_ATTN_GROUP * (D + DET_ATTN_CHUNK);
}

// ROPE's work on one head vector in the unit's scratch (det_mk_phase_rope's, SPEC §13.3): the
// optional norm, then the rotation of the table's pairs.
DET_DEV void det_mk_attn_rope_vector(const det_mk_attn_unit& u, float* vec, const float* norm) {
  if (norm) det_mk_warp_rmsnorm(vec, u.D, norm, u.eps);
  for (int64_t i = det_lane(); i < u.table->pairs; i += DET_WARP)
    det_rope_rotate_f32(&vec[i], &vec[i + u.table->half], det_sincos_f32{det_ld(u.sincos + 2 * i), det_ld(u.sincos + 2 * i + 1)});
  det_sync_warp();
}

// A unit's inputs in its scratch: the queries of its pair (zero past nq) at qs; with ROPE folded
// in, made as ROPE makes them, and when the chunk holds the row's position, the row's new key kn
// and value vn too, which the first pair's unit also stores in the cache (the units' own reads take
// kn and vn).
DET_DEV_NOINLINE void det_mk_attn_unit_stage(int64_t D_, int nq, const float* q_, float* scratch, const det_llama_layer* layer,
                                             const det_rope_table* table, const float* sincos, float eps, int64_t jn,
                                             const float* k_raw, const float* v_raw, float* k_head, float* v_head,
                                             int64_t capacity, int64_t base) {
  constexpr int QG = DET_MK_ATTN_GROUP;
  det_mk_attn_unit u;  // scalars in, a unit in registers (see det_mk_attn_unit_run)
  u.D = D_, u.nq = nq, u.q = q_, u.scratch = scratch, u.rope_layer = layer, u.table = table, u.sincos = sincos;
  u.eps = eps, u.jn = jn, u.k_raw = k_raw, u.v_raw = v_raw, u.k_head = k_head, u.v_head = v_head;
  u.capacity = capacity, u.ck = {base, 0, 0};
  const int64_t D = u.D;
  float* qs = u.scratch;
  float* kn = det_mk_attn_unit_new_key(scratch, D);
  float* vn = kn + D;
  for (int q = 0; q < QG; ++q)
    for (int64_t d = det_lane(); d < D; d += DET_WARP) qs[q * D + d] = q < u.nq ? det_ld(u.q + q * D + d) : 0.0f;
  det_sync_warp();
  if (!u.rope_layer) return;
  const det_llama_layer& L = *u.rope_layer;
  for (int q = 0; q < u.nq; ++q) det_mk_attn_rope_vector(u, qs + q * D, L.q_norm);
  if (u.jn < 0) return;
  for (int64_t d = det_lane(); d < D; d += DET_WARP) kn[d] = det_ld(u.k_raw + d), vn[d] = det_ld(u.v_raw + d);
  det_sync_warp();
  if (L.v_norm) det_mk_warp_rmsnorm(vn, D, L.v_norm, u.eps);
  det_mk_attn_rope_vector(u, kn, L.k_norm);
  if (!u.k_head) return;
  const int64_t p = u.ck.base + u.jn;
  for (int64_t d = det_lane(); d < D; d += DET_WARP) {
    u.k_head[det_kv_key_at(u.capacity, D, p, d)] = det_ld(kn + d);
    u.v_head[det_kv_value_at(D, p, d)] = det_ld(vn + d);
  }
}

template <int NA, int QG, class Emit>
DET_DEV void det_mk_attn_group_chunk(const det_mk_attn_unit& u, det_attn_acc (&part)[QG], Emit emit) {
  const int64_t D = u.D;
  const int lane = det_lane();
  float* qs = u.scratch;     // (QG, D) the group's queries (zero past nq)
  float* es = qs + QG * D;   // (QG, 128) the exps of the visible slots
  float* kn = det_mk_attn_unit_new_key(u.scratch, D);  // the row's new key and value, when u.jn >= 0
  float* vn = kn + D;

  // Scores of slots js .. js + 3: one panel of keys, element d at kp + d * w.
  const int64_t j0 = u.ck.j0, j1 = u.ck.j1, js = 4 * lane;
  const int64_t jn = u.jn;  // the slot whose key and value come from kn, vn (-1: none)
  const bool any = js + 3 >= j0 && js <= j1;
  const int64_t p = u.ck.base + js, w = det_kv_panel_width(u.capacity, p);
  const float* kp = u.kc + det_kv_key_at(u.capacity, D, p, 0);
  auto dot_leaf = [&](int a) {  // accumulator a's chain (§9) for the lane's 4 keys, every query
    det_mk_attn_vals<QG, 4> r = {};
    if (!any) return r;
    for (int64_t k0 = 0; k0 < D; k0 += DET_REDUCE_BLOCK)
      for (int i = 0; i < DET_REDUCE_RUN; ++i) {
        const int64_t d = k0 + DET_REDUCE_RUN * a + i;
        if (d >= D) break;
        float kv[4];
        if (w == DET_KV_PANEL) {
          const det_vec_f32x4 x = det_load_f32x4(kp + d * w);
          kv[0] = x.x, kv[1] = x.y, kv[2] = x.z, kv[3] = x.w;
        } else {  // the cache's narrow last panel holds only positions below its capacity
          for (int t = 0; t < 4; ++t) kv[t] = p % DET_KV_PANEL + t < w ? det_ld(kp + d * w + t) : 0.0f;
        }
        for (int t = 0; t < 4; ++t)  // the row's own new key, made by this unit (ROPE folded in)
          if (js + t == jn) kv[t] = det_ld(kn + d);
        for (int q = 0; q < QG; ++q) {
          const float qd = det_ld(qs + q * D + d);
          for (int t = 0; t < 4; ++t) r.v[q][t] = det_fma_f32(qd, kv[t], r.v[q][t]);
        }
        det_work_fma(4 * QG);
      }
    return r;
  };
  const det_mk_attn_vals<QG, 4> dot = det_mk_tree<NA>(dot_leaf);

  // Scores, each query's max over the warp, then the exps.
  bool vis[4];
  float s[QG][4], mx[QG], first[QG];
  for (int t = 0; t < 4; ++t) vis[t] = js + t >= j0 && js + t <= j1;
  for (int q = 0; q < QG; ++q) {
    mx[q] = det_bits_f32(0xff800000u);  // -inf: no visible slot on this lane
    for (int t = 0; t < 4; ++t) {
      s[q][t] = det_mul_f32(dot.v[q][t], u.scale);
      if (vis[t]) mx[q] = det_mk_max_skip_nan(mx[q], s[q][t]);
    }
    uint32_t bits = 0;  // the score of slot j0 if this lane holds it, by masks: a select on t0
    for (int t = 0; t < 4; ++t)  // would index s from local memory
      bits |= (js + t == j0 ? 0xffffffffu : 0u) & det_f32_bits(s[q][t]);
    first[q] = det_bits_f32(bits);
  }
  for (int delta = DET_WARP / 2; delta >= 1; delta >>= 1)
    det_shfl_down_combine_n(mx, QG, delta, [](float a, float b) { return det_mk_max_skip_nan(a, b); });
  det_shfl_idx_n(mx, QG, 0);
  det_shfl_idx_n(first, QG, (int)(j0 / 4));
  DET_UNROLL  // the exp is large: rolled loops would index s and part from local memory
  for (int q = 0; q < QG; ++q) {
    part[q].m = first[q] != first[q] ? first[q] : mx[q];
    DET_UNROLL
    for (int t = 0; t < 4; ++t)
      if (vis[t]) es[q * DET_ATTN_CHUNK + js + t] = det_exp_f32(det_sub_f32(s[q][t], part[q].m));
  }
  det_sync_warp();

  // l: slot j in lane j/8's chain, lanes 16..31 +0, the warp tree (§13.4 step 3).
  float e_sum[QG];
  for (int q = 0; q < QG; ++q) {
    e_sum[q] = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const int64_t j = 8 * lane + i;
      if (j >= j0 && j <= j1) e_sum[q] = det_add_f32(e_sum[q], det_ld(es + q * DET_ATTN_CHUNK + j));
    }
  }
  det_mk_warp_tree<QG>(e_sum);
  det_shfl_idx_n(e_sum, QG, 0);
  for (int q = 0; q < QG; ++q) part[q].l = e_sum[q];

  // o_d for the lane's dimensions d, d + 1 of each 64: accumulator a < 16 takes slots 8a .. 8a + 7.
  for (int64_t d0 = 0; d0 < D; d0 += 2 * DET_WARP) {
    const int64_t d = d0 + 2 * lane;  // D is a multiple of 8: d < D holds d + 1 too
    auto value_leaf = [&](int a) {
      det_mk_attn_vals<QG, 2> r = {};
      if (d >= D) return r;
      for (int i = 0; i < 8; ++i) {
        const int64_t j = 8 * a + i;
        if (j < j0 || j > j1) continue;
        const det_vec_f32x2 v = j == jn ? det_vec_f32x2{det_ld(vn + d), det_ld(vn + d + 1)}
                                        : det_load_f32x2(u.vc + det_kv_value_at(D, u.ck.base + j, d));
        for (int q = 0; q < QG; ++q) {
          const float e = det_ld(es + q * DET_ATTN_CHUNK + j);
          r.v[q][0] = det_fma_f32(e, v.x, r.v[q][0]);
          r.v[q][1] = det_fma_f32(e, v.y, r.v[q][1]);
        }
        det_work_fma(2 * QG);
      }
      return r;
    };
    // Accumulators 16..31 take no slot: a tree over 16, then +0 once (§13.4).
    const det_mk_attn_vals<QG, 2> o = det_mk_tree<16>(value_leaf);
    for (int q = 0; q < QG; ++q)  // q < QG, a constant: o and part stay in registers
      if (d < D && q < u.nq) {
        emit(q, d, det_add_f32(o.v[q][0], 0.0f));
        emit(q, d + 1, det_add_f32(o.v[q][1], 0.0f));
      }
  }
  det_sync_warp();  // the scratch is free for the warp's next unit
}

// One unit's chunk (SPEC §13.4: a chunk's partial depends on that chunk alone) for each query head
// of its pair: (m, l, o) at out + q * part_stride per query; or, when every row of the tile has a
// single chunk (`direct`), att = o / l at out + q * D, which the fold would write from the partial.
// Each NA (the dot's accumulators that take terms) is its own function: ptxas allocates their
// registers apart (inlined into one phase, they took it minutes per architecture). Its arguments
// are scalars, which the call passes in registers (a unit struct, by reference or by value, went
// through local memory: sm_90 +260 LDL or +80 STL).
template <int NA>
DET_DEV_NOINLINE void det_mk_attn_unit_run(int64_t D, float scale, const float* kc, const float* vc, int64_t capacity,
                                           int64_t base, int64_t j0, int64_t j1, int64_t jn, int nq, float* scratch,
                                           float* out, int64_t part_stride, bool direct) {
  constexpr int QG = DET_MK_ATTN_GROUP;
  det_mk_attn_unit u;
  u.D = D, u.scale = scale, u.kc = kc, u.vc = vc, u.capacity = capacity, u.ck = {base, j0, j1};
  u.jn = jn, u.nq = nq, u.scratch = scratch, u.rope_layer = nullptr;
  det_attn_acc part[QG];
  if (direct) {
    det_mk_attn_group_chunk<NA, QG>(u, part, [&](int q, int64_t d, float o) { out[q * D + d] = det_div_f32(o, part[q].l); });
  } else {
    det_mk_attn_group_chunk<NA, QG>(u, part, [&](int q, int64_t d, float o) { out[q * part_stride + 2 + d] = o; });
    for (int q = 0; q < QG; ++q)
      if (det_lane() == 0 && q < u.nq) out[q * part_stride] = part[q].m, out[q * part_stride + 1] = part[q].l;
  }
}

// A unit reads its chunk's keys and values in rounds (a leaf's loads at a time): ask for all their
// lines first, so that only the first round waits on DRAM. Keys: the panels of slots j0..j1 (a panel
// is 16 D floats, or w D for the cache's narrow last one); values: rows j0..j1.
DET_DEV void det_mk_attn_prefetch(const float* kc, const float* vc, int64_t capacity, int64_t D, const det_mk_chunk& ck) {
  const int lane = det_lane();
  const int64_t p0 = ck.base + ck.j0 - (ck.base + ck.j0) % DET_KV_PANEL, p1 = ck.base + ck.j1;
  const float* k0 = kc + det_kv_key_at(capacity, D, p0, 0);
  const float* k1 = kc + det_kv_key_at(capacity, D, p1, D - 1);  // the last panel's last element
  for (const float* line = k0 + 32 * lane; line <= k1; line += 32 * DET_WARP) det_prefetch_l2(line);
  const float* v0 = vc + det_kv_value_at(D, ck.base + ck.j0, 0);
  const float* v1 = vc + det_kv_value_at(D, p1, D - 1);
  for (const float* line = v0 + 32 * lane; line <= v1; line += 32 * DET_WARP) det_prefetch_l2(line);
}

// One unit's work, by the dot's accumulators that take terms (rounded up to 8, 16 or 32: `runs`).
DET_DEV void det_mk_attn_unit_go(int64_t runs, int64_t D, float scale, const float* kc, const float* vc, int64_t capacity,
                                 const det_mk_chunk& ck, int64_t jn, int nq, float* scratch, float* out,
                                 int64_t part_stride, bool direct) {
#define DET_MK_ATTN_RUN(NA) \
  det_mk_attn_unit_run<NA>(D, scale, kc, vc, capacity, ck.base, ck.j0, ck.j1, jn, nq, scratch, out, part_stride, direct)
  if (runs > 16) DET_MK_ATTN_RUN(32);
  else if (runs > 8) DET_MK_ATTN_RUN(16);
  else DET_MK_ATTN_RUN(8);
#undef DET_MK_ATTN_RUN
}

// The tile, from the shared-memory base (through the context it is a local load).
DET_DEV const det_mk_tile& det_mk_staged_tile() { return *(const det_mk_tile*)det_smem(); }
// Geometry stage 2's block tasks (det_mk_phase_attn_staged): (chunk slot k, KV head g, rows r0 ..
// r1 - 1 of the tile), R = max(1, warps / query pairs) rows a task, numbered chunk slot first.
// Recomputed from the context where they are needed: what the staged phase holds across a unit's
// call adds to the kernel's registers (the unit's are the kernel's most).
struct det_mk_staged_task {
  int k, g, r0, r1;
};
DET_DEV int det_mk_staged_group(const det_llama_model& m) { return (int)(m.n_heads / m.n_kv_heads); }  // G
DET_DEV int det_mk_staged_pairs(const det_llama_model& m) {  // query pairs of a KV head
  return (int)((m.n_heads / m.n_kv_heads + DET_MK_ATTN_GROUP - 1) / DET_MK_ATTN_GROUP);
}
DET_DEV int det_mk_staged_rows(const det_mk_ctx& c) {  // R
  const int pairs = det_mk_staged_pairs(c.P->model);
  return det_warps() / pairs > 1 ? det_warps() / pairs : 1;
}
DET_DEV int det_mk_staged_tasks(const det_mk_ctx& c, int64_t l, int64_t pass) {
  const int R = det_mk_staged_rows(c), slots = (int)det_mk_attn_in_pass(c, det_mk_attn_most_chunks(c, l), pass);
  return slots * (int)c.P->model.n_kv_heads * ((det_mk_staged_tile().n + R - 1) / R);
}
DET_DEV det_mk_staged_task det_mk_staged_task_of(const det_mk_ctx& c, int task) {
  const int R = det_mk_staged_rows(c), groups = (det_mk_staged_tile().n + R - 1) / R, kv = (int)c.P->model.n_kv_heads;
  const int r0 = task % groups * R;
  return {task / (kv * groups), task / groups % kv, r0, r0 + R < det_mk_staged_tile().n ? r0 + R : det_mk_staged_tile().n};
}
// Chunk slot k of row b in pass `pass` (the chunk's number), or -1 when row b has no slot k there.
DET_DEV int64_t det_mk_staged_chunk(const det_mk_ctx& c, const det_llama_layer& L, int64_t pass, int k, int b) {
  const int64_t p = det_mk_staged_tile().pos[b];
  if (k >= det_mk_attn_in_pass(c, det_mk_attn_chunks(L, p), pass)) return -1;
  return det_mk_attn_lo(L, p) / DET_ATTN_CHUNK + pass * c.P->geo.attn + k;
}
DET_DEV float* det_mk_staged_keys(const det_mk_ctx& c) {  // the copy, after the warps' scratch
  return det_mk_area_of(c.P->geo) + det_warps() * det_mk_attn_scratch_floats(&c.P->model, c.P->geo.attn);
}

// A staged task's run from row b0: the rows of row b0's sequence from b0 on whose slot k is the
// same chunk ch. Every thread of the block copies the keys of the run's visible slots (their whole
// panels) and their values into the block's copy, at the same offsets from the chunk's first
// position as in the cache. Returns the run's end (b0 + 1 without a copy when row b0 has no slot k).
DET_DEV_NOINLINE int det_mk_attn_stage_run(const det_mk_ctx& c, int l, int pass, int task, int b0) {
  const det_mk_tile& tile = det_mk_staged_tile();
  const det_llama_layer& L = c.P->model.layers[l];
  const det_mk_staged_task tk = det_mk_staged_task_of(c, task);
  const int64_t ch = det_mk_staged_chunk(c, L, pass, tk.k, b0);
  if (ch < 0) return b0 + 1;
  int64_t j0 = DET_ATTN_CHUNK, j1 = 0;  // the union of the run's visible slots
  int b1 = b0;
  for (; b1 < tk.r1 && tile.seq[b1] == tile.seq[b0] && det_mk_staged_chunk(c, L, pass, tk.k, b1) == ch; ++b1) {
    const det_mk_chunk ck = det_mk_chunk_of(det_mk_attn_lo(L, tile.pos[b1]), tile.pos[b1], ch);
    j0 = ck.j0 < j0 ? ck.j0 : j0, j1 = ck.j1 > j1 ? ck.j1 : j1;
  }
  const det_mk_seq& sq = c.P->prog.seqs[tile.seq[b0]];
  const int64_t D = L.head_dim, base = ch * DET_ATTN_CHUNK, capacity = sq.capacity - base;
  const float* kc = sq.k + det_kv_head_base(L, sq.capacity, tk.g) + base * D;
  const float* vc = sq.v + det_kv_head_base(L, sq.capacity, tk.g) + base * D;
  float* ks = det_mk_staged_keys(c);
  float* vs = ks + DET_ATTN_CHUNK * c.P->model.head_dim;
  const int64_t k_from = (j0 - j0 % DET_KV_PANEL) * D;
  const int64_t k_to = (j1 - j1 % DET_KV_PANEL) * D + D * det_kv_panel_width(capacity, j1);
  det_mk_block_copy_l2(ks + k_from, kc + k_from, k_to - k_from);
  det_mk_block_copy_l2(vs + j0 * D, vc + j0 * D, (j1 + 1 - j0) * D);
  det_cp_async_commit();  // keys and values in flight together; landed, then visible to the block
  det_cp_async_wait<0>();
  det_sync_block();
  return b1;
}

// The arrival of ATTN_CHUNKS' unit `task` (det_mk_attn_arrive): its row and query pair found from
// the task again, in a function of its own. Computed in the phase, the compiler kept the unit's row
// and head live across the unit's call instead: sm_90's kernel took 247 registers, 242 this way
// (240 without the arrival).
DET_DEV_NOINLINE void det_mk_attn_unit_arrive(const det_mk_ctx& c, int l, int pass, int task) {
  const det_llama_model& m = c.P->model;
  const int G = (int)(m.n_heads / m.n_kv_heads), per_kv = (G + DET_MK_ATTN_GROUP - 1) / DET_MK_ATTN_GROUP;
  const int rows = c.tile->n;
  det_mk_attn_arrive(c, l, pass, task / per_kv % rows, task / (rows * per_kv) % (int)m.n_kv_heads * G +
                                                          task % per_kv * DET_MK_ATTN_GROUP);
}

// ATTN_CHUNKS: units (row, KV head, query pair, chunk of the pass) dealt over every warp of the
// grid; a unit computes its chunk's (m, l, o) for each query head of its pair (SPEC §13.4: a
// chunk's partial depends on that chunk alone), and the pass's last unit of a (row, pair) folds
// the pair's partials (det_mk_attn_arrive). When every row of the tile has a single chunk
// (`direct`), the fold would take the partial as it is: the unit writes att = o / l itself and
// counts nothing. With `rope`, each unit first does ROPE's work for itself. The unit's work is
// a call per NA (the dot's accumulators that take terms rounded up to 8, 16 or 32), and ROPE's
// another: each its own register allocation, with nothing live across them (called from inside
// the unit, ROPE's work spilled on sm_120). A KV head with one query head runs a pair with a zero
// query; an odd count pads its last pair likewise.
// Units are numbered chunk slot first, then KV head, row, query pair, so that the consecutive units
// a block's warps take read the same chunk of the same KV head: for the rows of one sequence (a
// prompt tile) the same keys and values, which the block's first reads bring into its SM's L1
// and the others then find there, instead of each unit reading them from L2. A number whose chunk
// slot the row does not have in this pass is skipped.
DET_DEV_NOINLINE void det_mk_phase_attn_chunks(const det_mk_ctx& c, int64_t l, int64_t pass, bool direct, bool rope) {
  constexpr int QG = DET_MK_ATTN_GROUP;
  const det_mk_params& P = *c.P;
  const det_mk_tile& tile = *c.tile;
  const det_llama_model& m = P.model;
  const det_llama_layer& L = m.layers[l];
  const int64_t D = L.head_dim, QD = m.n_heads * D, G = m.n_heads / m.n_kv_heads, per_kv = (G + QG - 1) / QG;
  const int64_t groups = m.n_kv_heads * per_kv;  // (KV head, query pair) of a row
  const int64_t per = P.geo.attn, part_stride = det_mk_attn_part_stride(m);
  const int64_t runs = (D + DET_REDUCE_RUN - 1) / DET_REDUCE_RUN;
  const int64_t rows = tile.n, slots = det_mk_attn_in_pass(c, det_mk_attn_most_chunks(c, l), pass);
  det_mk_attn_unit u;
  u.D = D, u.scale = det_mk_attn_scale(m), u.scratch = det_mk_attn_scratch(c);
  u.rope_layer = rope ? &L : nullptr, u.table = &m.rope[L.rope_table], u.eps = m.rms_eps;
  for (int64_t task = c.gwarp, nwarps = c.nwarps, tasks = slots * groups * rows; task < tasks; task += nwarps) {
    // task = ((k * KV heads + g) * rows + b) * per_kv + pair
    const int64_t k = task / (groups * rows), g = task / (rows * per_kv) % m.n_kv_heads;
    const int64_t b = task / per_kv % rows, q0 = task % per_kv * QG, hq0 = g * G + q0;
    if (k >= det_mk_attn_in_pass(c, det_mk_attn_chunks(L, tile.pos[b]), pass)) continue;  // not row b's
    const int64_t p = tile.pos[b], lo = det_mk_attn_lo(L, p);
    const det_mk_seq& sq = P.prog.seqs[tile.seq[b]];
    u.q = P.ws.q + b * QD + hq0 * D;
    u.kc = sq.k + det_kv_head_base(L, sq.capacity, g);
    u.vc = sq.v + det_kv_head_base(L, sq.capacity, g);
    u.capacity = sq.capacity;
    u.ck = det_mk_chunk_of(lo, p, lo / DET_ATTN_CHUNK + pass * per + k);
    u.nq = (int)(G - q0 < QG ? G - q0 : QG);
    u.jn = rope && L.kv_source == l && p <= u.ck.base + DET_ATTN_CHUNK - 1 ? p - u.ck.base : -1;
    u.sincos = P.ws.sincos + 2 * (b * m.rope_pairs + u.table->offset);
    u.k_raw = P.ws.k + b * m.n_kv_heads * D + g * D, u.v_raw = P.ws.v + b * m.n_kv_heads * D + g * D;
    u.k_head = q0 == 0 ? sq.k + det_kv_head_base(L, sq.capacity, g) : nullptr, u.v_head = sq.v + det_kv_head_base(L, sq.capacity, g);
    float* out = direct ? P.ws.att + b * QD + hq0 * D : det_mk_attn_part(c, b, hq0, k);
    det_mk_attn_prefetch(u.kc, u.vc, u.capacity, D, u.ck);
    det_mk_attn_unit_stage(D, u.nq, u.q, u.scratch, u.rope_layer, u.table, u.sincos, u.eps, u.jn, u.k_raw, u.v_raw,
                           u.k_head, u.v_head, u.capacity, u.ck.base);
    det_mk_attn_unit_go(runs, D, u.scale, u.kc, u.vc, u.capacity, u.ck, rope ? u.jn : -1, u.nq, u.scratch, out,
                        part_stride, direct);
    if (!direct) det_mk_attn_unit_arrive(c, (int)l, (int)pass, (int)task);
  }
}

// One unit of a staged run: row b's query pair `pair` of the task's KV head, on the block's copy
// of its chunk, read as a cache that starts at the chunk (capacity - base positions, from 0).
// Nothing when row b has no slot k in this pass; returns whether the unit ran.
DET_DEV_NOINLINE bool det_mk_attn_staged_unit(const det_mk_ctx& c, int l, int pass, int task, int b, int pair, bool direct) {
  constexpr int QG = DET_MK_ATTN_GROUP;
  const det_mk_params& P = *c.P;
  const det_llama_model& m = P.model;
  const det_llama_layer& L = m.layers[l];
  const det_mk_staged_task tk = det_mk_staged_task_of(c, task);
  const int64_t ch = det_mk_staged_chunk(c, L, pass, tk.k, b);
  if (ch < 0) return false;
  const int64_t D = L.head_dim, QD = m.n_heads * D, G = m.n_heads / m.n_kv_heads, q0 = pair * QG, hq0 = tk.g * G + q0;
  const int64_t p = det_mk_staged_tile().pos[b];
  det_mk_chunk ck = det_mk_chunk_of(det_mk_attn_lo(L, p), p, ch);
  const int64_t capacity = P.prog.seqs[det_mk_staged_tile().seq[b]].capacity - ck.base;
  ck.base = 0;
  const int nq = (int)(G - q0 < QG ? G - q0 : QG);
  float* scratch = det_mk_attn_scratch(c);
  float* ks = det_mk_staged_keys(c);
  float* out = direct ? P.ws.att + b * QD + hq0 * D : det_mk_attn_part(c, b, hq0, tk.k);
  det_mk_attn_unit_stage(D, nq, P.ws.q + b * QD + hq0 * D, scratch, nullptr, nullptr, nullptr, 0.0f, -1, nullptr, nullptr,
                         nullptr, nullptr, capacity, 0);
  // head_dim <= DET_MK_STAGE_HEAD_DIM_MAX = 128: at most 16 accumulators take terms, so the staged
  // phase never calls the 32-accumulator unit (sm_90's kernel: 242 registers instead of 244).
  static_assert(DET_MK_STAGE_HEAD_DIM_MAX <= 16 * DET_REDUCE_RUN, "a staged unit has at most 16 accumulators");
  const float scale = det_mk_attn_scale(m), *vs = ks + DET_ATTN_CHUNK * m.head_dim;
  const int64_t stride = det_mk_attn_part_stride(m);
  if (D > 8 * DET_REDUCE_RUN) det_mk_attn_unit_run<16>(D, scale, ks, vs, capacity, 0, ck.j0, ck.j1, -1, nq, scratch, out, stride, direct);
  else det_mk_attn_unit_run<8>(D, scale, ks, vs, capacity, 0, ck.j0, ck.j1, -1, nq, scratch, out, stride, direct);
  return true;
}

// ATTN_CHUNKS with geometry stage 2, for a tile whose rows share sequences (a prompt tile: not
// rope_in_attn). Block tasks (chunk slot k, KV head, R consecutive rows of the tile: about a unit
// per warp). For each run of the task's rows that see the same chunk of the same sequence, the
// block copies the keys and values of the run's visible slots into its phase area once, then its
// warps run the run's units (row, query pair) on the copy: the same units, the same loads in the
// same order, from shared memory instead of L2. A chunk is then read from L2 once per R rows
// instead of once per (row, query pair). Only ints stay live across a unit's call: what a phase
// holds across its units' calls adds to the kernel's registers, whose most are the unit's (holding
// the task's shape and pointers, sm_90's kernel spilled 8 to 28 bytes).
DET_DEV_NOINLINE void det_mk_phase_attn_staged(const det_mk_ctx& c, int l, int pass, bool direct) {
  for (int task = det_block(); task < det_mk_staged_tasks(c, l, pass); task += det_blocks()) {
    for (int b0 = det_mk_staged_task_of(c, task).r0, b1; b0 < det_mk_staged_task_of(c, task).r1; b0 = b1) {
      b1 = det_mk_attn_stage_run(c, l, pass, task, b0);
      for (int t = det_warp(); t < (b1 - b0) * det_mk_staged_pairs(c.P->model); t += det_warps()) {
        const int b = b0 + t / det_mk_staged_pairs(c.P->model), pair = t % det_mk_staged_pairs(c.P->model);
        // The arrival here, not in the unit's function: what lives across the unit's call there
        // adds to the kernel's registers.
        if (det_mk_attn_staged_unit(c, l, pass, task, b, pair, direct) && !direct)
          det_mk_attn_arrive(c, l, pass, b, det_mk_staged_task_of(c, task).g * det_mk_staged_group(c.P->model) +
                                                pair * DET_MK_ATTN_GROUP);
      }
      det_sync_block();  // every unit has read the copy before the next run's replaces it
    }
  }
}

// Split attention's units for one pass: staged per block (the tile's attn_staged, read from shared
// memory: a condition through the context cost the kernel's body 15 local loads on sm_90) or dealt
// to every warp of the grid.
DET_DEV void det_mk_phase_attn_units(const det_mk_ctx& c, int64_t l, int64_t pass, bool direct, bool rope) {
  if (((const det_mk_tile*)det_smem())->attn_staged) det_mk_phase_attn_staged(c, (int)l, (int)pass, direct);
  else det_mk_phase_attn_chunks(c, l, pass, direct, rope);
}
