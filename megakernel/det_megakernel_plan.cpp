// det_megakernel_plan.cpp: the host side of a megakernel launch that does not depend on where it
// runs: workspace layout and the validation that turns bad input into an error code (and a
// sentence) before anything is launched. Shared by the GPU launcher and the emulation.
#include <string.h>

#include "det_megakernel.h"
#include "../model/det_program.h"

namespace {

struct Sizes {
  int64_t x, q, kv, att, act, ple, logits, sincos, attn_part, attn_run, attn_count, out_count;
};

// Every section a multiple of 4 words, so that each starts 16-byte aligned.
int64_t up4(int64_t n) { return (n + 3) / 4 * 4; }

Sizes sizes(const det_llama_model* m, int rows) {
  const int64_t QD = m->n_heads * m->head_dim, KVD = m->n_kv_heads * m->head_dim;
  const int64_t act = m->inter > m->ple_dim ? m->inter : m->ple_dim;
  const int64_t part = rows * m->n_heads * (m->head_dim + 2);
  // Logits and the sampler's scratch hold wanted rows of generate mode: one per sequence.
  const int64_t wanted = rows < DET_MK_SEQ_MAX ? rows : DET_MK_SEQ_MAX;
  return {up4(rows * m->hidden), up4(rows * QD),       up4(rows * KVD),
          up4(rows * QD),        up4(rows * act),      up4(rows * m->n_layers * m->ple_dim),
          up4(wanted * m->vocab),  up4(rows * m->rope_pairs * 2), up4(part * DET_MK_ATTN_PASS_CHUNKS), up4(part),
          up4(rows * m->n_heads), up4(1)};
}

int fail(const char** why, int code, const char* text) {
  if (why) *why = text;
  return code;
}

}  // namespace

size_t det_mk_workspace_bytes(const det_llama_model* m, int tile_rows) {
  const Sizes s = sizes(m, tile_rows);
  // logits and the sampler's e: a word each per logit; its ranking: two 64-bit pairs
  const int64_t words = 2 * s.x + s.q + 2 * s.kv + s.att + s.act + s.ple + 6 * s.logits + s.sincos + s.attn_part +
                        s.attn_run + s.attn_count + s.out_count;  // fp32 or int32
  return (size_t)words * 4 + DET_MK_SEQ_MAX * sizeof(int32_t) + 4 * sizeof(unsigned int);
}

det_mk_workspace det_mk_workspace_carve(const det_llama_model* m, int tile_rows, void* buf) {
  const Sizes s = sizes(m, tile_rows);
  det_mk_workspace w;
  float* f = (float*)buf;
  w.x = f; f += s.x;
  w.out = f; f += s.x;
  w.q = f; f += s.q;
  w.k = f; f += s.kv;
  w.v = f; f += s.kv;
  w.att = f; f += s.att;
  w.act = f; f += s.act;
  w.ple = f; f += s.ple;
  w.logits = f; f += s.logits;
  w.sincos = f; f += s.sincos;
  w.attn_part = f; f += s.attn_part;
  w.attn_run = f; f += s.attn_run;
  w.attn_count = (unsigned int*)f; f += s.attn_count;
  w.out_count = (unsigned int*)f; f += s.out_count;
  w.sample_e = f; f += s.logits;
  w.sample_rank = (uint64_t*)f; f += 4 * s.logits;
  w.next_token = (int32_t*)f;
  w.barrier = (unsigned int*)(w.next_token + DET_MK_SEQ_MAX);
  return w;
}

int det_mk_check_model(const det_llama_model* m, const char** why) {
  bool widths8 = m->hidden % 8 == 0 && m->ple_dim % 8 == 0;
  for (int64_t l = 0; widths8 && m->layers && l < m->n_layers; ++l)
    widths8 = m->layers[l].head_dim % 8 == 0 && m->layers[l].inter % 8 == 0;
  if (!widths8)
    return fail(why, DET_MK_ERR_SHAPE, "the megakernel needs hidden_size, intermediate_size, head_dim and "
                                       "hidden_size_per_layer_input to be multiples of 8 (16-byte weight loads)");
  if (m->head_dim > DET_MK_HEAD_DIM_MAX)
    return fail(why, DET_MK_ERR_SHAPE, "the megakernel supports head_dim up to 512");
  if (m->vocab > (int64_t)1 << 30 || m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1 ||
      m->n_heads % m->n_kv_heads || !m->layers)
    return fail(why, DET_MK_ERR_SHAPE, "inconsistent model shape (heads, kv heads, layers or vocab)");
  if (!det_llama_model_valid(m))
    return fail(why, DET_MK_ERR_SHAPE, "a projection is neither dense bf16 nor nf4 with absmax, codebook and a "
                                       "block of 8 to 2^20 elements, the layer plan is malformed, or a switch (activation, rope tables, a "
                                       "layer's table, window, head size, MLP width or K/V source) is out of range");
  return DET_MK_OK;
}

// cp.async reads a dense row in 16-byte pieces and an nf4 row in 4-byte pieces (8 codes).
static bool matrix_aligned(const det_matrix& w) {
  if (w.bf16) return (uintptr_t)w.bf16 % 16 == 0;
  return ((uintptr_t)w.nf4 | (uintptr_t)w.absmax | (uintptr_t)w.code) % 4 == 0;
}

int det_mk_check_alignment(const det_llama_model* m, const char** why) {
  const bool aligned = ((uintptr_t)m->embed | (uintptr_t)m->lm_head) % 16 == 0 &&
                       det_llama_every_projection(m, matrix_aligned);
  return aligned ? DET_MK_OK
                 : fail(why, DET_MK_ERR_SHAPE, "the megakernel needs dense weight matrices 16-byte aligned and nf4 codes 4-byte aligned");
}

int det_mk_check_geometry(const det_mk_geometry* g, const char** why) {
  const int t = g->tile_rows;
  if (g->grid < 1 || g->grid > 65535)
    return fail(why, DET_MK_ERR_GEOMETRY, "grid must be in [1, 65535] blocks");
  if (g->warps < 1 || g->warps > 32)
    return fail(why, DET_MK_ERR_GEOMETRY, "warps must be in [1, 32] per block");
  if (g->ring != 2 && g->ring != 4)
    return fail(why, DET_MK_ERR_GEOMETRY, "ring (weight-ring depth) must be 2 or 4");
  if (t < 1 || t > DET_MK_TILE_MAX || (t & (t - 1)) != 0)
    return fail(why, DET_MK_ERR_GEOMETRY, "tile_rows must be 1, 2, 4, 8, 16, 32, 64 or 128");
  if (g->attn < 0 || g->attn > DET_MK_ATTN_PASS_CHUNKS)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "attn must be 0 (a warp per query head) or 1..32 (chunk units and a fold, chunks per pass)");
  if (g->ahead < 0 || g->ahead > DET_MK_AHEAD_MAX_KB)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "ahead must be 0 (weights loaded when a phase starts) or 1..256 (KB of each warp's next weight "
                "rows requested before the barrier)");
  if (g->barrier != 0 && g->barrier != 1)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "barrier must be 0 (the generation barrier) or 1 (the monotonic arrival counter)");
  if (g->outs != 0 && g->outs != 1 && g->outs != 2 && g->outs != 4)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "outs must be 0 or 1 (a warp streams one weight row at a time), 2 or 4 (that many at once)");
  if (g->stage < 0 || g->stage > 3)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "stage must be 0 (nothing copied), 1 (RESIDUAL's and PLE_GATE's inputs copied into each block's "
                "shared memory when they fit), 2 (split attention's chunks, for the rows of one sequence) or 3 "
                "(both)");
  const int a = g->area_rows;
  if (a < 0 || a > DET_MK_TILE_MAX || (a & (a - 1)) != 0)
    return fail(why, DET_MK_ERR_GEOMETRY,
                "area_rows must be 0 (the whole tile) or 1, 2, 4, ..., 128 (the tile's rows a block's shared memory "
                "holds at once; tile_rows or more: the whole tile)");
  return DET_MK_OK;
}

// ---- launch planning ------------------------------------------------------------------------------
static size_t round_up(size_t x, size_t unit) { return (x + unit - 1) / unit * unit; }
static int min_int(int a, int b) { return a < b ? a : b; }

int det_mk_blocks_per_sm(const det_mk_device* d, int threads, size_t dyn_smem) {
  if (threads < 1 || threads > d->kernel_max_threads) return 0;
  const int warps = (threads + 31) / 32;
  // Warp slots, and the cap on resident blocks.
  int blocks = min_int(d->max_threads_per_sm / 32 / warps, d->max_blocks_per_sm);
  // Registers go to warps in units of 256, from each of an SM's 4 sub-partitions; a block is
  // checked against the per-block limit as if its warps filled all 4 evenly.
  const size_t warp_regs = round_up((size_t)d->kernel_regs * 32, 256);
  if (d->kernel_regs > 255 || warp_regs * round_up((size_t)warps, 4) > (size_t)d->regs_per_block) return 0;
  if (warp_regs > 0) blocks = min_int(blocks, (int)((size_t)d->regs_per_sm / 4 / warp_regs * 4 / (size_t)warps));
  // Shared memory: static, the driver's reserve and dynamic, in granules of 128 bytes (256 on 7.x).
  const size_t smem = round_up(d->kernel_static_smem + d->smem_reserved_per_block + dyn_smem, d->cc_major >= 8 ? 128 : 256);
  if (smem > d->smem_per_block_optin + d->smem_reserved_per_block) return 0;
  if (smem > 0) blocks = min_int(blocks, (int)(d->smem_per_sm / smem));
  return blocks > 0 ? blocks : 0;
}

int det_mk_plan_geometry(const det_llama_model* m, det_mk_geometry* g, const det_mk_device* d, const char** why) {
  const det_mk_geometry asked = *g;
  const int max_warps = d->kernel_max_threads / 32;
  if (g->warps == 0) g->warps = min_int(8, max_warps);
  if (g->warps < 1 || g->warps > max_warps)
    return fail(why, DET_MK_ERR_GEOMETRY, "at most 8 warps per block on the GPU (the kernel's launch bound)");
  // The dynamic shared memory a block may have: the opt-in maximum less the kernel's static part.
  const size_t smem_max = d->smem_per_block_optin > d->kernel_static_smem ? d->smem_per_block_optin - d->kernel_static_smem : 0;
  const bool ring_auto = g->ring == 0, tile_auto = g->tile_rows == 0, area_auto = g->area_rows == 0;
  if (ring_auto) g->ring = 4;
  for (;;) {
    if (tile_auto) {  // the whole tile in the area: a tile the planner picks is one that fits
      if (area_auto) g->area_rows = 0;
      g->tile_rows = DET_MK_TILE_AUTO_MAX;
      while (g->tile_rows > 1 && det_mk_smem_bytes(m, g) > smem_max) g->tile_rows /= 2;
    }
    if (area_auto && g->tile_rows >= 1 && g->tile_rows <= DET_MK_TILE_MAX) {  // a tile asked for: what fits of it
      g->area_rows = g->tile_rows;
      while (g->area_rows > 1 && det_mk_smem_bytes(m, g) > smem_max) g->area_rows /= 2;
    }
    if (!ring_auto || g->ring == 2 || det_mk_smem_bytes(m, g) <= smem_max) break;
    g->ring = 2;  // not even one row fits beside 4-stage rings (sm_75 and a hidden size over ~12,000)
  }
  // Geometry stage bit 2 copies split attention's chunks when a block holds them beside the rest (as
  // bit 1 copies rows that fit): where it does not, the geometry is planned again without it, and
  // the units read the chunks from L2.
  if ((asked.stage & DET_MK_STAGE_CHUNKS) && det_mk_attn_stage_floats(m, g) > 0 && det_mk_smem_bytes(m, g) > smem_max) {
    *g = asked;
    g->stage &= ~DET_MK_STAGE_CHUNKS;
    return det_mk_plan_geometry(m, g, d, why);
  }
  const int grid_asked = g->grid;
  if (g->grid == 0) g->grid = 1;  // for the range checks; set below
  const int rc = det_mk_check_geometry(g, why);
  if (rc != DET_MK_OK) return rc;
  const size_t smem = det_mk_smem_bytes(m, g);
  if (smem > smem_max) return fail(why, DET_MK_ERR_GEOMETRY, "the geometry needs more shared memory than the device has");
  const int per_sm = det_mk_blocks_per_sm(d, g->warps * 32, smem);
  if (per_sm < 1) return fail(why, DET_MK_ERR_GEOMETRY, "no block of this geometry fits on a multiprocessor");
  const int64_t resident = (int64_t)per_sm * d->sm_count;
  if (grid_asked == 0) g->grid = resident < 65535 ? (int)resident : 65535;
  if (g->grid > resident) return fail(why, DET_MK_ERR_GEOMETRY, "grid exceeds the blocks that can be resident at once");
  return DET_MK_OK;
}

int det_mk_check_program(const det_llama_model* m, const det_mk_program* p, const int32_t* tokens,
                         const int64_t* positions, const int32_t* seq, const uint8_t* want,
                         const int64_t* capacities, const char** why) {
  if (p->max_new > 0 && p->n_seq > DET_MK_SEQ_MAX)
    return fail(why, DET_MK_ERR_PROGRAM, "a generate program takes at most 16 sequences");
  if (p->n_stop < 0) return fail(why, DET_MK_ERR_PROGRAM, "negative stop count");
  const int rc = det_program_check(m, p->n_rows, tokens, positions, seq, want, p->n_seq, capacities, p->max_new, why);
  return rc == DET_OK ? DET_MK_OK : DET_MK_ERR_PROGRAM;
}
