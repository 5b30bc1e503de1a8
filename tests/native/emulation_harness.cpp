// emulation_harness.cpp: the megakernel under host SIMT emulation against the CPU engine, torch-free,
// built with AddressSanitizer and UBSan by tests/test_emulation_sanitized.py: every out-of-bounds
// access of the device code (or the engine) on the way is reported. Small llama-family models with
// seeded bf16 weights (with and without qk-norm, with a sliding window; projections dense or nf4-packed
// in exactly sized buffers, blocks of 16 and of 8), several programs (two
// sequences interleaved, a prefill crossing a 128-position chunk, generation with a stop id) and
// several geometries, greedy and sampled; every emulated result must equal the engine's bit for bit.
// A Gemma-4 layout adds per-layer head sizes (one above 256, not a multiple of 256), MLP widths, KV
// sharing, v norm, proportional rope, per-layer inputs, layer scalars and a softcapped head.
// Prints "ok <cases>" or the first mismatch, and exits non-zero on a mismatch.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "det_infer_cpu/det_llama_cpu.h"
#include "megakernel/det_megakernel.h"

namespace {

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint32_t next_u32() {  // xorshift64*
  g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
  return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}
// bf16 bits of a value uniform in [-scale, scale) (+ offset), exactly representable steps.
uint16_t weight(float scale, float offset) {
  const float u = ((float)(next_u32() >> 8) / 16777216.0f * 2.0f - 1.0f) * scale + offset;
  uint32_t b;
  memcpy(&b, &u, 4);
  return (uint16_t)(b >> 16);
}

struct Model {
  det_llama_model m{};
  std::vector<det_llama_layer> layers;
  std::vector<std::vector<uint16_t>> store;
  std::vector<std::vector<float>> norms;
  std::vector<double> inv_freq;
  std::vector<std::vector<uint8_t>> codes;  // nf4 projections: codes and absmax, each exactly sized
  std::vector<std::vector<float>> scales;
  float code[16];
  int nf4_shift;  // 0: dense bf16 projections

  const uint16_t* tensor(size_t n, float scale, float offset = 0.0f) {
    store.emplace_back(n);
    for (auto& w : store.back()) w = weight(scale, offset);
    return store.back().data();
  }
  // Norm multipliers: bf16 weights widened, plus Gemma's 1 (offset).
  const float* norm(size_t n, float offset) {
    const uint16_t* w = tensor(n, 0.2f, 1.0f - offset);
    norms.emplace_back(n);
    for (size_t i = 0; i < n; ++i) norms.back()[i] = det_add_f32(det_bf16_to_f32(w[i]), offset);
    return norms.back().data();
  }
  det_matrix matrix(size_t n, float scale) {
    det_matrix w{};
    if (!nf4_shift) {
      w.bf16 = tensor(n, scale);
      return w;
    }
    codes.emplace_back(n / 2);
    for (auto& c : codes.back()) c = (uint8_t)next_u32();
    scales.emplace_back(((n - 1) >> nf4_shift) + 1);
    for (auto& a : scales.back()) a = scale * (0.25f + (float)(next_u32() >> 8) / 16777216.0f);
    w.nf4 = codes.back().data(), w.absmax = scales.back().data(), w.code = code, w.block_shift = nf4_shift;
    return w;
  }
  // gemma: Gemma-3's switches (output norms, 1 + w norms, gelu-tanh, a sliding layer 0 with its own
  // rope table and a full layer 1, a query_pre_attn_scalar, the embedding scale).
  Model(bool qk_norm, int64_t window, int nf4_block_shift = 0, bool gemma = false) : nf4_shift(nf4_block_shift) {
    const uint32_t code_bits[16] = DET_NF4_CODE_BITS;
    memcpy(code, code_bits, sizeof code);
    m.hidden = 64, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 24, m.inter = 96, m.vocab = 300;
    m.rope_tables = gemma ? 2 : 1, m.rms_eps = 1e-5f;
    for (int t = 0; t < m.rope_tables; ++t) m.rope[t] = {12, 12, 12 * t};
    m.rope_pairs = 12 * m.rope_tables;
    m.attn_scale_dim = gemma ? 20 : m.head_dim, m.act = gemma ? DET_ACT_GELU_TANH : DET_ACT_SILU;
    m.embed_scale = gemma ? sqrtf((float)m.hidden) : 1.0f;
    const float offset = gemma ? 1.0f : 0.0f;
    const int64_t H = m.hidden, QD = m.n_heads * m.head_dim, KVD = m.n_kv_heads * m.head_dim, I = m.inter;
    store.reserve(64);
    norms.reserve(64);
    for (int t = 0; t < m.rope_tables; ++t)
      for (int i = 0; i < m.rope[t].pairs; ++i) inv_freq.push_back(pow(t ? 1e6 : 1e4, -2.0 * i / 24.0));
    m.inv_freq = inv_freq.data();
    m.embed = tensor(m.vocab * H, gemma ? 0.15f : 1.0f);
    m.final_norm = norm(H, offset);
    m.lm_head = tensor(m.vocab * H, 0.5f);
    for (int64_t l = 0; l < m.n_layers; ++l) {
      det_llama_layer L{};
      L.attn_norm = norm(H, offset);
      L.wq = matrix(QD * H, 0.3f);
      L.wk = matrix(KVD * H, 0.3f);
      L.wv = matrix(KVD * H, 0.3f);
      L.wo = matrix(H * QD, 0.3f);
      L.q_norm = qk_norm ? norm(m.head_dim, offset) : nullptr;
      L.k_norm = qk_norm ? norm(m.head_dim, offset) : nullptr;
      L.attn_out_norm = gemma ? norm(H, offset) : nullptr;
      L.mlp_norm = norm(H, offset);
      L.w_gate = matrix(I * H, 0.3f);
      L.w_up = matrix(I * H, 0.3f);
      L.w_down = matrix(H * I, 0.3f);
      L.mlp_out_norm = gemma ? norm(H, offset) : nullptr;
      L.window = gemma ? (l == 0 ? window : 0) : window;
      L.rope_table = gemma && l == 0 ? 1 : 0;
      L.head_dim = m.head_dim, L.inter = m.inter, L.kv_source = l, L.kv_offset = l * KVD;
      layers.push_back(L);
    }
    m.layers = layers.data();
    m.kv_row = m.n_layers * KVD;
  }
};

// Gemma-4's switches at a small size (docs/SPEC.md §13.7): layer 0 sliding (head 16, rope table 1),
// layer 1 full (head 264: its q takes a second, partial slice per lane; proportional rope, 33
// pairs (x_i, x_{i+132})), layer 2 sliding reading layer 0's K/V with a double-wide MLP; per-layer
// inputs of 16, layer scalars, softcap 30.
struct Gemma4Model : Model {
  std::vector<float> ones, scalars;
  float softcap = 30.0f;

  Gemma4Model() : Model(false, 0) {
    const int64_t H = 64, P = 16, D[3] = {16, 264, 16}, I[3] = {96, 96, 192}, src[3] = {0, 1, 0};
    layers.clear();
    inv_freq.clear();
    m.n_layers = 3, m.head_dim = 264, m.inter = 192, m.rope_tables = 2;
    m.rope[0] = {33, 132, 0}, m.rope[1] = {8, 8, 33}, m.rope_pairs = 41;
    for (int i = 0; i < 33; ++i) inv_freq.push_back(pow(1e6, -2.0 * i / 264.0));
    for (int i = 0; i < 8; ++i) inv_freq.push_back(pow(1e4, -2.0 * i / 16.0));
    m.inv_freq = inv_freq.data();
    m.attn_scale_dim = 1, m.act = DET_ACT_GELU_TANH, m.embed_scale = 8.0f;  // fl32(sqrt(64))
    m.embed = tensor(m.vocab * H, 0.15f);
    m.final_norm = norm(H, 0.0f);
    m.softcap = &softcap;
    m.ple_dim = P;
    m.ple_embed = tensor(m.vocab * m.n_layers * P, 0.5f);
    m.ple_model_proj = matrix(m.n_layers * P * H, 0.3f);
    m.ple_proj_norm = norm(P, 0.0f);
    ones.assign(m.head_dim, 1.0f);
    scalars = {0.75f, 0.5f, 0.875f};
    int64_t offset = 0;
    for (int64_t l = 0; l < m.n_layers; ++l) {
      const int64_t QD = m.n_heads * D[l], KVD = m.n_kv_heads * D[l];
      det_llama_layer L{};
      L.head_dim = D[l], L.inter = I[l], L.kv_source = src[l];
      L.window = l == 1 ? 0 : 40, L.rope_table = l == 1 ? 0 : 1;
      L.attn_norm = norm(H, 0.0f);
      L.wq = matrix(QD * H, 0.3f);
      if (src[l] == l) {
        L.wk = matrix(KVD * H, 0.3f);
        L.wv = matrix(KVD * H, 0.3f);
        L.kv_offset = offset;
        offset += KVD;
      } else {
        L.kv_offset = layers[src[l]].kv_offset;
      }
      L.wo = matrix(H * QD, 0.3f);
      L.q_norm = norm(D[l], 0.0f);
      L.k_norm = norm(D[l], 0.0f);
      L.v_norm = ones.data();
      L.attn_out_norm = norm(H, 0.0f);
      L.mlp_norm = norm(H, 0.0f);
      L.w_gate = matrix(I[l] * H, 0.3f);
      L.w_up = matrix(I[l] * H, 0.3f);
      L.w_down = matrix(H * I[l], 0.3f);
      L.mlp_out_norm = norm(H, 0.0f);
      L.ple_gate = matrix(P * H, 0.3f);
      L.ple_proj = matrix(H * P, 0.3f);
      L.ple_out_norm = norm(H, 0.0f);
      L.scalar = &scalars[l];
      layers.push_back(L);
    }
    m.layers = layers.data();
    m.kv_row = offset;
  }
};

struct Caches {
  std::vector<std::vector<float>> k, v;
  std::vector<det_kv_cache> views;
  Caches(const det_llama_model& m, int n, int64_t cap) {
    for (int i = 0; i < n; ++i) {
      k.emplace_back(cap * m.kv_row, 0.0f);
      v.emplace_back(k.back().size(), 0.0f);
    }
    for (int i = 0; i < n; ++i) views.push_back({k[i].data(), v[i].data(), cap});
  }
};

int failures = 0, cases = 0;

void expect_equal(const void* a, const void* b, size_t bytes, const char* what, const det_mk_geometry& g) {
  ++cases;
  if (memcmp(a, b, bytes) == 0) return;
  ++failures;
  printf("MISMATCH %s at geometry grid %d warps %d ring %d tile %d seed %llu\n", what, g.grid, g.warps, g.ring,
         g.tile_rows, (unsigned long long)g.seed);
}

det_mk_params params(const Model& M, std::vector<unsigned char>& ws, const det_mk_geometry& g) {
  det_mk_params p{};
  p.model = M.m;
  ws.assign(det_mk_workspace_bytes(&M.m, g.tile_rows) + 16, 0);
  p.ws = det_mk_workspace_carve(&M.m, g.tile_rows, ws.data());
  p.geo = g;
  return p;
}

// Two sequences' rows interleaved (seq 0: 150 positions, crossing a chunk; seq 1: 20), all wanted.
void forward_case(const Model& M, const det_mk_geometry& g) {
  const int64_t V = M.m.vocab, cap = 160;
  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  int64_t next[2] = {0, 0};
  for (int i = 0; i < 170; ++i) {
    const int s = (i % 8 == 3 && next[1] < 20) ? 1 : (next[0] < 150 ? 0 : 1);
    tok.push_back((int32_t)(next_u32() % V));
    seq.push_back(s);
    pos.push_back(next[s]++);
  }
  std::vector<uint8_t> want(tok.size(), 1);
  Caches ce(M.m, 2, cap), cm(M.m, 2, cap);
  std::vector<det_kv_cache*> rows;
  for (int32_t s : seq) rows.push_back(&ce.views[s]);
  std::vector<float> a(tok.size() * V), b(tok.size() * V);
  if (det_llama_forward(&M.m, (int64_t)tok.size(), tok.data(), pos.data(), rows.data(), want.data(), a.data())) {
    printf("engine refused the program\n");
    ++failures;
    return;
  }
  std::vector<det_mk_seq> seqs;
  for (auto& v : cm.views) seqs.push_back({v.k, v.v, v.capacity});
  std::vector<unsigned char> ws;
  det_mk_params p = params(M, ws, g);
  p.prog.n_rows = (int64_t)tok.size();
  p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
  p.prog.n_seq = 2, p.prog.seqs = seqs.data(), p.prog.logits = b.data();
  const int rc = det_mk_run_emulated(&p);
  if (rc != DET_MK_OK) printf("emulation failed: %d\n", rc), ++failures;
  expect_equal(a.data(), b.data(), a.size() * 4, "forward logits", g);
  expect_equal(ce.k[0].data(), cm.k[0].data(), ce.k[0].size() * 4, "KV cache", g);
}

// Three prompts, 12 new tokens, a stop id taken from the engine's own free-running stream; the
// first sequence greedy, the others sampled (docs/SPEC.md §15).
void generate_case(const Model& M, const det_mk_geometry& g) {
  const int64_t V = M.m.vocab, max_new = 12, B = 3;
  const det_sample_params sample[3] = {{0.0f, 0, 1.0f, 0.0f, 0}, {0.9f, 0, 1.0f, 0.0f, 11}, {1.1f, 30, 0.8f, 0.01f, 12}};
  std::vector<int32_t> prompts;
  std::vector<int64_t> offsets = {0}, starts(B, 0);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < 5 + 7 * b; ++i) prompts.push_back((int32_t)(next_u32() % V));
    offsets.push_back((int64_t)prompts.size());
  }
  auto engine = [&](const int32_t* stops, int64_t n_stop, std::vector<int32_t>& out, std::vector<int64_t>& len,
                    std::vector<float>& lg) {
    Caches c(M.m, B, 64);
    std::vector<det_kv_cache*> ptrs;
    for (auto& v : c.views) ptrs.push_back(&v);
    out.assign(B * max_new, -1), len.assign(B, 0), lg.assign(B * max_new * V, 0.0f);
    det_llama_generate(&M.m, B, prompts.data(), offsets.data(), starts.data(), ptrs.data(), max_new, stops, n_stop,
                       sample, out.data(), len.data(), lg.data());
  };
  std::vector<int32_t> free_tok, want_tok;
  std::vector<int64_t> free_len, want_len;
  std::vector<float> free_lg, want_lg;
  engine(nullptr, 0, free_tok, free_len, free_lg);
  const int32_t stop = free_tok[1 * max_new + 4];
  engine(&stop, 1, want_tok, want_len, want_lg);

  std::vector<int32_t> tok, seq;
  std::vector<int64_t> pos;
  std::vector<uint8_t> want;
  for (int b = 0; b < B; ++b)
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i)
      tok.push_back(prompts[i]), seq.push_back(b), pos.push_back(i - offsets[b]), want.push_back(i == offsets[b + 1] - 1);
  // With the step logits returned, and without (the kernel then keeps them in its workspace).
  for (bool with_logits : {true, false}) {
    std::vector<int32_t> out(B * max_new, -1);
    std::vector<int64_t> len(B, 0);
    std::vector<float> lg(B * max_new * V, 0.0f);
    std::vector<unsigned char> ws;
    Caches fresh(M.m, B, 64);
    std::vector<det_mk_seq> fresh_seqs;
    for (auto& v : fresh.views) fresh_seqs.push_back({v.k, v.v, v.capacity});
    det_mk_params p = params(M, ws, g);
    p.prog.n_rows = (int64_t)tok.size();
    p.prog.tokens = tok.data(), p.prog.positions = pos.data(), p.prog.seq = seq.data(), p.prog.want = want.data();
    p.prog.n_seq = B, p.prog.seqs = fresh_seqs.data(), p.prog.max_new = max_new, p.prog.stop_ids = &stop;
    p.prog.n_stop = 1, p.prog.sample = sample, p.prog.out_tokens = out.data(), p.prog.out_lengths = len.data();
    p.prog.step_logits = with_logits ? lg.data() : nullptr;
    if (det_mk_run_emulated(&p) != DET_MK_OK) printf("emulation failed\n"), ++failures;
    expect_equal(want_len.data(), len.data(), B * 8, "generation lengths", g);
    for (int b = 0; b < B; ++b) {
      expect_equal(&want_tok[b * max_new], &out[b * max_new], want_len[b] * 4, "generated tokens", g);
      if (with_logits)
        expect_equal(&want_lg[b * max_new * V], &lg[b * max_new * V], want_len[b] * V * 4, "step logits", g);
    }
  }
}

}  // namespace

int main() {
  const det_mk_geometry geometries[] = {{1, 1, 2, 1, 0}, {2, 2, 4, 4, 3}, {3, 1, 2, 16, 7}, {5, 2, 4, 2, 9}};
  for (int variant = 0; variant < 5; ++variant) {
    const bool gemma = variant == 4;
    Model M(variant % 2 == 1 || gemma, variant % 2 == 1 || gemma ? 40 : 0, variant == 2 ? 4 : variant == 3 ? 3 : 0,
            gemma);
    for (const det_mk_geometry& g : geometries) {
      forward_case(M, g);
      generate_case(M, g);
    }
  }
  const Gemma4Model G;
  for (const det_mk_geometry& g : {geometries[1], geometries[2]}) {
    forward_case(G, g);
    generate_case(G, g);
  }
  printf("%s %d\n", failures ? "FAILED" : "ok", cases);
  return failures ? 1 : 0;
}
