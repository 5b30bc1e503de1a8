// det_megakernel.cuh: the megakernel, one persistent launch per program (det_megakernel.h):
// every row through every layer, the head, argmax and, in generate mode, every decode step,
// without returning to the host. docs/SPEC.md §14.
//
// The same source is compiled by nvcc for the GPU (det_infer_cuda/det_megakernel.cu) and by the
// host compiler for the SIMT emulation (megakernel/host/det_megakernel_emu.cpp); it touches
// CUDA only through det_simt.h.
//
// Work is split by output: a GEMV row, an (row, head) attention task, a vector element. Each
// output is computed whole by one warp (or one thread) in the contract's order: the 32
// accumulators of docs/SPEC.md §9 are the warp's 32 lanes, each taking its run of 8 consecutive
// elements per block of 256 (one 16-byte load of 8 bf16) as one fma chain, and the fixed tree is
// five rounds of shuffles by 16..1 lanes (a GEMV's input rows spread over the lanes as it goes,
// det_mk_warp_tree_rows, so each row's epilogue runs on its own lane). Which
// warp gets which output, how many blocks and warps there are, how deep the weight ring is and
// how many rows ride in a tile is scheduling only. Phases are separated by the grid barrier.
//
// Per tile and layer: QKV (each block normalizes the tile's rows into shared memory; warps stream
// Wq|Wk|Wv rows) | ROPE (qk-norm, rotation, KV-cache write) | ATTN (one warp per (row, head)) |
// O (Wo rows + residual) | MLP (norm; gate and up rows, act(gate)*up) | DOWN (Wdown rows +
// residual) |; then HEAD (final norm, lm_head rows) | and ARGMAX. Models with output norms
// (Gemma) keep the O and DOWN results aside and add them in an OUT_NORM phase (rmsnorm, residual,
// and Gemma-4's layer scalar). Gemma-4's per-layer inputs add PLE_PROJECT | PLE_FINISH | before
// layer 0 and PLE_GATE | PLE_PROJ | OUT_NORM | at the end of each layer; its KV-sharing layers skip
// the K and V rows and read an earlier layer's cache. With geometry ahead, each phase ends by
// requesting the next GEMV phase's first weights (its ring stages, and L2) before the barrier.
// With geometry outs a warp streams 2 or 4 weight rows at once; with geometry stage bit 1, O, DOWN
// and PLE_GATE first copy their input rows into the block's shared memory when they fit; with bit 2,
// a prompt tile's split attention copies each chunk's keys and values once per block for its rows.
//
// Split by concern: det_mk_warp.cuh (warp primitives and the GEMV ring), det_mk_steps.cuh (the
// steps and one tile's forward pass), and here the program loop (prefill tiles, decode steps).
#pragma once

#include "det_mk_steps.cuh"
#include "../model/det_program.h"

// ---- the program ------------------------------------------------------------------------------

// Thread 0 of each block: the prefill tile of program rows r0 .. r0 + n - 1.
DET_DEV void det_mk_build_prefill_tile(const det_mk_params& P, det_mk_tile& t, int r0) {
  const det_mk_program& p = P.prog;
  const int64_t V = P.model.vocab;
  const bool gen = p.max_new > 0;
  t.n = (int)(p.n_rows - r0 < P.geo.tile_rows ? p.n_rows - r0 : P.geo.tile_rows);
  t.n_want = 0;
  t.rope_in_attn = P.geo.attn > 0;
  for (int i = 0; i < t.n; ++i) {
    t.token[i] = p.tokens[r0 + i];
    t.pos[i] = p.positions[r0 + i];
    t.seq[i] = p.seq[r0 + i];
    for (int j = 0; j < i && t.rope_in_attn; ++j) t.rope_in_attn = t.seq[j] != t.seq[i];
    if (!p.want[r0 + i]) continue;
    const int j = t.n_want++, s = t.seq[i];
    t.want_row[j] = i;
    if (!gen) t.dst[j] = p.logits + (t.want_seen + j) * V;
    else t.dst[j] = p.step_logits ? p.step_logits + s * p.max_new * V : P.ws.logits + j * V;
    if (gen) t.next_pos[s] = t.pos[i] + 1;
  }
  t.attn_staged = !t.rope_in_attn && det_mk_attn_stage_floats(&P.model, &P.geo) > 0;
  t.want_seen += t.n_want;
}

// Thread 0 of each block: records step `step`'s tokens (block 0 writes the outputs), retires the
// sequences that stop (det_decode_continues), and lists the others, with the token each feeds back.
DET_DEV void det_mk_plan_decode_step(const det_mk_params& P, det_mk_tile& t, int64_t step) {
  const det_mk_program& p = P.prog;
  t.n_step = 0;
  for (int s = 0; s < p.n_seq; ++s) {
    if (!t.live[s]) continue;
    const int32_t id = P.ws.next_token[s];
    if (det_block() == 0) {
      p.out_tokens[s * p.max_new + step] = id;
      p.out_lengths[s] = step + 1;
    }
    if (!det_decode_continues(id, step, p.max_new, p.stop_ids, p.n_stop)) {
      t.live[s] = 0;
      continue;
    }
    t.step_seq[t.n_step] = s;
    t.step_token[t.n_step++] = id;
  }
}

// Thread 0 of each block: the tile of the step's rows r0 .. r0 + n - 1 (every row wants logits:
// the logits of token step + 1).
DET_DEV void det_mk_build_decode_tile(const det_mk_params& P, det_mk_tile& t, int64_t step, int r0) {
  const det_mk_program& p = P.prog;
  const int64_t V = P.model.vocab;
  t.n = t.n_step - r0 < P.geo.tile_rows ? t.n_step - r0 : P.geo.tile_rows;
  t.n_want = t.n;
  t.rope_in_attn = P.geo.attn > 0;  // one row per live sequence
  t.attn_staged = 0;
  for (int r = 0; r < t.n; ++r) {
    const int s = t.step_seq[r0 + r];
    t.token[r] = t.step_token[r0 + r];
    t.pos[r] = t.next_pos[s]++;
    t.seq[r] = s;
    t.want_row[r] = r;
    t.dst[r] = p.step_logits ? p.step_logits + (s * p.max_new + step + 1) * V : P.ws.logits + r * V;
  }
}

DET_DEV void det_mk_run(const det_mk_params& P) {
  det_mk_tile* tile = (det_mk_tile*)det_smem();
  det_mk_ctx c;
  c.P = &P;
  c.tile = tile;
  c.depth = P.geo.ring;
  c.ring = det_mk_ring_of(P.geo);
  c.area = det_mk_area_of(P.geo);
  c.gwarp = det_block() * det_warps() + det_warp();
  c.nwarps = det_blocks() * det_warps();

  const det_mk_program& p = P.prog;
  const bool gen = p.max_new > 0;
  if (det_thread() == 0) {
    for (int s = 0; s < DET_MK_SEQ_MAX; ++s) tile->live[s] = s < p.n_seq;
    tile->syncs = 0;
    tile->want_seen = 0;
    tile->timeline = p.timeline;
    tile->timeline_cap = p.timeline_cap;
    tile->head = det_dense_matrix(P.model.lm_head);
  }
  // Loop state as int, the count of wanted rows in the tile: the body keeps what it holds across a
  // phase call in a register of every phase (a 64-bit value, two). Rows < 2^31: at most 16
  // sequences of at most 2^20 + 1 positions (det_program_check).
  for (int r0 = 0; r0 < (int)p.n_rows; r0 += P.geo.tile_rows) {
    if (det_thread() == 0) det_mk_build_prefill_tile(P, *tile, r0);
    det_sync_block();
    det_mk_forward_tile(c);
    if (gen) det_mk_phase_argmax(c);
    det_sync_block();  // every thread is done with the tile before thread 0 rebuilds it
  }
  if (!gen) return;
  det_mk_grid_sync(c, -1);
  for (int step = 0;; ++step) {
    if (det_thread() == 0) det_mk_plan_decode_step(P, *tile, step);
    det_sync_block();
    if (tile->n_step == 0) break;
    for (int r0 = 0; r0 < tile->n_step; r0 += P.geo.tile_rows) {
      if (det_thread() == 0) det_mk_build_decode_tile(P, *tile, step, r0);
      det_sync_block();
      det_mk_forward_tile(c);
      det_mk_phase_argmax(c);
      det_sync_block();
    }
    det_mk_grid_sync(c, -1);  // every block's argmax results are visible to every block
  }
}
