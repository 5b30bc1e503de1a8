// det_attn_cpu.cpp: the CPU engine's ATTEND step (docs/SPEC.md §13.4).
//
// The contract fixes each (row, query head)'s arithmetic: a partial (m, l, o) per 128-position
// chunk, folded in increasing chunk order. This file decides only who computes what, and when:
//  - A unit is (rows of one sequence, a KV head g, a span of chunks). It walks its chunks in order
//    and hands each chunk, with every row and query head of g that sees it, to det_attn_chunk in
//    one call: the AVX-512 kernel reads each key panel (docs/SPEC.md §13.8) once for all of them
//    and each V row once for up to four, where a walk per (row, head) transposed the keys and read
//    V per query (2026-12-05, SmolLM2-135M, one thread: attention at 4,000 positions 32.9 -> 23.9
//    ms a token; a 4,000-token prompt 59 -> 38 s). From 16 queries on (a prompt's rows) it holds a
//    query per lane instead (x86/det_attn_lanes_avx512.cpp). With AVX2 only (or D % 16 != 0), the
//    AVX2 kernel runs the key-per-lane schedule eight keys a vector (x86/det_attn_chunk_avx2.cpp);
//    below AVX2, or when D % 8 != 0, chunk_partial runs the contract's loops one query at a time.
//  - A unit that holds its rows' whole visible range folds as it goes and writes the outputs.
//    When there are too few units to keep the threads busy (a batch-1 decode has as many as KV
//    heads), each row's range is cut into spans: the first span folds as it goes and keeps its
//    running state, the others keep each chunk's partial, and a second pass folds them in order.
#include "det_attn_cpu.h"

#include <string.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../contract/det_attention.h"
#include "../contract/det_rsqrt.h"
#include "det_kernels_cpu.h"
#include "det_parallel.h"

namespace {

constexpr int64_t kChunk = DET_ATTN_CHUNK;
static_assert(kChunk % DET_KV_PANEL == 0, "a chunk's keys start a panel (chunk_rows, det_attn_rows)");
constexpr int64_t kGroups = kChunk / DET_REDUCE_RUN;  // slot groups of a chunk (docs/SPEC.md §9)
constexpr int64_t kPrefetchSlots = 8;  // the V loop asks for the cached row this many slots ahead
constexpr int64_t kVBlock = 64;  // dimensions of o a slot group accumulates in registers at a time
constexpr int64_t kRowsPerUnit = 16;  // rows of one sequence that share a unit's K and V reads
constexpr int64_t kUnitsPerThread = 8;  // fewer units than this per thread: spans are cut

// One chunk's partial for one query, the contract's loops: returns (m, l) and leaves o in
// group_o[0 .. D). Slots j0..j1 of the chunk; kc and vc point at its slot 0.
DET_CPU_CLONES det_attn_acc chunk_partial(const float* q, const float* kc, const float* vc, int64_t D,
                                          int64_t j0, int64_t j1, float scale, float* group_o) {
  float score[kChunk], ex[kChunk], l_acc[DET_REDUCE_LANES];
  det_attn_scores(q, kc + j0 * D, D, D, j1 - j0 + 1, scale, score + j0);
  float m = score[j0];
  for (int64_t j = j0 + 1; j <= j1; ++j) m = score[j] > m ? score[j] : m;
  det_exp_sub(score + j0, m, ex + j0, j1 - j0 + 1);
  for (int j = 0; j < DET_REDUCE_LANES; ++j) l_acc[j] = 0.0f;
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t g0 = std::max(j0, g * DET_REDUCE_RUN), g1 = std::min(j1, g * DET_REDUCE_RUN + DET_REDUCE_RUN - 1);
    if (g0 > g1) continue;  // no visible slot: the tree skips the group
    for (int64_t j = g0; j <= g1; ++j) {  // the group's visible slots, in increasing order
      l_acc[g] = det_add_f32(l_acc[g], ex[j]);
      if (j + kPrefetchSlots <= j1) det_prefetch_l1(vc + (j + kPrefetchSlots) * D, 4 * D);
    }
    // o[d] = the fma chain over the group's slots. kVBlock dimensions at a time are independent
    // chains held in registers (through memory, each slot would wait for the last one's store).
    float* o = group_o + g * D;
    if (D % kVBlock == 0) {
      for (int64_t d0 = 0; d0 < D; d0 += kVBlock) {
        float acc[kVBlock] = {};
        for (int64_t j = g0; j <= g1; ++j) {
          const float e = ex[j];
          const float* v = vc + j * D + d0;
          for (int64_t d = 0; d < kVBlock; ++d) acc[d] = det_fma_f32(e, v[d], acc[d]);
        }
        memcpy(o + d0, acc, sizeof(acc));
      }
    } else {
      for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
      for (int64_t j = g0; j <= g1; ++j)
        for (int64_t d = 0; d < D; ++d) o[d] = det_fma_f32(ex[j], vc[j * D + d], o[d]);
    }
  }
  const float l = det_reduce_tree_f32(l_acc);
  det_attn_group_tree(group_o, D, j0, j1);
  return {m, l};
}

}  // namespace

// The version det_attn_chunk runs for head size D (DET_ISA_*).
static int attn_chunk_isa(int64_t D) {
#if defined(__x86_64__)
  if (det_cpu_isa() >= DET_ISA_AVX512 && D % 16 == 0) return DET_ISA_AVX512;
  if (det_cpu_isa() >= DET_ISA_AVX2 && D % 8 == 0) return DET_ISA_AVX2;
#endif
  return DET_ISA_REF;
}

const char* det_attn_chunk_impl_name(int64_t D) {
  static const char* const names[] = {"ref", "avx2", "avx512"};
  return names[attn_chunk_isa(D)];
}

void det_attn_chunk(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs, int64_t nq,
                    det_attn_rows next) {
#if defined(__x86_64__)
  const int isa = attn_chunk_isa(D);
  if (isa == DET_ISA_AVX512) return det_attn_chunk_avx512(rows, D, scale, qs, nq, next);
  if (isa == DET_ISA_AVX2) return det_attn_chunk_avx2(rows, D, scale, qs, nq, next);
#endif
  // The loops read keys as rows: the visible ones are copied out of their panels first.
  thread_local std::vector<float> group_o, k;
  group_o.resize(kGroups * D);
  k.resize(kChunk * D);
  int64_t u0 = kChunk, u1 = -1;
  for (int64_t i = 0; i < nq; ++i) u0 = std::min(u0, qs[i].j0), u1 = std::max(u1, qs[i].j1);
  for (int64_t j = u0; j <= u1; ++j)
    for (int64_t d = 0; d < D; ++d) k[j * D + d] = rows.k[det_kv_key_at(rows.n, D, j, d)];
  for (int64_t i = 0; i < nq; ++i) {
    *qs[i].part = chunk_partial(qs[i].q, k.data(), rows.v, D, qs[i].j0, qs[i].j1, scale, group_o.data());
    memcpy(qs[i].o, group_o.data(), D * sizeof(float));
  }
}

namespace {

// A row's visible chunks [cf, cl] and positions [lo, p].
struct RowRange {
  int64_t lo, p, cf, cl;
};

// Rows [r0, r1) (one sequence), KV head g, chunks [c0, c1]. whole: the unit holds every visible
// chunk of its rows; otherwise it is one span of one row's range.
struct Unit {
  int64_t r0, r1, g, c0, c1;
  bool whole;
};

// A (row, query head)'s state across chunks: (M, L) and O (D), or a stored chunk partial.
struct Partial {
  det_attn_acc run;
  float* O;
};

struct Step {
  const det_llama_layer* L;
  int64_t D, n_heads, group;
  float scale;
  const int64_t* positions;
  det_kv_cache* const* caches;
  const float* q;  // (B, n_heads * D)
  float* out;      // (B, n_heads * D)
  std::vector<RowRange> rows;
  std::vector<int64_t> span;  // per row: chunks per span (its whole range when not cut)
  std::vector<int64_t> slot0;  // per cut row: its first partial slot (slots are (D + 2) floats)
  float* slots = nullptr;
  const std::vector<Unit>* units = nullptr;         // every unit, and the index of the next one a
  const std::atomic<int64_t>* next_unit = nullptr;  // thread will take (units are dealt in order)

  // The slot of (row b, query head h, chunk c): m, l, then o.
  float* slot(int64_t b, int64_t h, int64_t c) const {
    const RowRange& w = rows[b];
    return slots + (slot0[b] + h * (w.cl - w.cf + 1) + (c - w.cf)) * (D + 2);
  }
};

// Chunk ch of unit u's KV head in its sequence's cache.
det_attn_rows chunk_rows(const Step& s, const Unit& u, int64_t ch) {
  const det_kv_cache* c = s.caches[u.r0];
  const int64_t head = det_kv_head_base(*s.L, c->capacity, u.g), base = ch * kChunk;
  return {c->k + head + det_kv_key_at(c->capacity, s.D, base, 0), c->v + head + det_kv_value_at(s.D, base, 0),
          std::min(kChunk, c->capacity - base)};
}

void store(float* at, det_attn_acc a, const float* o, int64_t D) {
  at[0] = a.m;
  at[1] = a.l;
  memcpy(at + 2, o, D * sizeof(float));
}

void finish(const det_attn_acc& run, const float* O, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = det_div_f32(O[d], run.l);
}

// A chunk's partial (part, o) to fold into a running state (run, O) after its first chunk.
struct Fold {
  det_attn_acc* run;
  float* O;
  det_attn_acc part;
  const float* o;
};

// det_attn_combine_f32 (not first) for each fold, the 2n exps of det_attn_merge_stats in one
// det_exp_sub(t, 0) call (exp(fl(t - 0)) = exp(t), bit for bit): one at a time, the scalar
// contract exp, whose fmas are libm calls in this file's baseline ISA, cost more than the fold.
void fold_all(const std::vector<Fold>& f, int64_t D, std::vector<float>& arg, std::vector<float>& wt) {
  const int64_t n = (int64_t)f.size();
  arg.resize(2 * n);
  wt.resize(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    const float M = f[i].part.m > f[i].run->m ? f[i].part.m : f[i].run->m;
    arg[2 * i] = det_sub_f32(f[i].run->m, M);
    arg[2 * i + 1] = det_sub_f32(f[i].part.m, M);
  }
  det_exp_sub(arg.data(), 0.0f, wt.data(), 2 * n);
  for (int64_t i = 0; i < n; ++i) {
    det_attn_acc& run = *f[i].run;
    const det_attn_weights ab = {wt[2 * i], wt[2 * i + 1]};
    run.l = det_add_f32(det_mul_f32(run.l, ab.a), det_mul_f32(f[i].part.l, ab.b));
    run.m = f[i].part.m > run.m ? f[i].part.m : run.m;
    for (int64_t d = 0; d < D; ++d) f[i].O[d] = det_attn_merge_value(f[i].O[d], f[i].o[d], ab);
  }
}

// A thread's buffers for its units: the running states, and one chunk's queries and partials.
struct UnitScratch {
  std::vector<float> O, o;  // (rows per unit * group, D) each
  std::vector<Partial> st;
  std::vector<det_attn_query> qs;
  std::vector<det_attn_acc> parts;
  std::vector<int64_t> who;  // each query's (row - r0) * group + head in group
  std::vector<Fold> folds;         // the partials that fold into a running state
  std::vector<float> arg, weight;  // fold_all's buffers
  explicit UnitScratch(int64_t n, int64_t D) : O(n * D), o(n * D), st(n), qs(n), parts(n), who(n) {}
};

// The first chunk of the unit the next free thread will take (often this one), or none: its rows
// are requested while this unit's last chunk computes, so that a unit rarely starts cold.
det_attn_rows first_of_next(const Step& s) {
  const int64_t i = s.next_unit->load(std::memory_order_relaxed);
  if (i >= (int64_t)s.units->size()) return {};
  const Unit& u = (*s.units)[i];
  return chunk_rows(s, u, u.c0);
}

// One unit: chunks in increasing order; in each, the partials of every row that sees it and every
// query head of g in one det_attn_chunk call (they share its K and V), then each one folded or stored.
void run_unit(const Step& s, const Unit& u, UnitScratch& x) {
  const int64_t D = s.D, QD = s.n_heads * D;
  for (int64_t i = 0; i < (u.r1 - u.r0) * s.group; ++i) x.st[i] = {{0.0f, 0.0f}, x.O.data() + i * D};
  for (int64_t ch = u.c0; ch <= u.c1; ++ch) {
    const int64_t base = ch * kChunk;
    int64_t n = 0;
    for (int64_t b = u.r0; b < u.r1; ++b) {
      const RowRange& w = s.rows[b];
      if (ch < w.cf || ch > w.cl) continue;
      const int64_t j0 = std::max(w.lo, base) - base, j1 = std::min(w.p, base + kChunk - 1) - base;
      for (int64_t hh = 0; hh < s.group; ++hh, ++n) {
        x.who[n] = (b - u.r0) * s.group + hh;
        x.qs[n] = {s.q + b * QD + (u.g * s.group + hh) * D, j0, j1, &x.parts[n], x.o.data() + n * D};
      }
    }
    const det_attn_rows next = ch < u.c1 ? chunk_rows(s, u, ch + 1) : first_of_next(s);
    det_attn_chunk(chunk_rows(s, u, ch), D, s.scale, x.qs.data(), n, next);
    // The span that starts a row's range folds as it goes; the others store their partials.
    x.folds.clear();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = u.r0 + x.who[i] / s.group, h = u.g * s.group + x.who[i] % s.group;
      const RowRange& w = s.rows[b];
      Partial& p = x.st[x.who[i]];
      if (!u.whole && u.c0 != w.cf)
        store(s.slot(b, h, ch), x.parts[i], x.qs[i].o, D);
      else if (ch == w.cf)
        det_attn_combine_f32(&p.run, p.O, x.parts[i], x.qs[i].o, D, true);
      else
        x.folds.push_back({&p.run, p.O, x.parts[i], x.qs[i].o});
    }
    fold_all(x.folds, D, x.arg, x.weight);
  }
  for (int64_t b = u.r0; b < u.r1; ++b) {
    const RowRange& w = s.rows[b];
    if (!u.whole && u.c0 != w.cf) continue;
    for (int64_t hh = 0; hh < s.group; ++hh) {
      const int64_t h = u.g * s.group + hh;
      const Partial& p = x.st[(b - u.r0) * s.group + hh];
      if (u.whole || u.c1 >= w.cl)
        finish(p.run, p.O, D, s.out + b * QD + h * D);
      else
        store(s.slot(b, h, u.c1), p.run, p.O, D);  // the prefix's state, where its last chunk's partial would be
    }
  }
}

// The second pass of a cut row: for each query head, the first span's state, then each later
// chunk's partial in order; the heads advance together, so each chunk's exps are one vector call.
void fold_slots(const Step& s, int64_t b, UnitScratch& x) {
  const RowRange& w = s.rows[b];
  const int64_t D = s.D, H = s.n_heads, first_end = std::min(w.cf + s.span[b] - 1, w.cl);
  x.O.resize(H * D);
  std::vector<det_attn_acc> run(H);
  for (int64_t h = 0; h < H; ++h) {
    const float* at = s.slot(b, h, first_end);
    run[h] = {at[0], at[1]};
    memcpy(x.O.data() + h * D, at + 2, D * sizeof(float));
  }
  for (int64_t ch = first_end + 1; ch <= w.cl; ++ch) {
    x.folds.clear();
    for (int64_t h = 0; h < H; ++h) {
      const float* part = s.slot(b, h, ch);
      x.folds.push_back({&run[h], x.O.data() + h * D, {part[0], part[1]}, part + 2});
    }
    fold_all(x.folds, D, x.arg, x.weight);
  }
  for (int64_t h = 0; h < H; ++h) finish(run[h], x.O.data() + h * D, D, s.out + b * H * D + h * D);
}

}  // namespace

void det_cpu_attend(const det_llama_model* m, const det_llama_layer& L, int64_t B, const int64_t* positions,
                    det_kv_cache* const* caches, const float* q, float* out) {
  Step s;
  s.L = &L;
  s.D = L.head_dim;
  s.n_heads = m->n_heads;
  s.group = m->n_heads / m->n_kv_heads;
  s.scale = det_rsqrt_f32((float)m->attn_scale_dim);
  s.positions = positions;
  s.caches = caches;
  s.q = q;
  s.out = out;
  const int64_t G = m->n_kv_heads;
  s.rows.resize(B);
  int64_t chunks = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = positions[b], lo = L.window > 0 ? std::max<int64_t>(0, p - L.window + 1) : 0;
    s.rows[b] = {lo, p, lo / kChunk, p / kChunk};
    chunks += p / kChunk - lo / kChunk + 1;
  }
  // Units: runs of up to kRowsPerUnit consecutive rows of one sequence, per KV head.
  std::vector<Unit> units;
  for (int64_t b = 0; b < B;) {
    int64_t e = b + 1;
    while (e < B && e - b < kRowsPerUnit && caches[e] == caches[b]) ++e;
    int64_t c0 = s.rows[b].cf, c1 = s.rows[b].cl;
    for (int64_t i = b; i < e; ++i) c0 = std::min(c0, s.rows[i].cf), c1 = std::max(c1, s.rows[i].cl);
    for (int64_t g = 0; g < G; ++g) units.push_back({b, e, g, c0, c1, true});
    b = e;
  }
  const int64_t threads = det_parallel_threads();
  s.span.assign(B, 0);
  s.slot0.assign(B, 0);
  if (threads > 1 && (int64_t)units.size() < kUnitsPerThread * threads) {
    // Too few units: each row alone, its range cut into spans of about chunks * G / (units wanted).
    const int64_t per = std::max<int64_t>(1, (chunks * G + kUnitsPerThread * threads - 1) / (kUnitsPerThread * threads));
    units.clear();
    int64_t n_slots = 0;
    for (int64_t b = 0; b < B; ++b) {
      const RowRange& w = s.rows[b];
      s.span[b] = per;
      s.slot0[b] = n_slots;
      n_slots += s.n_heads * (w.cl - w.cf + 1);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t c0 = w.cf; c0 <= w.cl; c0 += per)
          units.push_back({b, b + 1, g, c0, std::min(c0 + per - 1, w.cl), per > w.cl - w.cf});
    }
    thread_local std::vector<float> buf;
    buf.resize(n_slots * (s.D + 2));
    s.slots = buf.data();
  }
  std::vector<int64_t> cut;  // rows whose range was cut: the second pass folds their slots
  for (int64_t b = 0; b < B; ++b)
    if (s.span[b] > 0 && s.span[b] <= s.rows[b].cl - s.rows[b].cf) cut.push_back(b);
  const int64_t n_units = (int64_t)units.size(), n_folds = (int64_t)cut.size();
  std::atomic<int64_t> next{0};  // units are taken as threads free up: their costs differ
  s.units = &units;
  s.next_unit = &next;
  det_parallel_team([&](int64_t t, int64_t nt) {
    UnitScratch x(kRowsPerUnit * s.group, s.D);
    for (int64_t i = next++; i < n_units; i = next++) run_unit(s, units[i], x);
    if (n_folds == 0) return;
    det_parallel_barrier();  // every span's slots written
    for (int64_t i = t; i < n_folds; i += nt) fold_slots(s, cut[i], x);
  });
}
