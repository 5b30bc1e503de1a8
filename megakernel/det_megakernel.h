// det_megakernel.h: the megakernel's program, geometry and workspace (plain C++, no CUDA), shared
// by the GPU launcher (det_infer_cuda/det_megakernel.cu), the host emulation
// (megakernel/host/det_megakernel_emu.cpp) and the torch binding. docs/SPEC.md §14.
//
// One launch runs a program: first the rows (token, position, sequence) in order, in tiles of up
// to tile_rows rows, each tile through every layer; then, in generate mode, decoding of every
// sequence (greedy, or seeded sampling: det_sample.h) until max_new tokens or a stop id, one row
// per live sequence per step. Logits are computed for the rows marked "want". The math of a row
// never depends on the tile it rides in, so the tile size, like every other geometry field, is
// scheduling only.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "../model/det_llama_model.h"
#include "../contract/det_sample.h"

#if defined(__CUDACC__)
#define DET_MK_HD __host__ __device__ inline
#else
#define DET_MK_HD inline
#endif

#define DET_MK_SEQ_MAX 16        // sequences per generate program, so rows per decode step
#define DET_MK_TILE_MAX 128      // rows per tile (prompt tiles; a GEMV takes them 16 at a time)
#define DET_MK_TILE_AUTO_MAX 16  // the most rows the planner picks by itself (larger tiles: asked for)
#define DET_MK_HEAD_DIM_MAX 512  // attention keeps two 8-wide slices of q per lane
#define DET_MK_RING_MAX 4

// Launch geometry: scheduling only, never a bit of the result (docs/SPEC.md §14.3).
struct det_mk_geometry {
  int grid;        // blocks (all resident: cooperative launch)
  int warps;       // warps per block
  int ring;        // weight-ring depth per warp: 2 or 4 stages of 16 bytes per lane
  int tile_rows;   // rows carried through the layers together: 1, 2, 4, ..., 128 (a power of two); a GEMV
                   // takes a tile of more than 16 rows 16 at a time per weight row (det_mk_gemv_rows)
  uint64_t seed;   // emulation only: the fiber schedule (0: a fixed order)
  int attn;        // the attention's units: 0, one warp per (row, query head) walking the context;
                   // C in 1..DET_MK_ATTN_PASS_CHUNKS, (row, KV head, query pair, chunk) units over the
                   // grid, C chunks of 128 positions per pass, the last unit of a (row, pair) folding
  int ahead;       // weights ahead of their inputs: 0 off; A in 1..DET_MK_AHEAD_MAX_KB, before the barrier
                   // a GEMV phase begins with, each warp issues its first ring stages and hints the first
                   // A KB of its weight rows into L2 (det_mk_gemv_ahead)
  int barrier;     // the grid barrier: 0 the generation barrier (det_sync_grid), 1 the monotonic
                   // arrival counter (det_sync_grid_counter), and Gemma's output norms done by the last
                   // block to finish its RESIDUAL GEMV (an arrival count) instead of a phase of their own
  int outs;        // the GEMV's weight rows a warp streams at once: 0 or 1, one; 2 or 4, that many, each
                   // input value loaded from shared memory feeding all of them (det_mk_gemv_outs)
  int stage;       // what a block copies into its shared memory once for all its warps, bits: 1, the inputs
                   // of RESIDUAL and PLE_GATE when they fit (det_mk_stage_rows; else every warp reads them
                   // from global memory for each output); 2, with split attention, each chunk's keys and
                   // values for the rows of one sequence (det_mk_phase_attn_staged; else each unit reads
                   // them from L2 for its own row)
  int area_rows;   // rows the block's phase area holds for the phases that copy or normalize their inputs
                   // there (QKV, MLP, HEAD, PLE_PROJECT): 0, or tile_rows or more, the whole tile; a smaller
                   // power of two, the tile is taken that many rows at a time (det_mk_area_pass). On a
                   // GPU the planner sets 0 to the most rows whose shared memory fits, the whole tile if it can
};

// The profiling timeline's stamps per (synchronization, block) (det_mk_program::timeline): the
// block's arrival, its departure, its inputs ready, then one per warp (its own arrival).
enum det_mk_stamp { DET_MK_STAMP_ARRIVE = 0, DET_MK_STAMP_LEAVE = 1, DET_MK_STAMP_READY = 2, DET_MK_STAMP_WARP = 3 };
DET_MK_HD int det_mk_stamp_slots(int warps) { return DET_MK_STAMP_WARP + warps; }

// Rows of the tile the phase area holds (geometry area_rows; the whole tile when 0 or larger).
DET_MK_HD int det_mk_area_rows(const det_mk_geometry* g) {
  return g->area_rows > 0 && g->area_rows < g->tile_rows ? g->area_rows : g->tile_rows;
}

// Weight rows a warp streams at once in a GEMV phase: geometry outs (0 or 1: one). In a pass of
// 16 input rows a lane then keeps outs x 16 accumulators, 64 at outs 4: registers hold them (the
// SASS audit, RESULTS §3), and each input value loaded from shared memory feeds 4 fmas, which is
// where a pass stops being bound by shared-memory reads (issue 49).
DET_MK_HD int det_mk_gemv_outs(const det_mk_geometry* g) { return g->outs > 1 ? g->outs : 1; }
// A warp's ring stage holds one 16-byte piece per lane of each row streamed at once.
DET_MK_HD int det_mk_ring_rows(const det_mk_geometry* g) { return det_mk_gemv_outs(g); }
// Bytes of one warp's ring: ring stages x ring rows x 32 lanes x 16 bytes.
DET_MK_HD size_t det_mk_ring_bytes(const det_mk_geometry* g) { return (size_t)g->ring * det_mk_ring_rows(g) * 32 * 16; }

#define DET_MK_AHEAD_MAX_KB 256

// The most chunks one pass of split attention computes before its fold (the workspace holds one
// pass): with attn 32, contexts beyond 32 x 128 = 4,096 positions take several passes.
#define DET_MK_ATTN_PASS_CHUNKS 32

struct det_mk_seq {
  float* k;  // capacity * kv_row floats: det_kv_cache's layout (det_kv_head_base)
  float* v;
  int64_t capacity;
};

struct det_mk_program {
  int64_t n_rows;
  const int32_t* tokens;     // (n_rows,)
  const int64_t* positions;  // (n_rows,)
  const int32_t* seq;        // (n_rows,) index into seqs
  const uint8_t* want;       // (n_rows,) 1: compute this row's logits
  int64_t n_seq;
  const det_mk_seq* seqs;    // (n_seq,)
  // Forward mode (max_new == 0): the wanted rows' logits, (n_want, vocab) in row order.
  float* logits;
  // Generate mode (max_new > 0): each sequence has exactly one wanted row, its last prompt row;
  // decoding continues at the next position. out_tokens (n_seq, max_new), out_lengths (n_seq,),
  // step_logits (n_seq, max_new, vocab) or null.
  int64_t max_new;
  const int32_t* stop_ids;
  int64_t n_stop;
  const det_sample_params* sample;  // (n_seq,) or null: greedy (docs/SPEC.md §15)
  int32_t* out_tokens;
  int64_t* out_lengths;
  float* step_logits;
  // Profiling (null: off): for the first timeline_cap grid synchronizations j, each block fills
  // det_mk_stamp_slots(warps) det_globaltimer() stamps at timeline[(j * grid + block) *
  // det_mk_stamp_slots(warps) + slot] (det_mk_stamp): when the block has reached j (its slowest
  // warp: arrival) and when it leaves it; when its phase area first held the phase's inputs (left
  // as it was when the phase stages none: the caller zeroes the buffer); and when each of its
  // warps reached j. Block 0 writes timeline_tag[j]:
  // 2 * plan step + 1 for a step's inner barriers (a residual step's output norm; split attention's
  // chunks and passes), 2 * plan step for its last, or -1 for the end of a decode step.
  uint64_t* timeline;
  int32_t* timeline_tag;
  int64_t timeline_cap;
};

// Device scratch, carved from one buffer (det_mk_workspace_layout). Sizes are for tile_rows rows.
struct det_mk_workspace {
  float* x;       // (rows, hidden) the residual stream
  float* out;     // (rows, hidden) a layer's attention or MLP output awaiting its norm (Gemma)
  float* q;       // (rows, heads*head_dim)
  float* k;       // (rows, kv_heads*head_dim)
  float* v;       // (rows, kv_heads*head_dim)
  float* att;     // (rows, heads*head_dim) attention output
  float* act;     // (rows, inter) act(gate) * up; Gemma-4: also (rows, P) the per-layer branch's
  float* ple;     // (rows, n_layers * P) Gemma-4's per-layer inputs
  float* logits;  // (min(rows, DET_MK_SEQ_MAX), vocab) generate mode without step_logits (one wanted row a sequence)
  float* sincos;  // (rows, rope_pairs, 2) the rows' rope (sin, cos), every table's pairs
  float* sample_e;        // (min(rows, DET_MK_SEQ_MAX), vocab) the sampler's weights e (det_sample.h)
  uint64_t* sample_rank;  // (min(rows, DET_MK_SEQ_MAX), 2, vocab) the ranking's (key, id) pairs, two
                          // buffers a row (det_mk_sample.cuh); the heap walk's scratch when it runs
  int32_t* next_token;   // (DET_MK_SEQ_MAX,) each sequence's latest argmax
  unsigned int* barrier; // (2,) the grid barrier (geometry barrier 1: one 64-bit count); zero before launch
  // Split attention (geometry attn > 0): per (row, query head) and chunk of the pass, the chunk's
  // (m, l) then o[0..head_dim); and the fold's running (m, l, O) between passes.
  float* attn_part;      // (rows, heads, DET_MK_ATTN_PASS_CHUNKS, head_dim + 2)
  float* attn_run;       // (rows, heads, head_dim + 2)
  unsigned int* attn_count;  // (rows, heads) a pass's units of (row, query pair) arrived so far, at the
                             // pair's first query head: zero before the launch and after each fold
  unsigned int* out_count;   // (1,) geometry barrier 1: blocks done with a RESIDUAL step's GEMV whose
                             // output norm follows (Gemma): zero before the launch and after each norm
};

struct det_mk_params {
  det_llama_model model;  // device pointers (host pointers under emulation)
  det_mk_program prog;
  det_mk_workspace ws;
  det_mk_geometry geo;
};

// The tile: rows carried through the layers together, identical in every block (thread 0 of
// each block builds it from the program and the shared argmax results).
struct det_mk_tile {
  int n;       // rows
  int n_want;  // rows whose logits are computed
  int64_t want_seen;  // forward mode: the wanted rows of the tiles before this one (thread 0's count)
  int rope_in_attn;  // split attention (geometry attn > 0) and every row its own sequence (a decode
                     // step, or a prefill tile of distinct sequences): no row reads another's new
                     // key, so the attention units do ROPE's work
  int attn_staged;   // geometry stage 2 and rows that share sequences (a prompt tile), head_dim <= 128:
                     // split attention's units by block on a copy of each chunk (det_mk_phase_attn_staged)
  int32_t token[DET_MK_TILE_MAX];
  int32_t seq[DET_MK_TILE_MAX];
  int64_t pos[DET_MK_TILE_MAX];
  int32_t want_row[DET_MK_TILE_MAX];  // tile rows of the wanted rows, in order
  float* dst[DET_MK_TILE_MAX];        // where each wanted row's logits go
  // generate mode: per sequence, and the current decode step's rows (split into tiles)
  int64_t next_pos[DET_MK_SEQ_MAX];
  int32_t live[DET_MK_SEQ_MAX];
  int n_step;
  int32_t step_seq[DET_MK_SEQ_MAX];
  int32_t step_token[DET_MK_SEQ_MAX];
  int64_t syncs;  // grid synchronizations passed (thread 0's count: the profiling timeline, the monotonic barrier)
  uint64_t* timeline;     // det_mk_program's profiling timeline and its capacity, copied here once: a
  int64_t timeline_cap;   // phase reads them with shared loads, not through its context (local memory)
  det_matrix head;  // the lm_head as a dense matrix, set once: the GEMV's rows point at a det_matrix,
                    // and one in a phase's frame would live in local memory
};

// Shared memory per block: the tile, then each warp's weight ring (ring x outs x 32 lanes x 16 bytes),
// then the phase area: the tile's normalized rows (area_rows x hidden) and their norm factors
// (area_rows), or per warp the attention scratch (scores and exps of one chunk, the running
// numerator) and after them a staged chunk (geometry stage 2), or the argmax / sampling partials.
DET_MK_HD size_t det_mk_smem_ring_offset() { return (sizeof(det_mk_tile) + 15) / 16 * 16; }
// Split attention's units carry up to this many query heads of one KV head (det_mk_attn_group.cuh):
// each lane keeps a dot tree of 4 keys per query in registers (groups of 4 took sm_120's kernel to
// its 248 registers and spilled).
#define DET_MK_ATTN_GROUP 2
// A warp's attention scratch: attn 0, one chunk's scores and exps and the running numerator; split,
// a unit's queries and exps (group x (head_dim + 128)) and the row's new key and value (2 head_dim),
// or the fold's numerator. 128 = DET_ATTN_CHUNK (asserted in det_mk_attention.cuh); head_dim is the
// model's largest.
DET_MK_HD size_t det_mk_attn_scratch_floats(const det_llama_model* m, int attn) {
  const size_t D = (size_t)m->head_dim;
  return attn == 0 ? 2 * 128 + D : DET_MK_ATTN_GROUP * (128 + D) + 2 * D;
}
// Geometry stage's bits (det_mk_geometry::stage).
#define DET_MK_STAGE_INPUTS 1
#define DET_MK_STAGE_CHUNKS 2
// Split attention stages a chunk (geometry stage 2) when the model's head_dim is at most this: its
// keys and values take 2 x 128 x head_dim floats of the phase area, 128 KB at 128.
#define DET_MK_STAGE_HEAD_DIM_MAX 128
// Floats of the phase area a staged chunk takes after the warps' attention scratch (0: not staged).
DET_MK_HD size_t det_mk_attn_stage_floats(const det_llama_model* m, const det_mk_geometry* g) {
  const bool on = g->attn > 0 && (g->stage & DET_MK_STAGE_CHUNKS) && m->head_dim <= DET_MK_STAGE_HEAD_DIM_MAX;
  return on ? 2 * 128 * (size_t)m->head_dim : 0;
}
// The sampler's ranking (det_mk_sample.cuh): a stable radix sort of the candidates' 28-bit keys
// (weights in [2^-24, 1]), 7 bits a pass, with a count per (bin, warp) for the pass it runs and for
// the next.
#define DET_MK_RANK_BITS 7
#define DET_MK_RANK_PASSES 4
#define DET_MK_RANK_BINS (1 << DET_MK_RANK_BITS)
// Words of the phase area a sampled pick takes (more than a greedy one): per warp a maximum, then
// m, S, two flags and the count of candidates; from the next multiple of 4, a warp's 32 weights for
// the walk; the two count tables.
DET_MK_HD size_t det_mk_sample_w32_offset(int warps) { return ((size_t)warps + 5 + 3) / 4 * 4; }
DET_MK_HD size_t det_mk_sample_area_floats(int warps) {
  return det_mk_sample_w32_offset(warps) + 32 + 2 * DET_MK_RANK_BINS * (size_t)warps;
}
// The norm factors of the area's rows follow them in the phase area.
DET_MK_HD size_t det_mk_norm_factor_offset(const det_llama_model* m, const det_mk_geometry* g) {
  return (size_t)det_mk_area_rows(g) * (size_t)m->hidden;
}
// Floats of the phase area: the largest of its uses.
DET_MK_HD size_t det_mk_area_floats(const det_llama_model* m, const det_mk_geometry* g) {
  size_t area = det_mk_norm_factor_offset(m, g) + (size_t)det_mk_area_rows(g);
  const size_t attn = (size_t)g->warps * det_mk_attn_scratch_floats(m, g->attn) + det_mk_attn_stage_floats(m, g);
  const size_t argmax = det_mk_sample_area_floats(g->warps);
  area = area > attn ? area : attn;
  return area > argmax ? area : argmax;
}
DET_MK_HD size_t det_mk_smem_bytes(const det_llama_model* m, const det_mk_geometry* g) {
  return det_mk_smem_ring_offset() + (size_t)g->warps * det_mk_ring_bytes(g) +
         det_mk_area_floats(m, g) * sizeof(float);
}

// Errors of validation (before any launch).
enum {
  DET_MK_OK = 0,
  DET_MK_ERR_SHAPE = -10,     // a model dimension the megakernel cannot take (see det_mk_check_model)
  DET_MK_ERR_GEOMETRY = -11,  // a geometry field outside its range, or a block that does not fit
  DET_MK_ERR_PROGRAM = -12,   // rows, sequences, positions or outputs inconsistent
  DET_MK_ERR_DEADLOCK = -13,  // emulation: a synchronization was not reached by every thread
  DET_MK_ERR_LAUNCH = -14,    // the CUDA launch failed (message from the launcher)
};

// Workspace bytes for a model and tile size; det_mk_workspace_carve points the fields into buf.
size_t det_mk_workspace_bytes(const det_llama_model* m, int tile_rows);
det_mk_workspace det_mk_workspace_carve(const det_llama_model* m, int tile_rows, void* buf);

// Checks made on the host before a launch, with host-side copies of the program's arrays (the
// program's pointers may be device pointers; these are not). det_mk_check_model reads m->layers,
// which must be the host copy of the layer table. Returns DET_MK_OK or an error and
// fills why (a sentence) when why is not null.
int det_mk_check_model(const det_llama_model* m, const char** why);
int det_mk_check_geometry(const det_mk_geometry* g, const char** why);
// On the GPU weight rows stream in 16-byte cp.async copies: every matrix must start 16-byte
// aligned (device copies are; the emulation copies with memcpy and has no such need).
int det_mk_check_alignment(const det_llama_model* m, const char** why);
int det_mk_check_program(const det_llama_model* m, const det_mk_program* p, const int32_t* tokens,
                         const int64_t* positions, const int32_t* seq, const uint8_t* want,
                         const int64_t* capacities, const char** why);

// ---- launch planning: the GPU launcher's choices, made on the host (testable without a GPU) -----
// A device and the compiled kernel as the occupancy rules see them (CUDA C++ Programming Guide,
// "Compute Capabilities"; the runtime's calculator, cuda_occupancy.h). The launcher fills it from
// cudaGetDeviceProperties and cudaFuncGetAttributes; tests/test_cuda_compile.py fills it from the
// compute-capability table and ptxas's report, and compares det_mk_blocks_per_sm with
// cuda_occupancy.h.
struct det_mk_device {
  int cc_major;                    // compute capability major (shared memory granule: 256 B on 7.x, 128 B after)
  int sm_count;                    // multiprocessors
  int max_threads_per_sm;
  int max_blocks_per_sm;
  int regs_per_sm;                 // 32-bit registers per multiprocessor
  int regs_per_block;              // and per block
  size_t smem_per_sm;              // shared memory per multiprocessor
  size_t smem_per_block_optin;     // the most one block may have (after cudaFuncAttributeMaxDynamicSharedMemorySize)
  size_t smem_reserved_per_block;  // the driver's share of every block (1 KB from sm_80, 0 on sm_75)
  int kernel_regs;                 // the kernel's registers per thread
  int kernel_max_threads;          // its launch bound: threads per block
  size_t kernel_static_smem;       // its static shared memory (the megakernel has none)
};

// Blocks of `threads` threads with `dyn_smem` bytes of dynamic shared memory that one
// multiprocessor holds at once: the least of the thread, block, register and shared-memory limits
// (cuda_occupancy.h's rules, default carveout); 0 when not even one block fits.
int det_mk_blocks_per_sm(const det_mk_device* d, int threads, size_t dyn_smem);

// Fills the geometry's zero fields for the device: warps 8 (at most the kernel's launch bound),
// ring 4, tile_rows the largest of 16 (DET_MK_TILE_AUTO_MAX), 8, 4, 2, 1 whose shared memory fits a block (when even one
// row does not fit with a ring of 4 and the ring was left to the planner: ring 2), area_rows the
// whole tile when it fits, else the most rows that do (a tile asked for larger), stage without bit 2
// when a staged chunk does not fit beside the rest (planned again without it), grid every
// block that can be resident at once. Refuses (DET_MK_ERR_GEOMETRY, with why) a geometry whose
// blocks cannot all be resident: the grid barrier of a cooperative launch needs every block on
// an SM together.
int det_mk_plan_geometry(const det_llama_model* m, det_mk_geometry* g, const det_mk_device* d, const char** why);

// Host emulation: runs the megakernel's device code on this thread, one fiber per CUDA thread.
int det_mk_run_emulated(const det_mk_params* p);
// The same, counting each warp's work per phase into work ((phases, grid * warps, 4) int64, zeroed:
// global bytes, shared bytes, loads, fmas, per the SIMT layer's det_ld / det_work_fma) for the
// first `phases` phases (a phase ends at a grid synchronization: the profiling timeline's j).
int det_mk_run_emulated_counted(const det_mk_params* p, int64_t* work, int64_t phases);
