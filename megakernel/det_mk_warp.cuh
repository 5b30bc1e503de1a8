// det_mk_warp.cuh: the megakernel's warp building blocks: the thread's view of the launch
// (det_mk_ctx), the canonical 32-lane tree of docs/SPEC.md §9, and the streamed GEMV with its
// per-warp weight ring (cp.async stages of 16 bytes per lane), dense bf16 or nf4 rows.
#pragma once

#include "det_megakernel.h"
#include "det_simt.h"
#include "../contract/det_norm.h"

// One thread's view of the launch.
struct det_mk_ctx {
  const det_mk_params* P;
  det_mk_tile* tile;
  det_vec_u32x4* ring;  // this warp's weight ring: depth x 32 lanes x 16 bytes
  int depth;            // ring stages: 2 or 4
  float* area;          // the block's phase area (normalized rows, attention scratch, argmax)
  int gwarp, nwarps;    // this warp's index in the grid, warps in the grid
};

// The grid barrier after a phase, tagged for the profiling timeline (det_mk_program::timeline).
// Only thread 0 stamps and counts the synchronizations (in the tile, shared memory: a counter in the
// context would live in local memory, which the phases' references put it in); the count also gives
// the monotonic barrier (geometry barrier 1) the arrivals that complete this one.
DET_DEV_NOINLINE void det_mk_grid_sync(const det_mk_ctx& c, int32_t tag) {
  const det_mk_program& p = c.P->prog;
  uint64_t* slot = nullptr;
  if (p.timeline) {
    det_sync_block();  // the block's slowest warp has arrived
    const int64_t j = c.tile->syncs;
    if (det_thread() == 0 && j < p.timeline_cap) {
      slot = p.timeline + 2 * (j * det_blocks() + det_block());
      slot[0] = det_globaltimer();
      if (det_block() == 0) p.timeline_tag[j] = tag;
    }
  }
  if (c.P->geo.barrier)
    det_sync_grid_counter(c.P->ws.barrier, det_thread() == 0 ? (uint64_t)(c.tile->syncs + 1) * det_blocks() : 0);
  else
    det_sync_grid(c.P->ws.barrier);
  if (slot) slot[1] = det_globaltimer();
  if (det_thread() == 0) ++c.tile->syncs;
}

// ---- warp building blocks ---------------------------------------------------------------------

// The canonical tree (docs/SPEC.md §9) for N reductions at once: lane l is accumulator l of each
// (acc[r]); steps 16..1 add lane l + 16..1. Reduction r's result is acc[r] on lane 0 (other lanes
// hold partial sums).
template <int N>
DET_DEV void det_mk_warp_tree(float (&acc)[N]) {
  for (int delta = DET_WARP / 2; delta >= 1; delta >>= 1)
    det_shfl_down_combine_n(acc, N, delta, [](float a, float b) { return det_add_f32(a, b); });
}

// The canonical tree for NB (a power of two, at most 32) reductions at once, its rows spread over
// the warp as it goes: each round pairs lane l with lane l ^ delta, as §9's tree pairs positions p
// and p + delta (a lane's index mod 2 delta is its position). While a lane holds n > 1 rows it
// keeps half of them (the lower half when its delta bit is clear) and gets its partner's partials
// of that half: n / 2 shuffles a round, not n. Every sum keeps the tree's order, the lower
// position's partial first, so each row's result is det_mk_warp_tree's. Returns, on the lanes
// det_mk_tree_row names, the result of row det_mk_tree_row<NB>().
template <int NB, int N = NB, int DELTA = DET_WARP / 2>
DET_DEV float det_mk_warp_tree_rows(float (&v)[NB]) {
  if constexpr (DELTA == 0) {
    return v[0];
  } else {
    const bool hi = (det_lane() & DELTA) != 0;
    constexpr int H = N > 1 ? N / 2 : 1;
    float got[H];
    for (int j = 0; j < H; ++j) got[j] = N > 1 && !hi ? v[H + j] : v[j];  // what the partner keeps
    det_shfl_xor_n(got, H, DELTA);
    for (int j = 0; j < H; ++j) {
      const float mine = N > 1 && hi ? v[H + j] : v[j];
      v[j] = hi ? det_add_f32(got[j], mine) : det_add_f32(mine, got[j]);
    }
    return det_mk_warp_tree_rows<NB, H, DELTA / 2>(v);
  }
}

// The input row whose result det_mk_warp_tree_rows leaves on this lane, or -1: row r is on lanes
// r * 32 / NB .. (r + 1) * 32 / NB - 1, and the first of them answers for it.
template <int NB>
DET_DEV int det_mk_tree_row() {
  constexpr int lanes = DET_WARP / NB;
  return det_lane() % lanes == 0 ? det_lane() / lanes : -1;
}

// Canonical dot of two fp32 vectors of length K (K % 8 == 0), returned on every lane: lane l takes
// the runs 8l .. 8l + 7 of every block of 256 as one fma chain.
DET_DEV float det_mk_warp_dot_f32(const float* a, const float* b, int64_t K) {
  float acc[1] = {0.0f};
  for (int64_t k = DET_REDUCE_RUN * det_lane(); k < K; k += DET_REDUCE_BLOCK) {
    for (int i = 0; i < DET_REDUCE_RUN; ++i) acc[0] = det_fma_f32(det_ld(a + k + i), det_ld(b + k + i), acc[0]);
    det_work_fma(DET_REDUCE_RUN);
  }
  det_mk_warp_tree<1>(acc);
  det_shfl_idx_n(acc, 1, 0);
  return acc[0];
}

// One warp: RMSNorm's factor of v[0..K) (docs/SPEC.md §13.2; K % 8 == 0), on every lane.
DET_DEV float det_mk_warp_rms_factor(const float* v, int64_t K, float eps) {
  return det_rmsnorm_factor_f32(det_mk_warp_dot_f32(v, v, K), K, eps);
}

// One warp: v[0..K) = rmsnorm(v) * w in place (docs/SPEC.md §13.2; K % 8 == 0).
DET_DEV void det_mk_warp_rmsnorm(float* v, int64_t K, const float* w, float eps) {
  const float r = det_mk_warp_rms_factor(v, K, eps);
  for (int64_t k = det_lane(); k < K; k += DET_WARP) v[k] = det_rmsnorm_scale_f32(det_ld(v + k), r, det_ld(w + k));
  det_sync_warp();
}

// Calls f.template operator()<NB>() with NB the smallest of 1, 2, 4, 8, 16 holding n rows.
template <class F>
DET_DEV void det_mk_with_nb(int n, F f) {
  if (n <= 1) f.template operator()<1>();
  else if (n <= 2) f.template operator()<2>();
  else if (n <= 4) f.template operator()<4>();
  else if (n <= 8) f.template operator()<8>();
  else f.template operator()<16>();
}

// One weight row as the GEMV reads it: row r of matrix w (cols elements, dense bf16 or nf4).
struct det_mk_row {
  const det_matrix* w;
  int64_t r;
};

// Lane's 8 weights at columns k..k+7 of row `row`, from the 16 bytes its ring slot received
// (8 bf16, or 4 bytes of nf4 codes whose 8 elements share one block: blocks hold at least 8).
DET_DEV void det_mk_decode8(const det_mk_row& row, int64_t K, int64_t k, const det_vec_u32x4& w4, float (&w)[8]) {
  if (row.w->bf16) {
    const uint32_t words[4] = {w4.x, w4.y, w4.z, w4.w};
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = det_bf16_to_f32((uint16_t)(words[j] & 0xffffu));
      w[2 * j + 1] = det_bf16_to_f32((uint16_t)(words[j] >> 16));
    }
    return;
  }
  const det_matrix& m = *row.w;
  const int64_t i = row.r * K + k;
  const float scale = m.absmax[i >> m.block_shift];
  for (int j = 0; j < 4; ++j) {
    const uint32_t byte = (w4.x >> (8 * j)) & 0xffu;
    w[2 * j] = det_nf4_weight_f32(m.code[byte >> 4], scale);
    w[2 * j + 1] = det_nf4_weight_f32(m.code[byte & 15u], scale);
  }
}

// Stage (item it, step s) of a warp's weight stream into slot `slot` of its ring: the lane's 16
// bytes of the row (8 bf16, or 4 bytes of nf4 codes), when its columns are inside the row.
template <class Row>
DET_DEV void det_mk_issue_stage(det_vec_u32x4* ring, Row row, int64_t K, int64_t it, int64_t s, int64_t slot) {
  const int64_t k = s * 8 * DET_WARP + 8 * det_lane();
  if (k >= K) return;
  const det_mk_row src = row(it);
  det_vec_u32x4* dst = &ring[slot * DET_WARP + det_lane()];
  if (src.w->bf16) det_cp_async16(dst, src.w->bf16 + src.r * K + k);
  else det_cp_async4(dst, src.w->nf4 + (src.r * K + k) / 2);
}

// Ring stages per weight row of K columns: a stage is 16 bytes a lane, 8 columns.
DET_DEV int64_t det_mk_gemv_steps(int64_t K) { return (K + 8 * DET_WARP - 1) / (8 * DET_WARP); }

// The warp's GEMV rows: item it is the weight row row(it) (a det_mk_row; K % 8 == 0, rows 16-byte
// aligned when dense, 4-byte when nf4), dotted with the nb input rows x + b*ldx. Weights stream
// through the warp's ring of c.depth stages (each lane copies and later reads only its own slot,
// so no warp barrier is needed); each weight is read once for all nb rows. After each item,
// emit(it, y) runs on every lane, with y the canonical dot of input row det_mk_tree_row<NB>()
// where that is a row (>= 0): the rows' epilogues (a bias, an activation, a residual's load and
// store) run side by side, not in turn on lane 0. primed: det_mk_gemv_ahead has already issued
// (and committed) the first depth - 1 stages, before the barrier the phase began with.
template <int NB, class Row, class Emit>
DET_DEV void det_mk_gemv(const det_mk_ctx& c, int64_t n_items, int64_t K, Row row, const float* x,
                         int64_t ldx, int nb, Emit emit, bool primed = false) {
  if (n_items <= 0) return;
  const int lane = det_lane();
  const int64_t steps = det_mk_gemv_steps(K), total = n_items * steps;
  det_vec_u32x4* ring = c.ring;
  const int depth = c.depth, mask = depth - 1;
  int64_t issue_it = 0, issue_s = 0, issued = 0;
  auto issue = [&](bool copy) {  // the next (item, step) into its ring slot, or an empty group at the end
    if (issued < total) {
      if (copy) det_mk_issue_stage(ring, row, K, issue_it, issue_s, issued & mask);
      if (++issue_s == steps) issue_s = 0, ++issue_it;
    }
    ++issued;
    if (copy) det_cp_async_commit();
  };
  for (int f = 0; f < depth - 1; ++f) issue(!primed);

  float acc[NB];  // lane l is accumulator l of each input row's dot (§9)
  for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
  int64_t it = 0, s = 0;
  for (int64_t f = 0; f < total; ++f) {
    issue(true);
    if (depth == 4) det_cp_async_wait<3>();  // stage f has landed; depth - 1 stay in flight
    else det_cp_async_wait<1>();
    const int64_t k = s * 8 * DET_WARP + 8 * lane;
    if (k < K) {
      float w[8];
      det_mk_decode8(row(it), K, k, det_ld(&ring[(f & mask) * DET_WARP + lane]), w);
      for (int b = 0; b < NB; ++b) {
        if (b >= nb) break;
        const det_vec_f32x4 x0 = det_load_f32x4(x + b * ldx + k), x1 = det_load_f32x4(x + b * ldx + k + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        for (int i = 0; i < 8; ++i) acc[b] = det_fma_f32(w[i], xv[i], acc[b]);
        det_work_fma(8);
      }
    }
    if (++s == steps) {
      emit(it, det_mk_warp_tree_rows<NB>(acc));
      for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
      s = 0;
      ++it;
    }
  }
}

// Weights ahead of their inputs (geometry ahead > 0; docs/SPEC.md §14.3): weights never depend on
// activations, so before the barrier a GEMV phase begins with, each warp issues that phase's
// first depth - 1 ring stages (ring: the phase's det_mk_gemv is then called primed and counts
// them as issued) and hints the first l2_bytes of its weight rows into L2 (prefetch.global.L2,
// each lane a 128-byte line of 32), so the phase's first loads do not wait for DRAM. Scheduling
// only: what lands in the ring is what the GEMV would have copied itself.
template <class Row>
DET_DEV void det_mk_gemv_ahead(const det_mk_ctx& c, int64_t n_items, int64_t K, Row row, bool ring, int64_t l2_bytes) {
  if (n_items <= 0) return;
  const int64_t steps = det_mk_gemv_steps(K);
  if (ring)
    for (int64_t f = 0; f < c.depth - 1; ++f) {
      if (f < n_items * steps) det_mk_issue_stage(c.ring, row, K, f / steps, f % steps, f);
      det_cp_async_commit();
    }
  for (int64_t it = 0; it < n_items && l2_bytes > 0; ++it) {
    const det_mk_row src = row(it);
    const bool dense = src.w->bf16 != nullptr;
    const int64_t bytes = dense ? 2 * K : K / 2;
    const uintptr_t base = dense ? (uintptr_t)(src.w->bf16 + src.r * K) : (uintptr_t)(src.w->nf4 + src.r * K / 2);
    for (uintptr_t a = (base & ~(uintptr_t)127) + 128 * det_lane(); a < base + bytes; a += 128 * DET_WARP)
      det_prefetch_l2((const void*)a);
    l2_bytes -= bytes;
  }
}

// Items of this warp when N outputs are dealt round-robin over the grid's warps.
DET_DEV int64_t det_mk_items(const det_mk_ctx& c, int64_t N) {
  return c.gwarp < N ? (N - 1 - c.gwarp) / c.nwarps + 1 : 0;
}
DET_DEV int64_t det_mk_output(const det_mk_ctx& c, int64_t it) { return c.gwarp + it * c.nwarps; }
