// det_mk_steps.cuh: the megakernel's steps (docs/SPEC.md §14): one phase per kind of step of the
// layer plan (model/det_layer_plan.h: EMBED, PLE_PROJECT, PLE_FINISH, QKV, ROPE, ATTEND, MLP,
// PLE_GATE, RESIDUAL with its OUT_NORM, HEAD), the sampled or greedy pick, and
// det_mk_forward_tile, which runs one tile of rows through the plan.
#pragma once

#include "../contract/det_act.h"
#include "../contract/det_argmax.h"
#include "../contract/det_model_ops.h"
#include "../contract/det_norm.h"
#include "../contract/det_trig.h"
#include "det_mk_attn_group.cuh"
#include "det_mk_sample.cuh"
#include "det_mk_warp.cuh"

// ---- phases -------------------------------------------------------------------------------------

// Element k of token id's embedding row, widened and scaled (docs/SPEC.md §13.3 step 1).
DET_DEV float det_mk_embedding(const det_llama_model& m, int32_t id, int64_t k) {
  return det_embed_f32(det_ld(m.embed + (int64_t)id * m.hidden + k), m.embed_scale);
}

// Every block: area rows j < nb = source rows first + j, in the area's layout (det_mk_area_at). The
// source of row i is tile row src_row[i] (or i when src_row is null): the residual stream, or the
// token's embedding widened and scaled.
// The residual stream's rows are copied with cp.async (16 bytes a thread at a time, from L2): every
// load in flight at once, none held in registers. A plain load and store per element would take a
// round trip each, one after another: the compiler cannot tell that the area and the stream do
// not alias, so each store holds the next load (ceil(hidden / threads) round trips on the phase's
// path: 3 for SmolLM2-135M, 8 for Llama-3.2-1B). The wait also covers the ring stages the phase
// primed before it (det_mk_prime), which were requested first, and any copy the caller issued
// (`pending`: the norm's weights).
DET_DEV void det_mk_load_rows(const det_mk_ctx& c, int first, int nb, const int32_t* src_row, bool from_embed,
                              bool pending = false) {
  const det_llama_model& m = c.P->model;
  const int64_t H = m.hidden;
  for (int j = 0; j < nb; ++j) {
    const int64_t r = src_row ? src_row[first + j] : first + j;
    float* dst = c.area + j * H;
    if (from_embed) {  // layer 0's input, widened
      const int32_t id = c.tile->token[r];
      for (int64_t k = det_thread(); k < H; k += det_threads()) dst[det_mk_area_at(k)] = det_mk_embedding(m, id, k);
      continue;
    }
    det_mk_block_copy_l2(dst, c.P->ws.x + r * H, H, true);
  }
  if (!from_embed || pending) {
    det_cp_async_commit();
    det_cp_async_wait<0>();
  }
  det_sync_block();
}

// Every block: area rows j < nb = rmsnorm(source row first + j) * w (docs/SPEC.md §13.2) in the
// area's layout, sources as in det_mk_load_rows (at layer 0 the embedding, which layer 0 also
// writes to the residual stream). A warp per row computes the row's factor (the canonical dot);
// then every thread of the block scales its share of the elements. When the area has a row to
// spare (nb below its rows: a decode step, a short prompt), the weights w are copied there with
// the rows (cp.async, one round trip for both) and the scale reads shared memory; else each
// thread reads its share of w from global memory, one round trip per element it scales, one after
// another: the compiler cannot tell that the area's stores do not alias w (3 for SmolLM2-135M, 8
// for Llama-3.2-1B at 256 threads; holding them in registers from the start spilled sm_120's
// kernel).
DET_DEV void det_mk_norm_rows(const det_mk_ctx& c, int first, int nb, const int32_t* src_row, bool from_embed,
                              const float* w) {
  const int64_t H = c.P->model.hidden;
  float* factor = c.area + det_mk_norm_factor_offset(&c.P->model, &c.P->geo);
  // Row nb of the area is free (H % 8 == 0: 16-byte aligned); cp.async needs w 16-byte aligned too
  // (a norm tensor is any contiguous fp32 tensor: det_mk_check_alignment checks only the matrices).
  const bool spare = nb < det_mk_area_rows(&c.P->geo) && (uintptr_t)w % 16 == 0;
  if (spare) det_mk_block_copy_l2(c.area + nb * H, w, H, true);  // in the rows' layout, element for element
  const float* ws = spare ? c.area + nb * H : w;
  det_mk_load_rows(c, first, nb, src_row, from_embed, spare);
  for (int j = det_warp(); j < nb; j += det_warps()) {
    const float r = det_mk_warp_rms_factor<true>(c.area + j * H, H, c.P->model.rms_eps);
    if (det_lane() == 0) factor[j] = r;
  }
  det_sync_block();
  for (int j = 0; j < nb; ++j) {
    float* v = c.area + j * H;
    const float r = factor[j];
    for (int64_t p = det_thread(); p < H; p += det_threads())  // p holds element det_mk_area_at(p)
      v[p] = det_rmsnorm_scale_f32(v[p], r, det_ld(ws + (spare ? p : det_mk_area_at(p))));
  }
  det_sync_block();
  det_mk_stamp_ready();
}

// The phases whose inputs are copied or normalized into the block's phase area (QKV, MLP, HEAD,
// PLE_PROJECT) take their nb rows det_mk_area_rows at a time: each pass fills the area with rows
// first..first + n - 1 and runs its GEMV over them, so a tile larger than the area (geometry
// area_rows) streams the warp's weight rows once per pass; each output is the same dot, in the same
// order, whichever pass computes it. Returns the pass's n. Before a pass refills the area, every
// warp of the block has finished reading it. (A plain loop in each phase: a lambda holding the
// pass, outlined by the compiler, kept its captures in local memory.)
DET_DEV int det_mk_area_pass(const det_mk_ctx& c, int nb, int first) {
  if (first > 0) det_sync_block();
  const int most = det_mk_area_rows(&c.P->geo);
  return nb - first < most ? nb - first : most;
}

// The input rows of a GEMV phase that reads them from global memory (RESIDUAL's att or act,
// PLE_GATE's residual stream), nb rows of K: with geometry stage bit 1, when they fit the block's phase
// area, every block copies them there once (16-byte loads, in the area's layout), so that its warps
// read shared memory for each output instead of global memory; else the global rows. Returns where
// to read them (in the area's layout unless it is `in`).
DET_DEV const float* det_mk_stage_rows(const det_mk_ctx& c, const float* in, int nb, int64_t K) {
  if (!(c.P->geo.stage & DET_MK_STAGE_INPUTS) || (size_t)nb * (size_t)K > det_mk_area_floats(&c.P->model, &c.P->geo))
    return in;
  float* area = c.area;  // read once: a store through it might alias the by-reference context
  // cp.async: every load in flight at once (det_mk_load_rows says why not a load and a store each)
  for (int j = 0; j < nb; ++j) det_mk_block_copy_l2(area + j * K, in + j * K, K, true);
  det_cp_async_commit();
  det_cp_async_wait<0>();
  det_sync_block();
  det_mk_stamp_ready();
  return area;
}

// EMBED, spread over the grid: the residual stream starts as the embeddings, and each row's rope
// (sin, cos) table is computed once (docs/SPEC.md §7). No barrier follows: the next step
// (reads_embedding) takes the embedding rows themselves.
// Its own function: inlined, its grid indices were hoisted out of the decode loop and held across
// every phase call (det_mk_run).
DET_DEV_NOINLINE void det_mk_embed_rows(const det_mk_ctx& c) {
  const det_llama_model& m = c.P->model;
  const det_mk_tile& t = *c.tile;
  const int64_t H = m.hidden, pairs = m.rope_pairs;  // every table's pairs, per row
  const int64_t gt = (int64_t)det_block() * det_threads() + det_thread(), gn = (int64_t)det_blocks() * det_threads();
  for (int64_t e = gt; e < t.n * H; e += gn) c.P->ws.x[e] = det_mk_embedding(m, t.token[e / H], e % H);
  for (int64_t e = gt; e < t.n * pairs; e += gn) {
    const det_sincos_f32 sc = det_sincos_f64(det_rope_angle_f64(t.pos[e / pairs], m.inv_freq[e % pairs]));
    c.P->ws.sincos[2 * e] = sc.s;
    c.P->ws.sincos[2 * e + 1] = sc.c;
  }
}

// QKV: q, k, v (rows x outputs) = normalized rows times Wq, Wk, Wv (one range of rows), plus the
// biases when the model has them; a layer that reads another's K/V (Gemma-4) computes q only (s.n
// outputs).
// The weight rows of the GEMV steps: row(it) is this warp's item it, row.output(it) the output it
// computes (outputs dealt round-robin over the grid's warps, det_mk_items). Built once per phase, by the phase and
// by det_mk_weights_ahead, so that the GEMV's loop and the phase's epilogue call them without
// reading the context (a reference, reloaded from local memory after each cp.async) or the layer.
// QKV: output n of q|k|v is a row of Wq, Wk or Wv.
struct det_mk_qkv_rows {
  const det_llama_layer* L;
  int64_t QD, KVD;
  int gwarp, nwarps;
  DET_DEV int64_t output(int64_t it) const { return gwarp + it * nwarps; }
  DET_DEV det_mk_row operator()(int64_t it) const {
    const int64_t n = output(it);
    return n < QD ? det_mk_row{&L->wq, n} : n < QD + KVD ? det_mk_row{&L->wk, n - QD} : det_mk_row{&L->wv, n - QD - KVD};
  }
};
DET_DEV det_mk_qkv_rows det_mk_qkv_rows_of(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const det_llama_layer* L = &m.layers[s.layer];
  return {L, m.n_heads * L->head_dim, m.n_kv_heads * L->head_dim, c.gwarp, c.nwarps};
}
// MLP: per output the gate row (even items), then the up row (odd).
struct det_mk_mlp_rows {
  const det_llama_layer* L;
  int gwarp, nwarps;
  DET_DEV int64_t output(int64_t it) const { return gwarp + it / 2 * nwarps; }
  DET_DEV det_mk_row operator()(int64_t it) const { return {it % 2 ? &L->w_up : &L->w_gate, output(it)}; }
};
DET_DEV det_mk_mlp_rows det_mk_mlp_rows_of(const det_mk_ctx& c, const det_step& s) {
  return {&c.P->model.layers[s.layer], c.gwarp, c.nwarps};
}
// The other GEMV steps: output n is row n of one matrix (the head's is the tile's dense copy).
struct det_mk_matrix_rows {
  const det_matrix* w;
  int gwarp, nwarps;
  DET_DEV int64_t output(int64_t it) const { return gwarp + it * nwarps; }
  DET_DEV det_mk_row operator()(int64_t it) const { return {w, output(it)}; }
};
DET_DEV det_mk_matrix_rows det_mk_matrix_rows_of(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const det_matrix* w = s.kind == DET_STEP_RESIDUAL      ? &s.w
                        : s.kind == DET_STEP_HEAD        ? &c.tile->head
                        : s.kind == DET_STEP_PLE_PROJECT ? &m.ple_model_proj
                                                         : &m.layers[s.layer].ple_gate;
  return {w, c.gwarp, c.nwarps};
}

DET_DEV_NOINLINE void det_mk_phase_qkv(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const det_llama_layer& L = m.layers[s.layer];
  const det_mk_workspace& ws = c.P->ws;
  const det_mk_qkv_rows row = det_mk_qkv_rows_of(c, s);
  const int64_t QD = row.QD, KVD = row.KVD;
  for (int first = 0; first < c.tile->n; first += det_mk_area_rows(&c.P->geo)) {
    const int nb = det_mk_area_pass(c, c.tile->n, first);
    det_mk_norm_rows(c, first, nb, nullptr, s.reads_embedding, L.attn_norm);
    det_mk_with_nb(nb, [&]<int NB>() {
      auto emit = [&](int64_t it, int j, float y) {  // on the lane of area row j, tile row first + j
        const int64_t n = row.output(it), b = first + j;
        // Output n of q, k or v: its buffer, row length, index in the row and bias (or null).
        const bool is_q = n < QD, is_k = !is_q && n < QD + KVD;
        float* out = is_q ? ws.q : is_k ? ws.k : ws.v;
        const int64_t len = is_q ? QD : KVD, i = is_q ? n : is_k ? n - QD : n - QD - KVD;
        const float* bias = is_q ? L.bq : is_k ? L.bk : L.bv;
        out[b * len + i] = bias ? det_add_f32(y, det_ld(bias + i)) : y;
      };
      det_mk_gemv<NB>(c, det_mk_items(c, s.n), s.k, row, det_mk_area_of(c.P->geo), m.hidden, true, nb, emit,
                      first == 0);
    });
  }
}

// ROPE: per (row, head): q and k heads get qk-norm (when the model has it) and the rotation, v
// heads their norm (Gemma-4); k and v heads are written to the row's KV cache at its position. A
// layer that reads another's K/V has q heads only.
DET_DEV_NOINLINE void det_mk_phase_rope(const det_mk_ctx& c, int64_t l) {
  const det_llama_model& m = c.P->model;
  const det_llama_layer& L = m.layers[l];
  const det_mk_workspace& ws = c.P->ws;
  const det_mk_tile& t = *c.tile;
  const int64_t D = L.head_dim, QD = m.n_heads * D, KVD = m.n_kv_heads * D;
  const det_rope_table& rope = m.rope[L.rope_table];
  const int64_t per_row = m.n_heads + (L.kv_source == l ? 2 * m.n_kv_heads : 0);
  const int lane = det_lane();
  for (int64_t task = c.gwarp; task < t.n * per_row; task += c.nwarps) {
    const int64_t b = task / per_row, j = task % per_row;
    const det_mk_seq& sq = c.P->prog.seqs[t.seq[b]];
    const int64_t pos = t.pos[b];
    if (j >= m.n_heads + m.n_kv_heads) {
      const int64_t h = j - m.n_heads - m.n_kv_heads;
      float* vec = ws.v + b * KVD + h * D;
      if (L.v_norm) det_mk_warp_rmsnorm(vec, D, L.v_norm, m.rms_eps);
      const int64_t at = det_kv_head_base(L, sq.capacity, h);
      for (int64_t d = lane; d < D; d += DET_WARP) sq.v[at + det_kv_value_at(D, pos, d)] = det_ld(vec + d);
      continue;
    }
    const bool is_q = j < m.n_heads;
    const int64_t h = is_q ? j : j - m.n_heads;
    float* vec = is_q ? ws.q + b * QD + h * D : ws.k + b * KVD + h * D;
    const float* norm = is_q ? L.q_norm : L.k_norm;
    if (norm) det_mk_warp_rmsnorm(vec, D, norm, m.rms_eps);
    const float* sc = ws.sincos + 2 * (b * m.rope_pairs + rope.offset);
    for (int64_t i = lane; i < rope.pairs; i += DET_WARP)
      det_rope_rotate_f32(&vec[i], &vec[i + rope.half], det_sincos_f32{det_ld(sc + 2 * i), det_ld(sc + 2 * i + 1)});
    det_sync_warp();
    if (is_q) continue;
    const int64_t at = det_kv_head_base(L, sq.capacity, h);
    for (int64_t d = lane; d < D; d += DET_WARP) sq.k[at + det_kv_key_at(sq.capacity, D, pos, d)] = det_ld(vec + d);
  }
}

// RESIDUAL: rows of W (H x K) over the step's input rows (att or act), plus the step's bias; the
// result is added to the residual stream (then scaled by the layer scalar, if the step has one),
// or, when the step normalizes it first (Gemma), kept in ws.out for det_mk_phase_out_norm.
DET_DEV_NOINLINE void det_mk_phase_residual_gemv(const det_mk_ctx& c, const det_step& s) {
  const int64_t H = c.P->model.hidden;
  float* x = c.P->ws.x;
  float* out = c.P->ws.out;
  const int nb = c.tile->n;
  const float* src = s.input == DET_IN_ATT ? c.P->ws.att : c.P->ws.act;
  const float* in = det_mk_stage_rows(c, src, nb, s.k);
  const bool staged = in != src;  // in the area's layout (compared here: c.area is reloaded from the frame)
  const det_mk_matrix_rows row = det_mk_matrix_rows_of(c, s);
  det_mk_with_nb(nb, [&]<int NB>() {
    auto emit = [&](int64_t it, int b, float y) {  // on the lane of row b
      const int64_t n = row.output(it);
      const float yb = s.bias ? det_add_f32(y, det_ld(s.bias + n)) : y;
      if (s.norm) {
        out[b * H + n] = yb;
        return;
      }
      const float sum = det_add_f32(det_ld(x + b * H + n), yb);
      x[b * H + n] = s.scalar ? det_mul_f32(sum, det_ld(s.scalar)) : sum;
    };
    det_mk_gemv<NB>(c, det_mk_items(c, s.n), s.k, row, in, s.k, staged, nb, emit, true);
  });
}

// OUT_NORM, the second half of a RESIDUAL step with an output norm (Gemma): one warp per row,
// x += rmsnorm(out) * w, then (Gemma-4's layer scalar, on the layer's last residual step)
// x = fl(x * scalar). Rows first, first + stride, ...: a warp of the grid (its own phase) or of
// the last block to finish the GEMV (det_mk_out_norm_last).
DET_DEV_NOINLINE void det_mk_phase_out_norm(const det_mk_ctx& c, const float* w, const float* scalar, int first,
                                            int stride) {
  const det_llama_model& m = c.P->model;
  const int64_t H = m.hidden;
  for (int64_t b = first; b < c.tile->n; b += stride) {
    const float* y = c.P->ws.out + b * H;
    float* x = c.P->ws.x + b * H;
    const float r = det_mk_warp_rms_factor(y, H, m.rms_eps);
    for (int64_t k = det_lane(); k < H; k += DET_WARP) {
      x[k] = det_add_f32(det_ld(x + k), det_rmsnorm_scale_f32(det_ld(y + k), r, det_ld(w + k)));
      if (scalar) x[k] = det_mul_f32(x[k], *scalar);
    }
  }
}

// Geometry barrier 1: whether this block is the grid's last to finish a RESIDUAL step's GEMV whose
// output norm follows, and so holds every output of the tile's rows (SPEC §14.2). Once the block's
// warps are done (a block barrier), warp 0 counts the block's arrival (det_warp_arrive: the block's
// writes released, the earlier blocks' acquired) and the last block sets the count back to zero
// (every block has arrived; the next arrivals come after a grid barrier). The answer reaches the
// block through its phase area, free once the GEMV is done.
DET_DEV_NOINLINE bool det_mk_out_norm_last(const det_mk_ctx& c) {
  int* last = (int*)det_mk_area_of(c.P->geo);
  det_sync_block();
  if (det_warp() == 0) {
    const unsigned int before = det_warp_arrive(c.P->ws.out_count);
    if (det_lane() == 0) {
      *last = before == (unsigned int)det_blocks() - 1;
      if (*last) *c.P->ws.out_count = 0;
    }
  }
  det_sync_block();
  return det_ld(last) != 0;
}

// MLP: normalized rows; per output n the gate row then the up row, then act(gate) * up.
DET_DEV_NOINLINE void det_mk_phase_mlp(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const det_llama_layer& L = m.layers[s.layer];
  const int64_t I = s.n;
  float* act = c.P->ws.act;
  const det_mk_mlp_rows row = det_mk_mlp_rows_of(c, s);
  for (int first = 0; first < c.tile->n; first += det_mk_area_rows(&c.P->geo)) {
    const int nb = det_mk_area_pass(c, c.tile->n, first);
    det_mk_norm_rows(c, first, nb, nullptr, false, L.mlp_norm);
    det_mk_with_nb(nb, [&]<int NB>() {
      // Row b's gate waits in act for its up row (the next item; the same lane, whichever chunk of
      // the tile's rows b is in): a register would hold only one chunk's.
      auto emit = [&](int64_t it, int j, float y) {  // on the lane of area row j, tile row first + j
        float* a = act + (first + j) * I + row.output(it);
        if (it % 2 == 0) *a = y;
        else *a = det_mul_f32(det_act_f32((int)m.act, *a), y);
      };
      det_mk_gemv<NB>(c, 2 * det_mk_items(c, I), s.k, row, det_mk_area_of(c.P->geo), m.hidden, true, nb, emit,
                      first == 0);
    });
  }
}

// PLE_PROJECT (Gemma-4, before layer 0; docs/SPEC.md §13.7): ws.ple (rows, n_layers * P) =
// fl(x·Wproj * rsqrt(H)) from each block's copy of the rows (the embedded rows: reads_embedding).
DET_DEV_NOINLINE void det_mk_phase_ple_project(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const int64_t H = m.hidden, LP = s.n;
  const float scale = det_ple_scales_of(H, m.ple_dim).proj;
  float* ple = c.P->ws.ple;
  const det_mk_matrix_rows row = det_mk_matrix_rows_of(c, s);
  for (int first = 0; first < c.tile->n; first += det_mk_area_rows(&c.P->geo)) {
    const int nb = det_mk_area_pass(c, c.tile->n, first);
    det_mk_load_rows(c, first, nb, nullptr, s.reads_embedding);
    det_mk_stamp_ready();
    det_mk_with_nb(nb, [&]<int NB>() {
      auto emit = [&](int64_t it, int j, float y) {  // on the lane of area row j, tile row first + j
        ple[(first + j) * LP + row.output(it)] = det_mul_f32(y, scale);
      };
      det_mk_gemv<NB>(c, det_mk_items(c, LP), s.k, row, det_mk_area_of(c.P->geo), H, true, nb, emit, first == 0);
    });
  }
}

// PLE_FINISH: one warp per (row, layer) slice of P: RMSNorm(slice), then det_ple_combine_f32 with
// the token's per-layer embedding.
DET_DEV_NOINLINE void det_mk_phase_ple_finish(const det_mk_ctx& c) {
  const det_llama_model& m = c.P->model;
  const det_mk_tile& t = *c.tile;
  const int64_t P = m.ple_dim, LP = m.n_layers * P;
  const det_ple_scales k = det_ple_scales_of(m.hidden, P);
  for (int64_t task = c.gwarp; task < t.n * m.n_layers; task += c.nwarps) {
    const int64_t b = task / m.n_layers, l = task % m.n_layers;
    float* y = c.P->ws.ple + b * LP + l * P;
    const uint16_t* e = m.ple_embed + (int64_t)t.token[b] * LP + l * P;
    det_mk_warp_rmsnorm(y, P, m.ple_proj_norm, m.rms_eps);
    for (int64_t i = det_lane(); i < P; i += DET_WARP) y[i] = det_ple_combine_f32(y[i], e[i], k);
  }
}

// PLE_GATE (Gemma-4, after the MLP): act (rows, P) = gelu(x·Wgate) * the layer's per-layer input,
// from the residual stream itself (not normalized).
DET_DEV_NOINLINE void det_mk_phase_ple_gate(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const int64_t l = s.layer;
  const int64_t H = m.hidden, P = s.n, LP = m.n_layers * P;
  const float* ple = c.P->ws.ple;
  float* act = c.P->ws.act;
  const int nb = c.tile->n;
  const float* x = det_mk_stage_rows(c, c.P->ws.x, nb, H);
  const bool staged = x != c.P->ws.x;  // in the area's layout
  const det_mk_matrix_rows row = det_mk_matrix_rows_of(c, s);
  det_mk_with_nb(nb, [&]<int NB>() {
    auto emit = [&](int64_t it, int b, float y) {  // on the lane of row b
      const int64_t n = row.output(it);
      act[b * P + n] = det_mul_f32(det_act_f32(DET_ACT_GELU_TANH, y), det_ld(ple + b * LP + l * P + n));
    };
    det_mk_gemv<NB>(c, det_mk_items(c, P), s.k, row, x, H, staged, nb, emit, true);
  });
}

// HEAD: final norm of the wanted rows and the lm_head rows; logits go to the tile's destinations.
DET_DEV_NOINLINE void det_mk_phase_head(const det_mk_ctx& c, const det_step& s) {
  const det_llama_model& m = c.P->model;
  const det_mk_tile& t = *c.tile;
  const det_mk_matrix_rows row = det_mk_matrix_rows_of(c, s);
  for (int first = 0; first < t.n_want; first += det_mk_area_rows(&c.P->geo)) {
    const int nw = det_mk_area_pass(c, t.n_want, first);
    det_mk_norm_rows(c, first, nw, t.want_row, false, m.final_norm);
    det_mk_with_nb(nw, [&]<int NB>() {
      auto emit = [&](int64_t it, int j, float y) {  // on the lane of area row j, wanted row first + j
        t.dst[first + j][row.output(it)] = m.softcap ? det_softcap_f32(y, det_ld(m.softcap)) : y;
      };
      det_mk_gemv<NB>(c, det_mk_items(c, s.n), s.k, row, det_mk_area_of(c.P->geo), m.hidden, true, nw, emit,
                      first == 0);
    });
  }
}

// ARGMAX: block j (mod grid) picks wanted row j's next token and records it for its sequence. A
// greedy pick ranks the logits by the total order of det_argmax.h over the block's threads (any
// partition gives the same id); a sampled one has the block compute z, m and e, rank them and walk
// the ranks (det_mk_sample.cuh; docs/SPEC.md §15).
DET_DEV_NOINLINE void det_mk_phase_argmax(const det_mk_ctx& c) {
  const det_mk_tile& t = *c.tile;
  const det_mk_program& p = c.P->prog;
  const int64_t V = c.P->model.vocab;
  float* best_v = c.area;
  int32_t* best_i = (int32_t*)(c.area + det_warps());
  for (int j = det_block(); j < t.n_want; j += det_blocks()) {
    const float* lg = t.dst[j];
    const int row = t.want_row[j], s = t.seq[row];
    if (p.sample && !det_sample_greedy(p.sample[s]) && det_mk_sample(c, lg, p.sample[s], t.pos[row] + 1, j, s))
      continue;
    float v = det_ld(lg);
    int32_t id = 0;
    // Four logits per 16-byte load where the row is aligned, the rest one at a time: a compare
    // waits for its load, so a loop of one load and one compare took a round trip per logit (192 in
    // a row per thread for a 49,152-token vocabulary). Any order of the compares gives the same id
    // (a total order). (Eight or four scalar loads held at once spilled the kernel's entry.)
    const int64_t V4 = ((uintptr_t)lg & 15) == 0 ? V / 4 * 4 : 0;
    for (int64_t n = 4 * (int64_t)det_thread(); n < V4; n += 4 * (int64_t)det_threads()) {
      const det_vec_f32x4 q = det_load_f32x4(lg + n);
      if (det_argmax_better(q.x, n, v, id)) v = q.x, id = (int32_t)n;
      if (det_argmax_better(q.y, n + 1, v, id)) v = q.y, id = (int32_t)(n + 1);
      if (det_argmax_better(q.z, n + 2, v, id)) v = q.z, id = (int32_t)(n + 2);
      if (det_argmax_better(q.w, n + 3, v, id)) v = q.w, id = (int32_t)(n + 3);
    }
    for (int64_t n = V4 + det_thread(); n < V; n += det_threads()) {
      const float ln = det_ld(lg + n);
      if (det_argmax_better(ln, n, v, id)) v = ln, id = (int32_t)n;
    }
    for (int delta = DET_WARP / 2; delta >= 1; delta >>= 1) {
      float ov = v;
      int32_t oi = id;
      det_shfl_down_n(&ov, 1, delta);
      det_shfl_down_n(&oi, 1, delta);
      if (det_argmax_better(ov, oi, v, id)) v = ov, id = oi;
    }
    if (det_lane() == 0) best_v[det_warp()] = v, best_i[det_warp()] = id;
    det_sync_block();
    if (det_thread() == 0) {
      for (int w = 1; w < det_warps(); ++w)
        if (det_argmax_better(best_v[w], best_i[w], v, id)) v = best_v[w], id = best_i[w];
      c.P->ws.next_token[s] = id;
    }
    det_sync_block();
  }
}

// One tile through the model's layer plan: one phase per step, a grid barrier after each (none
// after EMBED, whose reader takes the embedding itself; a RESIDUAL step with an output norm is
// two phases). HEAD runs only when the tile has wanted rows.
// Split attention's units take ROPE's work on themselves when no row of the tile reads another
// row's new key (every row its own sequence: a decode step, or a prefill tile of distinct sequences):
// one phase and barrier a layer fewer.
// Thread 0 decides it when it builds the tile; asked at each use, not kept: a value live across
// the step loop spilled on sm_100/120. The tile sits at the start of shared memory (det_mk_run):
// read there, not through the context, which the phases' references keep in local memory.
DET_DEV bool det_mk_rope_in_attn() { return ((const det_mk_tile*)det_smem())->rope_in_attn; }

// ---- weights ahead of their inputs (geometry ahead) --------------------------------------------

DET_DEV bool det_mk_is_gemv(int32_t kind) {
  return kind == DET_STEP_QKV || kind == DET_STEP_MLP || kind == DET_STEP_RESIDUAL || kind == DET_STEP_HEAD ||
         kind == DET_STEP_PLE_PROJECT || kind == DET_STEP_PLE_GATE;
}

// The step of the tile's phase after step i (i = -1: its first), skipping what det_mk_forward_tile
// skips (EMBED, ROPE done by the attention units, HEAD without wanted rows); n_steps after the last.
DET_DEV int64_t det_mk_next_phase(const det_mk_ctx& c, int64_t i) {
  const det_llama_model& m = c.P->model;
  for (int64_t j = i + 1; j < m.n_steps; ++j) {
    const int32_t kind = m.steps[j].kind;
    if (kind == DET_STEP_EMBED || (kind == DET_STEP_HEAD && c.tile->n_want == 0) ||
        (kind == DET_STEP_ROPE && det_mk_rope_in_attn()))
      continue;
    return j;
  }
  return m.n_steps;
}

// The weights of GEMV step s ahead (det_mk_gemv_ahead): into the ring when ring, and the first
// geometry-ahead KB of this warp's rows into L2; its rows as many at a time, and in as many chunks,
// as the phase's first GEMV will take them (det_mk_gemv_outs, and det_mk_gemv_chunks of its input
// rows: the wanted rows for HEAD, else the tile's; at most the area's rows, det_mk_area_pass).
template <int NO>
DET_DEV void det_mk_weights_ahead_rows(const det_mk_ctx& c, const det_step& s, int chunks, bool ring) {
  const int64_t items = det_mk_items(c, s.n), l2 = (int64_t)c.P->geo.ahead * 1024;
  if (s.kind == DET_STEP_QKV)
    return det_mk_gemv_ahead<NO>(c, items, s.k, det_mk_qkv_rows_of(c, s), chunks, ring, l2);
  if (s.kind == DET_STEP_MLP)
    return det_mk_gemv_ahead<NO>(c, 2 * items, s.k, det_mk_mlp_rows_of(c, s), chunks, ring, l2);
  det_mk_gemv_ahead<NO>(c, items, s.k, det_mk_matrix_rows_of(c, s), chunks, ring, l2);
}
DET_DEV_NOINLINE void det_mk_weights_ahead(const det_mk_ctx c, const det_step& s, bool ring) {
  int nb = s.kind == DET_STEP_HEAD ? c.tile->n_want : c.tile->n;
  const bool in_area = s.kind == DET_STEP_QKV || s.kind == DET_STEP_MLP || s.kind == DET_STEP_HEAD ||
                       s.kind == DET_STEP_PLE_PROJECT;
  if (in_area && nb > det_mk_area_rows(&c.P->geo)) nb = det_mk_area_rows(&c.P->geo);  // its first pass's rows
  const int outs = det_mk_gemv_outs(&c.P->geo), chunks = det_mk_gemv_chunks(nb);
  if (outs == 1) det_mk_weights_ahead_rows<1>(c, s, chunks, ring);
  else if (outs == 2) det_mk_weights_ahead_rows<2>(c, s, chunks, ring);
  else det_mk_weights_ahead_rows<4>(c, s, chunks, ring);
}

// GEMV step j's first ring stages, issued before its phase reads its inputs (the phase's first
// GEMV is then called primed). With geometry ahead every phase of the tile has primed the next
// (det_mk_ahead before its last barrier), so every GEMV but the tile's first phase is ready;
// otherwise they are issued here, at the phase's start: weights never depend on activations, so
// their DRAM round trip overlaps the phase's staging (the rows' loads, the norm) instead of
// following it. Scheduling only: the same stages, in the same order, as the GEMV would issue.
// Called for every step (one call in the kernel's body: each call there reloads the context).
DET_DEV_NOINLINE void det_mk_prime(const det_mk_ctx& c, int64_t j) {
  const det_step& s = c.P->model.steps[j];
  if (!det_mk_is_gemv(s.kind) || (s.kind == DET_STEP_HEAD && c.tile->n_want == 0)) return;
  if (c.P->geo.ahead == 0 || j == det_mk_next_phase(c, -1)) det_mk_weights_ahead(c, s, true);
}

// Before the last barrier of step i's phase: the next phase's weights when it is a GEMV (ring and
// L2); after the tile's last phase, the plan's first GEMV phase into L2 only (the next tile's or
// decode step's; the ring is primed only for a phase of the same tile, det_mk_prime).
DET_DEV_NOINLINE void det_mk_ahead(const det_mk_ctx c, int64_t i) {
  if (c.P->geo.ahead == 0) return;
  const det_llama_model& m = c.P->model;
  const int64_t j = det_mk_next_phase(c, i);
  if (j < m.n_steps) {
    if (det_mk_is_gemv(m.steps[j].kind)) det_mk_weights_ahead(c, m.steps[j], true);
    return;
  }
  for (int64_t f = 0; f < m.n_steps; ++f)
    if (m.steps[f].kind != DET_STEP_EMBED) {
      if (det_mk_is_gemv(m.steps[f].kind)) det_mk_weights_ahead(c, m.steps[f], false);
      return;
    }
}

// Geometry ahead's invariant: every phase that runs calls det_mk_ahead just before its last grid
// barrier, and a step skipped without a barrier is skipped by det_mk_next_phase too. A new path
// that ends a phase otherwise would leave the next GEMV's first stages unissued while it is called
// primed (det_mk_prime): wrong bits, which the emulated digests with ahead > 0 catch.
DET_DEV void det_mk_forward_tile(const det_mk_ctx& c) {
  const det_llama_model& m = c.P->model;
  for (int i = 0; i < (int)m.n_steps; ++i) {
    const det_step& s = m.steps[i];
    det_mk_prime(c, i);  // a GEMV phase's first weights, before it reads its inputs
    switch (s.kind) {
      case DET_STEP_EMBED: det_mk_embed_rows(c); continue;
      case DET_STEP_PLE_PROJECT: det_mk_phase_ple_project(c, s); break;
      case DET_STEP_PLE_FINISH: det_mk_phase_ple_finish(c); break;
      case DET_STEP_QKV: det_mk_phase_qkv(c, s); break;
      case DET_STEP_ROPE:
        if (det_mk_rope_in_attn()) continue;
        det_mk_phase_rope(c, s.layer);
        break;
      case DET_STEP_ATTEND:
        if (c.P->geo.attn == 0) {
          det_mk_phase_attn(c, s.layer);
          break;
        }
        if (det_mk_attn_most_chunks(c, s.layer) == 1) {  // one chunk a row: no fold
          det_mk_phase_attn_units(c, s.layer, 0, true, det_mk_rope_in_attn());
          break;
        }
        for (int pass = 0, passes = (int)det_mk_attn_passes(c, s.layer); pass < passes; ++pass) {
          det_mk_phase_attn_units(c, s.layer, pass, false, det_mk_rope_in_attn());  // each pair's last unit folds
          if (pass + 1 < passes) det_mk_grid_sync(c, (int32_t)(2 * i + 1));  // the fold's state; the partials free
        }
        break;
      case DET_STEP_MLP: det_mk_phase_mlp(c, s); break;
      case DET_STEP_PLE_GATE: det_mk_phase_ple_gate(c, s); break;
      case DET_STEP_RESIDUAL:
        det_mk_phase_residual_gemv(c, s);
        if (s.norm && c.P->geo.barrier) {  // no phase of its own: the last block to finish normalizes
          if (det_mk_out_norm_last(c)) det_mk_phase_out_norm(c, s.norm, s.scalar, det_warp(), det_warps());
        } else if (s.norm) {
          det_mk_grid_sync(c, (int32_t)(2 * i));
          det_mk_phase_out_norm(c, s.norm, s.scalar, c.gwarp, c.nwarps);
          det_mk_ahead(c, i);
          det_mk_grid_sync(c, (int32_t)(2 * i + 1));
          continue;
        }
        break;
      case DET_STEP_HEAD:
        if (c.tile->n_want == 0) continue;
        det_mk_phase_head(c, s);
        break;
    }
    det_mk_ahead(c, i);
    det_mk_grid_sync(c, (int32_t)(2 * i));
  }
}
