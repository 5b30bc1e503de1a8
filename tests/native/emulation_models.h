// emulation_models.h: the small models of the native emulation harnesses (emulation_harness.cpp,
// emulation_modes.cpp): llama-family layouts with seeded bf16 weights (with and without qk-norm,
// with a sliding window; projections dense or nf4-packed in exactly sized buffers, blocks of 16 and
// of 8; Gemma-3's switches) and a Gemma-4 layout (per-layer head sizes up to 264, KV sharing,
// per-layer inputs, attention biases), plus per-sequence KV caches.
#pragma once

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "det_infer_cpu/det_llama_cpu.h"
#include "megakernel/det_megakernel.h"
#include "model/det_layer_plan_build.h"

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
  std::vector<det_step> steps;
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
  // A bias: bf16 values in [-scale, scale) widened (docs/SPEC.md §13.3 b).
  const float* bias(size_t n, float scale) {
    const uint16_t* w = tensor(n, scale);
    norms.emplace_back(n);
    for (size_t i = 0; i < n; ++i) norms.back()[i] = det_bf16_to_f32(w[i]);
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
    det_layer_plan_build(m, steps);
  }
};

// Gemma-4's switches at a small size (docs/SPEC.md §13.7): layer 0 sliding (head 16, rope table
// 1), layer 1 full (head 264: its q takes a second, partial slice per lane; proportional rope, 33
// pairs (x_i, x_{i+132})), layer 2 sliding reading layer 0's K/V with a double-wide MLP; per-layer
// inputs of 16, layer scalars, softcap 30; attention biases on q, k, v and o.
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
      L.bq = bias(QD, 0.25f), L.bo = bias(H, 0.25f);  // attention_bias: every bias the layer has
      if (src[l] == l) L.bk = bias(KVD, 0.5f), L.bv = bias(KVD, 0.25f);
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
    det_layer_plan_build(m, steps);
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

}  // namespace
