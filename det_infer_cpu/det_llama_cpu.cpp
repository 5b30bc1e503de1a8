// det_llama_cpu.cpp: the llama-family forward pass of docs/SPEC.md §13 on the CPU.
//
// Work is split across threads by output (weight rows of a GEMV, (row, head) pairs of the
// attention, elements of the elementwise steps); every reduction runs inside one task in the
// contract's order, so neither the thread count nor the grouping of rows changes a bit.
#include "det_llama_cpu.h"

#include <string.h>

#include <algorithm>
#include <vector>

#include "../contract/det_act.h"
#include "../contract/det_argmax.h"
#include "../contract/det_model_ops.h"
#include "../contract/det_norm.h"
#include "../contract/det_trig.h"
#include "det_attn_cpu.h"
#include "det_kernels_cpu.h"
#include "det_parallel.h"
#include "det_sample_cpu.h"
#include "../model/det_program.h"

namespace {

constexpr int64_t kRowBlock = 128;  // rows carried through the layers together (scheduling only)
constexpr int64_t kMinParallelRows = 8;  // norms of fewer rows run on the calling thread
// X staged once on the calling thread for the matrices that read it (det_gemv_stage).
det_gemv_input stage(const det_matrix* const* W, int n, const float* X, int64_t K, int64_t B) {
  thread_local det_staging buf;
  return det_gemv_stage(W, n, X, K, B, buf);
}

// Y (B, N) = X (B, K) times W (N, K) transposed, parallel over the N weight rows.
void gemv(const det_matrix& W, int64_t N, int64_t K, const float* X, int64_t B, float* Y) {
  const det_matrix* list[] = {&W};
  const det_gemv_input in = stage(list, 1, X, K, B);
  det_parallel_chunks(N, [&](int64_t r0, int64_t r1) { det_gemv_rows(W, in, Y, N, r0, r1); });
}

// Several matrices sharing one input, in one parallel region: their rows are split across the
// threads as one concatenated range (fewer thread wake-ups per layer; same per-row work).
struct GemvPart {
  const det_matrix* W;
  int64_t N;
  float* Y;  // (B, N)
};
constexpr int kMaxParts = 3;  // Q, K and V
void gemv_parts(const GemvPart* parts, int n_parts, int64_t K, const float* X, int64_t B) {
  const det_matrix* list[kMaxParts];
  int64_t total = 0;
  for (int i = 0; i < n_parts; ++i) total += parts[i].N, list[i] = parts[i].W;
  const det_gemv_input in = stage(list, n_parts, X, K, B);
  det_parallel_chunks(total, [&](int64_t r0, int64_t r1) {
    int64_t base = 0;
    for (int i = 0; i < n_parts; ++i) {
      const int64_t a = std::max(r0, base), b = std::min(r1, base + parts[i].N);
      if (a < b) det_gemv_rows(*parts[i].W, in, parts[i].Y, parts[i].N, a - base, b - base);
      base += parts[i].N;
    }
  });
}

// gate and up rows, then act(gate) * up on the same elements, in one parallel region: the result
// overwrites gate.
void gemv_gate_up_act(int act, const det_matrix& Wg, const det_matrix& Wu, int64_t I, int64_t K, const float* X,
                      int64_t B, float* gate, float* up) {
  const det_matrix* list[] = {&Wg, &Wu};
  const det_gemv_input in = stage(list, 2, X, K, B);
  det_parallel_chunks(I, [&](int64_t r0, int64_t r1) {
    det_gemv_rows(Wg, in, gate, I, r0, r1);
    det_gemv_rows(Wu, in, up, I, r0, r1);
    for (int64_t b = 0; b < B; ++b)
      det_act_mul(act, gate + b * I + r0, up + b * I + r0, gate + b * I + r0, r1 - r0);
  });
}

// ---- elementwise steps --------------------------------------------------------------------------
DET_CPU_CLONES void rmsnorm_rows(const float* X, const float* w, float* Y, int64_t K, float eps,
                                 int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) det_rmsnorm_ref(X + r * K, w, Y + r * K, K, eps);
}

// y = rmsnorm(x) * w for each of `rows` rows of length K (rows may be heads inside a vector).
void rmsnorm(const float* X, const float* w, float* Y, int64_t rows, int64_t K, float eps) {
  det_parallel_chunks(rows, [&](int64_t r0, int64_t r1) { rmsnorm_rows(X, w, Y, K, eps, r0, r1); },
                      kMinParallelRows);
}

DET_CPU_CLONES void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = det_add_f32(x[i], y[i]);
}

// Rotates each head of v (heads x head_dim) in place: pair (i, i + half) by the row's (sin, cos)
// table entry i, for i < pairs.
void rope_heads(float* v, int64_t heads, int64_t head_dim, const det_rope_table& t, const det_sincos_f32* sc) {
  for (int64_t h = 0; h < heads; ++h) {
    float* x = v + h * head_dim;
    for (int64_t i = 0; i < t.pairs; ++i) det_rope_rotate_f32(&x[i], &x[i + t.half], sc[i]);
  }
}

// Each of B rows of n values plus the bias (n,): y = fl(y + bias), the projection's bias add.
void add_bias(float* y, const float* bias, int64_t B, int64_t n) {
  if (!bias) return;
  for (int64_t b = 0; b < B; ++b) add_into(y + b * n, bias, n);
}

// x = fl(x * s) elementwise (Gemma-4's layer scalar).
DET_CPU_CLONES void scale_into(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = det_mul_f32(x[i], s);
}

// ---- one block of rows through the layer plan ------------------------------------------------
struct Block {
  std::vector<float> x, h, q, k, v, att, gate, up, tmp, ple;  // gate holds act(gate) * up, or the PLE branch's
  std::vector<det_sincos_f32> sc;
};

// The rows of one block and where their results go: what every step reads besides its operands.
struct Rows {
  const det_llama_model* m;
  int64_t B;
  const int32_t* tokens;
  const int64_t* positions;
  det_kv_cache* const* caches;
  const uint8_t* want;  // null: every row wants logits
  float* logits;
  Block& w;
};

// EMBED: the residual stream starts as the embeddings; every table's (sin, cos) of each row's
// position, table t from rope[t].offset.
void step_embed(const Rows& r) {
  const det_llama_model* m = r.m;
  const int64_t H = m->hidden, pairs = m->rope_pairs;
  for (int64_t b = 0; b < r.B; ++b) {
    const uint16_t* e = m->embed + (int64_t)r.tokens[b] * H;
    for (int64_t i = 0; i < H; ++i) r.w.x[b * H + i] = det_embed_f32(e[i], m->embed_scale);
    for (int64_t i = 0; i < pairs; ++i)
      r.w.sc[b * pairs + i] = det_sincos_f64(det_rope_angle_f64(r.positions[b], m->inv_freq[i]));
  }
}

// PLE_PROJECT and PLE_FINISH (docs/SPEC.md §13.7): ple (B, n_layers * P) = fl(x·Wproj * rsqrt(H)),
// then per (row, layer) slice of P the norm and det_ple_combine_f32.
void step_ple_project(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  r.w.ple.resize(r.B * s.n);
  gemv(m->ple_model_proj, s.n, s.k, r.w.x.data(), r.B, r.w.ple.data());
  scale_into(r.w.ple.data(), det_ple_scales_of(m->hidden, m->ple_dim).proj, r.B * s.n);
}

void step_ple_finish(const Rows& r) {
  const det_llama_model* m = r.m;
  const int64_t LP = m->n_layers * m->ple_dim;
  const det_ple_scales k = det_ple_scales_of(m->hidden, m->ple_dim);
  rmsnorm(r.w.ple.data(), m->ple_proj_norm, r.w.ple.data(), r.B * m->n_layers, m->ple_dim, m->rms_eps);
  for (int64_t b = 0; b < r.B; ++b) {
    const uint16_t* e = m->ple_embed + (int64_t)r.tokens[b] * LP;
    float* y = r.w.ple.data() + b * LP;
    for (int64_t i = 0; i < LP; ++i) y[i] = det_ple_combine_f32(y[i], e[i], k);
  }
}

// QKV: the attention input norm, then Wq (and Wk, Wv for a layer that stores its own K/V), each
// plus its bias when the model has them.
void step_qkv(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  const det_llama_layer& L = m->layers[s.layer];
  const int64_t QD = m->n_heads * L.head_dim, KVD = m->n_kv_heads * L.head_dim;
  rmsnorm(r.w.x.data(), L.attn_norm, r.w.h.data(), r.B, m->hidden, m->rms_eps);
  const GemvPart qkv[3] = {{&L.wq, QD, r.w.q.data()}, {&L.wk, KVD, r.w.k.data()}, {&L.wv, KVD, r.w.v.data()}};
  gemv_parts(qkv, L.kv_source == s.layer ? 3 : 1, s.k, r.w.h.data(), r.B);
  add_bias(r.w.q.data(), L.bq, r.B, QD);
  add_bias(r.w.k.data(), L.bk, r.B, KVD);
  add_bias(r.w.v.data(), L.bv, r.B, KVD);
}

// ROPE: head norms, the rotation, and the row's K and V into its cache at its position.
void step_rope(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  const det_llama_layer& L = m->layers[s.layer];
  const int64_t D = L.head_dim, QD = m->n_heads * D, KVD = m->n_kv_heads * D, B = r.B;
  const det_rope_table& rope = m->rope[L.rope_table];
  const bool own_kv = L.kv_source == s.layer;
  if (L.q_norm) rmsnorm(r.w.q.data(), L.q_norm, r.w.q.data(), B * m->n_heads, D, m->rms_eps);
  if (own_kv && L.k_norm) rmsnorm(r.w.k.data(), L.k_norm, r.w.k.data(), B * m->n_kv_heads, D, m->rms_eps);
  if (own_kv && L.v_norm) rmsnorm(r.w.v.data(), L.v_norm, r.w.v.data(), B * m->n_kv_heads, D, m->rms_eps);
  for (int64_t b = 0; b < B; ++b) {
    const det_sincos_f32* sc = r.w.sc.data() + b * m->rope_pairs + rope.offset;
    rope_heads(r.w.q.data() + b * QD, m->n_heads, D, rope, sc);
    if (!own_kv) continue;
    rope_heads(r.w.k.data() + b * KVD, m->n_kv_heads, D, rope, sc);
    const det_kv_cache* c = r.caches[b];
    const int64_t p = r.positions[b];
    for (int64_t g = 0; g < m->n_kv_heads; ++g) {
      const int64_t head = det_kv_head_base(L, c->capacity, g);
      const float* k = r.w.k.data() + b * KVD + g * D;
      for (int64_t d = 0; d < D; ++d) c->k[head + det_kv_key_at(c->capacity, D, p, d)] = k[d];
      memcpy(c->v + head + det_kv_value_at(D, p, 0), r.w.v.data() + b * KVD + g * D, D * sizeof(float));
    }
  }
}

// ATTEND: every (row, query head) over its cache (det_attn_cpu.cpp).
void step_attend(const Rows& r, const det_step& s) {
  det_cpu_attend(r.m, r.m->layers[s.layer], r.B, r.positions, r.caches, r.w.q.data(), r.w.att.data());
}

// MLP: the MLP input norm, then act(gate) * up into w.gate.
void step_mlp(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  const det_llama_layer& L = m->layers[s.layer];
  rmsnorm(r.w.x.data(), L.mlp_norm, r.w.h.data(), r.B, m->hidden, m->rms_eps);
  gemv_gate_up_act((int)m->act, L.w_gate, L.w_up, s.n, s.k, r.w.h.data(), r.B, r.w.gate.data(), r.w.up.data());
}

// PLE_GATE: gelu(x·Wgate) * the layer's per-layer input, into w.gate.
void step_ple_gate(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  const int64_t P = s.n;
  gemv(m->layers[s.layer].ple_gate, P, s.k, r.w.x.data(), r.B, r.w.gate.data());
  for (int64_t b = 0; b < r.B; ++b)
    det_act_mul(DET_ACT_GELU_TANH, r.w.gate.data() + b * P, r.w.ple.data() + (b * m->n_layers + s.layer) * P,
                r.w.gate.data() + b * P, P);
}

// RESIDUAL: y = in·W (plus its bias), normalized first when the step has an output norm; x += y; then the scalar.
void step_residual(const Rows& r, const det_step& s) {
  const float* in = s.input == DET_IN_ATT ? r.w.att.data() : r.w.gate.data();
  gemv(s.w, s.n, s.k, in, r.B, r.w.tmp.data());
  add_bias(r.w.tmp.data(), s.bias, r.B, s.n);
  if (s.norm) rmsnorm(r.w.tmp.data(), s.norm, r.w.tmp.data(), r.B, s.n, r.m->rms_eps);
  add_into(r.w.x.data(), r.w.tmp.data(), r.B * s.n);
  if (s.scalar) scale_into(r.w.x.data(), *s.scalar, r.B * s.n);
}

// HEAD: the final norm and lm_head for the rows that want logits (gathered first), softcapped.
void step_head(const Rows& r, const det_step& s) {
  const det_llama_model* m = r.m;
  const int64_t H = m->hidden;
  float* x = r.w.x.data();
  int64_t nw = 0;
  for (int64_t b = 0; b < r.B; ++b)
    if (!r.want || r.want[b]) {
      if (nw != b) memcpy(x + nw * H, x + b * H, H * sizeof(float));
      ++nw;
    }
  if (nw == 0) return;
  rmsnorm(x, m->final_norm, r.w.h.data(), nw, H, m->rms_eps);
  gemv(det_dense_matrix(m->lm_head), s.n, s.k, r.w.h.data(), nw, r.logits);
  if (m->softcap)
    for (int64_t i = 0; i < nw * s.n; ++i) r.logits[i] = det_softcap_f32(r.logits[i], *m->softcap);
}

// The block's rows through every step of the model's plan.
void forward_block(const Rows& r) {
  const det_llama_model* m = r.m;
  const int64_t B = r.B, H = m->hidden, QDmax = m->n_heads * m->head_dim, KVDmax = m->n_kv_heads * m->head_dim;
  const int64_t Imax = m->inter, P = m->ple_dim;
  Block& w = r.w;
  w.x.resize(B * H); w.h.resize(B * std::max(H, QDmax)); w.q.resize(B * QDmax); w.k.resize(B * KVDmax);
  w.v.resize(B * KVDmax); w.att.resize(B * QDmax); w.gate.resize(B * std::max(Imax, P)); w.up.resize(B * Imax);
  w.tmp.resize(B * std::max(H, Imax)); w.sc.resize(B * m->rope_pairs);
  for (int64_t i = 0; i < m->n_steps; ++i) {
    const det_step& s = m->steps[i];
    switch (s.kind) {
      case DET_STEP_EMBED: step_embed(r); break;
      case DET_STEP_PLE_PROJECT: step_ple_project(r, s); break;
      case DET_STEP_PLE_FINISH: step_ple_finish(r); break;
      case DET_STEP_QKV: step_qkv(r, s); break;
      case DET_STEP_ROPE: step_rope(r, s); break;
      case DET_STEP_ATTEND: step_attend(r, s); break;
      case DET_STEP_MLP: step_mlp(r, s); break;
      case DET_STEP_PLE_GATE: step_ple_gate(r, s); break;
      case DET_STEP_RESIDUAL: step_residual(r, s); break;
      case DET_STEP_HEAD: step_head(r, s); break;
    }
  }
}

}  // namespace

int det_llama_forward(const det_llama_model* m, int64_t n, const int32_t* tokens, const int64_t* positions,
                      const int32_t* seq, det_kv_cache* const* caches, int64_t n_seq, const uint8_t* want_logits,
                      float* logits) {
  if (!m || !tokens || !positions || !seq || !caches || n_seq < 1 || !logits || !det_llama_model_valid(m))
    return DET_ERR_ARG;
  std::vector<int64_t> capacity(n_seq);
  for (int64_t s = 0; s < n_seq; ++s) {
    if (!caches[s] || !caches[s]->k || !caches[s]->v) return DET_ERR_ARG;
    capacity[s] = caches[s]->capacity;
  }
  int rc = det_program_check(m, n, tokens, positions, seq, nullptr, n_seq, capacity.data(), 0, nullptr);
  if (rc != DET_OK) return rc;
  det_fpenv_guard env;
  Block w;
  std::vector<det_kv_cache*> row_cache(kRowBlock);
  float* out = logits;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t B = std::min(kRowBlock, n - r0);
    for (int64_t b = 0; b < B; ++b) row_cache[b] = caches[seq[r0 + b]];
    const uint8_t* want = want_logits ? want_logits + r0 : nullptr;
    forward_block({m, B, tokens + r0, positions + r0, row_cache.data(), want, out, w});
    for (int64_t b = 0; b < B; ++b)
      if (!want || want[b]) out += m->vocab;
  }
  return DET_OK;
}

int det_llama_generate(const det_llama_model* m, int64_t B, const int32_t* prompts,
                       const int64_t* prompt_offsets, const int64_t* start_positions,
                       det_kv_cache* const* caches, int64_t max_new, const int32_t* stop_ids,
                       int64_t n_stop, const det_sample_params* sample, int32_t* out_tokens,
                       int64_t* out_lengths, float* step_logits) {
  if (!m || B < 1 || !prompts || !prompt_offsets || !start_positions || !caches || max_new < 1 ||
      !out_tokens || !out_lengths || (n_stop > 0 && !stop_ids))
    return DET_ERR_ARG;
  const int64_t V = m->vocab;
  det_program_rows rows;
  int rc = det_program_prefill(B, prompts, prompt_offsets, start_positions, rows);
  if (rc != DET_OK) return rc;
  std::vector<int64_t> capacity(B);
  for (int64_t b = 0; b < B; ++b) {
    if (!caches[b]) return DET_ERR_ARG;
    capacity[b] = caches[b]->capacity;
  }
  rc = det_program_check(m, rows.size(), rows.tokens.data(), rows.positions.data(), rows.seq.data(),
                         rows.want.data(), B, capacity.data(), max_new, nullptr);
  if (rc != DET_OK) return rc;
  // The prefill in one forward call: the logits of each prompt's last row.
  std::vector<float> logits(B * V);
  rc = det_llama_forward(m, rows.size(), rows.tokens.data(), rows.positions.data(), rows.seq.data(), caches, B,
                         rows.want.data(), logits.data());
  if (rc != DET_OK) return rc;

  std::vector<int64_t> next_pos(B), active;
  // The picks of a step are independent (each sequence's own logits, parameters and position), so a
  // batch's sampled ones are spread over the threads, each with its own scratch: a draw reads the
  // whole vocabulary several times (about 0.4-0.5 ms at 49,152 ids on a Zen 5 core).
  // Scratch rows: one a thread that draws (det_parallel_round_robin gives a task to threads 0..B-1).
  const int64_t scratch = sample ? std::min<int64_t>(det_parallel_threads(), B) : 0;
  std::vector<float> sample_e(scratch * V);
  std::vector<int32_t> sample_heap(scratch * V), ids(B);
  det_fpenv_guard env;  // greedy picks and a lone draw run on this thread
  for (int64_t b = 0; b < B; ++b) {
    next_pos[b] = start_positions[b] + prompt_offsets[b + 1] - prompt_offsets[b];
    out_lengths[b] = 0;
    active.push_back(b);
  }
  auto pick = [&](size_t a, int64_t thread) {
    const int64_t b = active[a];
    const float* lg = logits.data() + a * V;
    ids[a] = sample ? det_cpu_sample_f32(lg, V, sample[b], next_pos[b], sample_e.data() + thread * V,
                                         sample_heap.data() + thread * V)
                    : (int32_t)det_argmax_f32_ref(lg, V);
  };
  for (int64_t t = 0; t < max_new && !active.empty(); ++t) {
    std::vector<int64_t> still;
    det_program_rows step;
    if (sample && active.size() > 1)  // a greedy pick is one pass: not worth waking the team
      det_parallel_round_robin((int64_t)active.size(), [&](int64_t first, int64_t nt) {
        for (int64_t a = first; a < (int64_t)active.size(); a += nt) pick(a, first);
      });
    else
      for (size_t a = 0; a < active.size(); ++a) pick(a, 0);
    for (size_t a = 0; a < active.size(); ++a) {
      const int64_t b = active[a];
      const float* lg = logits.data() + a * V;
      const int32_t id = ids[a];
      out_tokens[b * max_new + t] = id;
      out_lengths[b] = t + 1;
      if (step_logits) memcpy(step_logits + (b * max_new + t) * V, lg, V * sizeof(float));
      if (!det_decode_continues(id, t, max_new, stop_ids, n_stop)) continue;
      still.push_back(b);
      step.add(id, next_pos[b]++, (int32_t)b, true);
    }
    active.swap(still);
    if (active.empty()) break;
    rc = det_llama_forward(m, step.size(), step.tokens.data(), step.positions.data(), step.seq.data(), caches, B,
                           nullptr, logits.data());
    if (rc != DET_OK) return rc;
  }
  return DET_OK;
}
