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
  det_vec_u32x4* ring;  // this warp's weight ring: depth x ring rows (outs) x 32 lanes x 16 bytes
  int depth;            // ring stages: 2 or 4
  float* area;          // the block's phase area (normalized rows, attention scratch, argmax)
  int gwarp, nwarps;    // this warp's index in the grid, warps in the grid
};

// This warp's weight ring and the block's phase area (det_mk_run's layout: the tile, every warp's
// ring, the area), from the shared-memory base itself rather than the context's pointers: ptxas
// then sees shared memory and reads them with LDS, where a pointer loaded from the context is
// generic (an address-space check on every load).
DET_DEV int det_mk_ring_slots(const det_mk_geometry& g) { return (int)(det_mk_ring_bytes(&g) / 16); }
DET_DEV det_vec_u32x4* det_mk_rings() { return (det_vec_u32x4*)(det_smem() + det_mk_smem_ring_offset()); }
DET_DEV det_vec_u32x4* det_mk_ring_of(const det_mk_geometry& g) { return det_mk_rings() + det_warp() * det_mk_ring_slots(g); }
DET_DEV float* det_mk_area_of(const det_mk_geometry& g) { return (float*)(det_mk_rings() + det_warps() * det_mk_ring_slots(g)); }

// The profiling timeline's stamps of this block at the coming synchronization (thread 0's count,
// read after a block barrier that follows its last increment), or null when the timeline is off or
// full. From the tile's copy of the timeline (det_mk_run), in shared memory.
DET_DEV uint64_t* det_mk_stamps() {
  const det_mk_tile& t = *(const det_mk_tile*)det_smem();
  return t.timeline && t.syncs < t.timeline_cap
             ? t.timeline + det_mk_stamp_slots(det_warps()) * (t.syncs * det_blocks() + det_block())
             : nullptr;
}

// Profiling: thread 0 stamps when the block's phase area first holds the phase's inputs (after the
// block barrier that ends their staging; a later area pass keeps the first stamp).
DET_DEV void det_mk_stamp_ready() {
  if (det_thread() != 0) return;
  uint64_t* s = det_mk_stamps();
  if (s && s[DET_MK_STAMP_READY] == 0) s[DET_MK_STAMP_READY] = det_globaltimer();
}

// The grid barrier after a phase, tagged for the profiling timeline (det_mk_program::timeline).
// Only thread 0 counts the synchronizations (in the tile, shared memory: a counter in the context
// would live in local memory, which the phases' references put it in); the count also gives the
// monotonic barrier (geometry barrier 1) the arrivals that complete this one. With the timeline on,
// each warp stamps its own arrival, written after the block barrier (which orders thread 0's last
// increment of the count before every warp's read of it).
DET_DEV_NOINLINE void det_mk_grid_sync(const det_mk_ctx& c, int32_t tag) {
  const det_mk_program& p = c.P->prog;
  uint64_t* slot = nullptr;
  if (p.timeline) {
    const uint64_t mine = det_globaltimer();  // this warp's work in the phase is done
    det_sync_block();                         // the block's slowest warp has arrived
    uint64_t* s = det_mk_stamps();
    if (s && det_lane() == 0) s[DET_MK_STAMP_WARP + det_warp()] = mine;
    if (s && det_thread() == 0) {
      slot = s;
      slot[DET_MK_STAMP_ARRIVE] = det_globaltimer();
      if (det_block() == 0) p.timeline_tag[c.tile->syncs] = tag;
    }
  }
  if (c.P->geo.barrier)
    det_sync_grid_counter(c.P->ws.barrier, det_thread() == 0 ? (uint64_t)(c.tile->syncs + 1) * det_blocks() : 0);
  else
    det_sync_grid(c.P->ws.barrier);
  if (slot) slot[DET_MK_STAMP_LEAVE] = det_globaltimer();
  if (det_thread() == 0) ++c.tile->syncs;
}

// The phase area's row layout, for the rows a GEMV reads (normalized or staged inputs): element k
// of a row sits at det_mk_area_at(k), the two 16-byte halves of each run of 8 elements whose index
// has bit 2 set swapped (an involution). Lane l reads run l of each block of 256 by two 16-byte
// loads, its lower half first; a quarter warp's loads then cover the 32 banks once: lanes 4..7
// read the upper halves' addresses where lanes 0..3 read the lower (same-order halves would put
// lane l and l + 4 on the same banks: 2-way conflicts). The values land in the lane's registers in
// element order, so the loop needs no register moves for it. A row starts at a multiple of 8.
DET_MK_HD int64_t det_mk_area_at(int64_t k) { return k ^ ((k >> 3) & 4); }

// Where this lane's run of a row in the area layout (when `area`, else a plain row) has its lower
// half: 0 or 4 floats past the run's start, where det_mk_area_at puts the run's first element (the
// lane's runs l + 32 i share the bit that decides it).
DET_DEV int det_mk_run_lower(bool area) {
  const int k = 8 * det_lane();
  return area ? (int)det_mk_area_at(k) - k : 0;
}

// Every thread of the block: its share of n floats (a multiple of 4, 16-byte aligned at both ends)
// requested into shared memory at dst (cp.async from L2: also for data written earlier in the
// launch, such as the KV cache and the residual stream; the caller commits and waits). With
// `area`, dst is one row in the area layout (det_mk_area_at; n the row's length, a multiple of 8):
// a 16-byte piece moves whole, so the layout costs nothing.
DET_DEV void det_mk_block_copy_l2(float* dst, const float* src, int64_t n, bool area = false) {
  for (int64_t e = 4 * (int64_t)det_thread(); e < n; e += 4 * (int64_t)det_threads())
    det_cp_async16_l2(dst + (area ? det_mk_area_at(e) : e), src + e);
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

// The canonical tree for NV reductions at once: NV / KEEP input rows of KEEP values each, row
// major (NV / KEEP a power of two, at most 32), its rows spread over the warp as it goes: each
// round pairs lane l with lane l ^ delta, as §9's tree pairs positions p and p + delta (a lane's
// index mod 2 delta is its position). While a lane holds more than one row it keeps half of them
// (the lower half when its delta bit is clear) and gets its partner's partials of that half: half
// its values in shuffles a round, not all. Every sum keeps the tree's order, the lower position's
// partial first, so each result is det_mk_warp_tree's. Leaves in v[0..KEEP) the results of row
// det_mk_tree_row<NV / KEEP>() on the lanes that name it, and returns v[0].
template <int NV, int KEEP = 1, int N = NV, int DELTA = DET_WARP / 2>
DET_DEV float det_mk_warp_tree_rows(float (&v)[NV]) {
  if constexpr (DELTA == 0) {
    return v[0];
  } else {
    const bool hi = (det_lane() & DELTA) != 0;
    constexpr bool split = N > KEEP;
    constexpr int H = split ? N / 2 : N;
    float got[H];
    for (int j = 0; j < H; ++j) got[j] = split && !hi ? v[H + j] : v[j];  // what the partner keeps
    det_shfl_xor_n(got, H, DELTA);
    for (int j = 0; j < H; ++j) {
      const float mine = split && hi ? v[H + j] : v[j];
      v[j] = hi ? det_add_f32(got[j], mine) : det_add_f32(mine, got[j]);
    }
    return det_mk_warp_tree_rows<NV, KEEP, H, DELTA / 2>(v);
  }
}

// The input row whose result det_mk_warp_tree_rows leaves on this lane, or -1: row r is on lanes
// r * 32 / NB .. (r + 1) * 32 / NB - 1, and the first of them answers for it.
template <int NB>
DET_DEV int det_mk_tree_row() {
  constexpr int lanes = DET_WARP / NB;
  return det_lane() % lanes == 0 ? det_lane() / lanes : -1;
}

// Lane's 8 inputs x[k..k+7] of its run (k = 8 lane + 256 i) from a 16-byte-aligned row: its lower
// half `lower` floats past xk (det_mk_run_lower: 4 for lanes 4..7 of each quarter warp in the phase
// area's layout, else 0), its upper half at the other 16 bytes; in element order either way.
DET_DEV void det_mk_load_x8(const float* xk, int lower, float (&xv)[8]) {
  const det_vec_f32x4 lo4 = det_load_f32x4(xk + lower), hi4 = det_load_f32x4(xk + (4 - lower));
  xv[0] = lo4.x, xv[1] = lo4.y, xv[2] = lo4.z, xv[3] = lo4.w;
  xv[4] = hi4.x, xv[5] = hi4.y, xv[6] = hi4.z, xv[7] = hi4.w;
}

// Canonical dot of two fp32 vectors of length K (K % 8 == 0), returned on every lane: lane l takes
// the runs 8l .. 8l + 7 of every block of 256 as one fma chain. With AREA, both are rows in the phase
// area's layout (det_mk_area_at), each run read as the GEMV reads it (det_mk_load_x8).
template <bool AREA = false>
DET_DEV float det_mk_warp_dot_f32(const float* a, const float* b, int64_t K) {
  float acc[1] = {0.0f};
  for (int64_t k = DET_REDUCE_RUN * det_lane(); k < K; k += DET_REDUCE_BLOCK) {
    if constexpr (AREA) {
      float av[8], bv[8];
      det_mk_load_x8(a + k, det_mk_run_lower(true), av);
      det_mk_load_x8(b + k, det_mk_run_lower(true), bv);
      for (int i = 0; i < DET_REDUCE_RUN; ++i) acc[0] = det_fma_f32(av[i], bv[i], acc[0]);
    } else {
      for (int i = 0; i < DET_REDUCE_RUN; ++i) acc[0] = det_fma_f32(det_ld(a + k + i), det_ld(b + k + i), acc[0]);
    }
    det_work_fma(DET_REDUCE_RUN);
  }
  det_mk_warp_tree<1>(acc);
  det_shfl_idx_n(acc, 1, 0);
  return acc[0];
}

// One warp: RMSNorm's factor of v[0..K) (docs/SPEC.md §13.2; K % 8 == 0), on every lane; AREA as
// for det_mk_warp_dot_f32.
template <bool AREA = false>
DET_DEV float det_mk_warp_rms_factor(const float* v, int64_t K, float eps) {
  return det_rmsnorm_factor_f32(det_mk_warp_dot_f32<AREA>(v, v, K), K, eps);
}

// One warp: v[0..K) = rmsnorm(v) * w in place (docs/SPEC.md §13.2; K % 8 == 0).
DET_DEV void det_mk_warp_rmsnorm(float* v, int64_t K, const float* w, float eps) {
  const float r = det_mk_warp_rms_factor(v, K, eps);
  for (int64_t k = det_lane(); k < K; k += DET_WARP) v[k] = det_rmsnorm_scale_f32(det_ld(v + k), r, det_ld(w + k));
  det_sync_warp();
}

// Input rows a GEMV takes per pass over a weight row: a tile of more rows is taken this many at a
// time (chunks), so a lane keeps at most outs x 16 accumulators.
#define DET_MK_GEMV_ROWS 16
DET_MK_HD int det_mk_gemv_chunks(int nb) { return (nb + DET_MK_GEMV_ROWS - 1) / DET_MK_GEMV_ROWS; }

// Calls f.template operator()<NB>() with NB the smallest of 1, 2, 4, 8, 16 holding n rows, or 16
// (DET_MK_GEMV_ROWS) for more: the GEMV then takes them in chunks of 16.
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
// (8 bf16, or 4 bytes of nf4 codes whose 8 elements share one block: blocks hold at least 8);
// the bf16 case needs nothing but the bytes.
DET_DEV void det_mk_decode8_bf16(const det_vec_u32x4& w4, float (&w)[8]) {
  const uint32_t words[4] = {w4.x, w4.y, w4.z, w4.w};
  for (int j = 0; j < 4; ++j) {
    w[2 * j] = det_bf16_to_f32((uint16_t)(words[j] & 0xffffu));
    w[2 * j + 1] = det_bf16_to_f32((uint16_t)(words[j] >> 16));
  }
}
DET_DEV void det_mk_decode8(const det_mk_row& row, int64_t K, int64_t k, const det_vec_u32x4& w4, float (&w)[8]) {
  if (row.w->bf16) return det_mk_decode8_bf16(w4, w);
  const det_matrix& m = *row.w;
  const int64_t i = row.r * K + k;
  const float scale = m.absmax[i >> m.block_shift];
  for (int j = 0; j < 4; ++j) {
    const uint32_t byte = (w4.x >> (8 * j)) & 0xffu;
    w[2 * j] = det_nf4_weight_f32(m.code[byte >> 4], scale);
    w[2 * j + 1] = det_nf4_weight_f32(m.code[byte & 15u], scale);
  }
}

// Item i of group g when a warp streams its n_items rows NO at a time: a group past the last item
// repeats it (a redundant copy, never emitted), so the loops over a group's NO rows have no branch.
template <int NO>
DET_DEV int64_t det_mk_group_item(int64_t n_items, int64_t g, int i) {
  const int64_t it = g * NO + i;
  return it < n_items ? it : n_items - 1;
}

// Where a group's NO weight rows start (item i of group g, det_mk_group_item), resolved once per
// group: the row function's matrix choice and index arithmetic, and the load of the matrix's
// pointers, stay out of the per-stage path. base[i] is row i's first byte (dense: its bf16
// elements; nf4: its codes).
template <int NO>
struct det_mk_group_rows {
  const uint8_t* base[NO];
  bool dense[NO];
};
template <int NO, class Row>
DET_DEV det_mk_group_rows<NO> det_mk_group_rows_of(Row row, int64_t K, int64_t n_items, int64_t g) {
  det_mk_group_rows<NO> r;
  DET_UNROLL for (int i = 0; i < NO; ++i) {
    const det_mk_row src = row(det_mk_group_item<NO>(n_items, g, i));
    r.dense[i] = src.w->bf16 != nullptr;
    r.base[i] = r.dense[i] ? (const uint8_t*)(src.w->bf16 + src.r * K) : src.w->nf4 + src.r * K / 2;
  }
  return r;
}

// Step s of a group's weight stream into slot `slot` of the warp's ring: for each of the group's NO
// rows the lane's 16 bytes (8 bf16, or 4 bytes of nf4 codes), when its columns are inside the row.
// Slot `slot` holds NO pieces per lane.
template <int NO>
DET_DEV void det_mk_issue_stage(det_vec_u32x4* ring, const det_mk_group_rows<NO>& src, int64_t K, int64_t s,
                                int64_t slot) {
  const int k = (int)s * 8 * DET_WARP + 8 * det_lane();  // K < 2^30: 2k bytes fit an int
  if (k >= K) return;
  DET_UNROLL for (int i = 0; i < NO; ++i) {
    det_vec_u32x4* dst = &ring[((int)slot * NO + i) * DET_WARP + det_lane()];
    if (src.dense[i]) det_cp_async16(dst, src.base[i] + 2 * k);
    else det_cp_async4(dst, src.base[i] + k / 2);
  }
}

// Ring stages per weight row of K columns: a stage is 16 bytes a lane, 8 columns.
DET_DEV int64_t det_mk_gemv_steps(int64_t K) { return (K + 8 * DET_WARP - 1) / (8 * DET_WARP); }

// The warp's GEMV rows, NO at a time (geometry outs, det_mk_gemv_outs): item it is the weight row
// row(it) (a det_mk_row; K % 8 == 0, rows 16-byte aligned when dense, 4-byte when nf4), dotted
// with the nb input rows x + b*ldx (in the phase area's layout when `area`, det_mk_area_at), NB at
// a time (nb > NB only when NB is DET_MK_GEMV_ROWS: each group of NO items is then streamed once
// per chunk of NB rows, after the first most likely from L2). Weights
// stream through the warp's ring of depth stages, a stage holding the same 16-byte piece of each
// of the group's NO rows (each lane copies and later reads only its own slots, so no warp barrier
// is needed); each weight read feeds a chunk's rows, and each 8 inputs a lane loads feed all NO
// rows. Every accumulator is its own fma chain in §9's order and its own tree, whatever NO and the
// chunks are. After each (group, chunk), in item order, emit(it, b, y) runs on the lane that holds
// input row b's canonical dot y (det_mk_tree_row<NB>() of the chunk), for every live row b: the
// rows' epilogues (a bias, an activation, a residual's load and store) run side by side, not in
// turn on lane 0, and a row's items come to the same lane. primed: det_mk_gemv_ahead has already
// issued (and committed) the first depth - 1 stages, before the barrier the phase began with.
template <int NO, int NB, class Row, class Emit>
DET_DEV void det_mk_gemv_rows(det_vec_u32x4* ring, int depth, int64_t n_items, int64_t K, Row row, const float* x,
                              int64_t ldx, bool area, int nb, Emit emit, bool primed) {
  if (n_items <= 0) return;
  const int lane = det_lane(), chunks = (nb + NB - 1) / NB, tree_row = det_mk_tree_row<NB>();
  const int lower = det_mk_run_lower(area);
  const int64_t steps = det_mk_gemv_steps(K), groups = (n_items + NO - 1) / NO, total = groups * chunks * steps;
  const int mask = depth - 1;
  int64_t issue_g = 0, issue_s = 0, issued = 0;
  int issue_c = 0;
  det_mk_group_rows<NO> issue_rows = det_mk_group_rows_of<NO>(row, K, n_items, 0);
  auto issue = [&](bool copy) {  // the next (group, chunk, step) into its ring slot, or an empty stage at the end
    if (issued < total) {
      if (copy) det_mk_issue_stage<NO>(ring, issue_rows, K, issue_s, issued & mask);
      if (++issue_s == steps) {
        issue_s = 0;
        if (++issue_c == chunks) {
          issue_c = 0;
          if (++issue_g * NO < n_items) issue_rows = det_mk_group_rows_of<NO>(row, K, n_items, issue_g);
        }
      }
    }
    ++issued;
    if (copy) det_cp_async_commit();
  };
  for (int f = 0; f < depth - 1; ++f) issue(!primed);

  float acc[NB * NO];  // acc[b * NO + i]: lane l is accumulator l of item i's dot with input row b (§9)
  DET_UNROLL for (int j = 0; j < NB * NO; ++j) acc[j] = 0.0f;
  int64_t g = 0, s = 0;
  int ch = 0, live = nb < NB ? nb : NB;  // the chunk, and its rows
  const float* xc = x;                   // its first input row
  // Group g's rows: a dense row decodes from the ring alone. Resolved again rather than copied from
  // issue_rows before the priming: the copy, live across it, took sm_90 to 248 registers and a
  // larger frame.
  det_mk_group_rows<NO> rows = det_mk_group_rows_of<NO>(row, K, n_items, 0);
  for (int64_t f = 0; f < total; ++f) {
    issue(true);
    if (depth == 4) det_cp_async_wait<3>();  // stage f has landed; depth - 1 stay in flight
    else det_cp_async_wait<1>();
    const int64_t k = s * 8 * DET_WARP + 8 * lane;
    if (k < K) {
      float w[NO][8];
      DET_UNROLL for (int i = 0; i < NO; ++i) {
        const det_vec_u32x4 w4 = det_ld(&ring[((f & mask) * NO + i) * DET_WARP + lane]);
        if (rows.dense[i]) det_mk_decode8_bf16(w4, w[i]);
        else det_mk_decode8(row(det_mk_group_item<NO>(n_items, g, i)), K, k, w4, w[i]);
      }
      DET_UNROLL for (int b = 0; b < NB; ++b) {
        if (b >= live) break;
        float xv[8];
        det_mk_load_x8(xc + b * ldx + k, lower, xv);
        DET_UNROLL for (int i = 0; i < NO; ++i)
          DET_UNROLL for (int t = 0; t < 8; ++t) acc[b * NO + i] = det_fma_f32(w[i][t], xv[t], acc[b * NO + i]);
        det_work_fma(8 * (int)(n_items - g * NO < NO ? n_items - g * NO : NO));  // a repeated item is not work
      }
    }
    if (++s == steps) {
      det_mk_warp_tree_rows<NB * NO, NO>(acc);
      DET_UNROLL for (int i = 0; i < NO; ++i)
        if (g * NO + i < n_items && tree_row >= 0 && tree_row < live) emit(g * NO + i, ch * NB + tree_row, acc[i]);
      DET_UNROLL for (int j = 0; j < NB * NO; ++j) acc[j] = 0.0f;
      s = 0;
      if (++ch == chunks) {
        ch = 0;
        if (++g * NO < n_items) rows = det_mk_group_rows_of<NO>(row, K, n_items, g);
      }
      live = nb - ch * NB < NB ? nb - ch * NB : NB;
      xc = x + ch * NB * ldx;
    }
  }
}

// The GEMV of the phases (det_mk_gemv_rows), its rows det_mk_gemv_outs at a time; x in the phase
// area's layout when `area`. The context's fields are read here once, not in each instantiation.
template <int NB, class Row, class Emit>
DET_DEV void det_mk_gemv(const det_mk_ctx& c, int64_t n_items, int64_t K, Row row, const float* x, int64_t ldx,
                         bool area, int nb, Emit emit, bool primed = false) {
  det_vec_u32x4* ring = det_mk_ring_of(c.P->geo);
  const int depth = c.depth, outs = det_mk_gemv_outs(&c.P->geo);
  if (outs == 1) det_mk_gemv_rows<1, NB>(ring, depth, n_items, K, row, x, ldx, area, nb, emit, primed);
  else if (outs == 2) det_mk_gemv_rows<2, NB>(ring, depth, n_items, K, row, x, ldx, area, nb, emit, primed);
  else det_mk_gemv_rows<4, NB>(ring, depth, n_items, K, row, x, ldx, area, nb, emit, primed);
}

// Weights ahead of their inputs (geometry ahead > 0; docs/SPEC.md §14.3): weights never depend on
// activations, so before the barrier a GEMV phase begins with, each warp issues that phase's
// first depth - 1 ring stages (ring: the phase's det_mk_gemv is then called primed and counts
// them as issued; NO rows at a time and `chunks` passes a group, as the phase will stream them)
// and hints the first l2_bytes of its weight rows into L2 (prefetch.global.L2, each lane a
// 128-byte line of 32), so the phase's first loads do not wait for DRAM. Scheduling only: what lands in the ring is what
// the GEMV would have copied itself.
template <int NO, class Row>
DET_DEV void det_mk_gemv_ahead(const det_mk_ctx& c, int64_t n_items, int64_t K, Row row, int chunks, bool ring,
                               int64_t l2_bytes) {
  if (n_items <= 0) return;
  const int64_t steps = det_mk_gemv_steps(K), total = (n_items + NO - 1) / NO * chunks * steps;
  if (ring)
    for (int64_t f = 0; f < c.depth - 1; ++f) {  // stage f is (group, chunk, step) as det_mk_gemv_rows counts
      if (f < total)
        det_mk_issue_stage<NO>(c.ring, det_mk_group_rows_of<NO>(row, K, n_items, f / (chunks * steps)), K, f % steps, f);
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
