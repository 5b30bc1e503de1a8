// det_model_cfg.h: the model struct (model/det_llama_model.h) from the integer config and the
// weights, asked for by checkpoint name; shared by the torch binding (torch-ext/model_args.cpp,
// which binds each name to its tensor and checks it) and the torch-free test tools
// (tests/native/engine_digest.cpp, which reads names.py's order). Host code.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "det_layer_plan_build.h"
#include "../contract/det_rsqrt.h"

// The integer config, one table for both sides: these names are config.py's LLAMA_CFG_FIELDS,
// ROPE_TABLE_FIELDS and LAYER_FIELDS, in this order (tests/test_model_api.py reads this file and
// checks that they agree). The model fields, then per rope table its fields, then per layer its.
#define DET_CFG_FIELDS(X)                                                                                   \
  X(CFG_HIDDEN, "hidden_size") X(CFG_LAYERS, "num_hidden_layers") X(CFG_HEADS, "num_attention_heads")       \
  X(CFG_KV_HEADS, "num_key_value_heads") X(CFG_HEAD_DIM, "max_head_dim")                                    \
  X(CFG_INTER, "max_intermediate_size") X(CFG_VOCAB, "vocab_size") X(CFG_ROPE_TABLES, "rope_tables")         \
  X(CFG_QK_NORM, "qk_norm") X(CFG_TIED, "tie_word_embeddings") X(CFG_OUT_NORMS, "out_norms") X(CFG_ACT, "act") \
  X(CFG_ATTN_SCALE_DIM, "attn_scale_dim") X(CFG_EMBED_SCALE, "embed_scale") X(CFG_V_NORM, "v_norm")          \
  X(CFG_PLE_DIM, "ple_dim") X(CFG_SOFTCAP, "final_softcap") X(CFG_LAYER_SCALARS, "layer_scalars")              \
  X(CFG_QKV_BIAS, "qkv_bias") X(CFG_O_BIAS, "o_bias")
#define DET_CFG_TABLE_FIELDS(X) X(TAB_PAIRS, "pairs") X(TAB_PAIR_OFFSET, "pair_offset")
#define DET_CFG_LAYER_FIELDS(X)                                                                             \
  X(LAY_WINDOW, "window") X(LAY_ROPE_TABLE, "rope_table") X(LAY_HEAD_DIM, "head_dim")                        \
  X(LAY_INTER, "intermediate_size") X(LAY_KV_SOURCE, "kv_source")

#define DET_CFG_ENUM(e, name) e,
enum { DET_CFG_FIELDS(DET_CFG_ENUM) CFG_COUNT };
enum { DET_CFG_TABLE_FIELDS(DET_CFG_ENUM) CFG_PER_TABLE };
enum { DET_CFG_LAYER_FIELDS(DET_CFG_ENUM) CFG_PER_LAYER };
#undef DET_CFG_ENUM

// Whether cfg has the right length for its layer and table counts, every field non-negative.
inline bool det_cfg_well_formed(const int64_t* cfg, size_t n) {
  if (n < CFG_COUNT || cfg[CFG_LAYERS] < 0 || cfg[CFG_ROPE_TABLES] < 1 || cfg[CFG_ROPE_TABLES] > DET_ROPE_TABLES_MAX)
    return false;
  if ((int64_t)n != CFG_COUNT + CFG_PER_TABLE * cfg[CFG_ROPE_TABLES] + CFG_PER_LAYER * cfg[CFG_LAYERS]) return false;
  for (size_t i = 0; i < n; ++i)
    if (cfg[i] < 0) return false;
  return true;
}

// Fills m and its storage (m.layers and m.steps point into it; the layer plan is built last) from
// a well-formed cfg. The weights are asked for by their checkpoint names (names.py's; entries
// starting with "=" are made by the loader), in names.py's order, through w: w.bf16(rows, cols,
// name), w.matrix(rows, cols, name) (a projection, dense or nf4) and w.norm(n, name) (an fp32
// vector: norm multipliers, attention biases, the (1,) softcap and layer scalars); they
// return null / an unset matrix or throw when a tensor is wrong, as the caller prefers. K/V
// offsets and the cache row are derived here. m.inv_freq and m.rms_eps are the caller's.
template <class Weights>
void det_model_from_cfg(const int64_t* cfg, det_llama_model& m, det_model_storage& storage, Weights& w) {
  std::vector<det_llama_layer>& layers = storage.layers;
  m.hidden = cfg[CFG_HIDDEN], m.n_layers = cfg[CFG_LAYERS], m.n_heads = cfg[CFG_HEADS];
  m.n_kv_heads = cfg[CFG_KV_HEADS], m.head_dim = cfg[CFG_HEAD_DIM], m.inter = cfg[CFG_INTER];
  m.vocab = cfg[CFG_VOCAB], m.rope_tables = cfg[CFG_ROPE_TABLES], m.ple_dim = cfg[CFG_PLE_DIM];
  m.act = cfg[CFG_ACT], m.attn_scale_dim = cfg[CFG_ATTN_SCALE_DIM];
  // Gemma's embedding scale: the correctly rounded fp32 square root of hidden.
  m.embed_scale = cfg[CFG_EMBED_SCALE] ? det_sqrt_f32((float)m.hidden) : 1.0f;
  const int64_t* tab = cfg + CFG_COUNT;
  m.rope_pairs = 0;
  for (int64_t t = 0; t < m.rope_tables; ++t) {
    m.rope[t] = {tab[CFG_PER_TABLE * t + TAB_PAIRS], tab[CFG_PER_TABLE * t + TAB_PAIR_OFFSET], m.rope_pairs};
    m.rope_pairs += m.rope[t].pairs;
  }
  const bool qk = cfg[CFG_QK_NORM] != 0, tied = cfg[CFG_TIED] != 0, out_norms = cfg[CFG_OUT_NORMS] != 0;
  const bool v_norm = cfg[CFG_V_NORM] != 0, scalars = cfg[CFG_LAYER_SCALARS] != 0;
  const bool qkv_bias = cfg[CFG_QKV_BIAS] != 0, o_bias = cfg[CFG_O_BIAS] != 0;
  const int64_t H = m.hidden, P = m.ple_dim;
  m.embed = w.bf16(m.vocab, H, "model.embed_tokens.weight");
  m.final_norm = w.norm(H, "model.norm.weight");
  m.lm_head = tied ? m.embed : w.bf16(m.vocab, H, "lm_head.weight");
  m.softcap = cfg[CFG_SOFTCAP] ? w.norm(1, "=softcap") : nullptr;
  if (P > 0) {
    m.ple_embed = w.bf16(m.vocab, m.n_layers * P, "model.embed_tokens_per_layer.weight");
    m.ple_model_proj = w.matrix(m.n_layers * P, H, "model.per_layer_model_projection.weight");
    m.ple_proj_norm = w.norm(P, "model.per_layer_projection_norm.weight");
  }
  layers.assign(m.n_layers, det_llama_layer{});
  m.kv_row = 0;
  const int64_t* per = tab + CFG_PER_TABLE * m.rope_tables;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    det_llama_layer& L = layers[l];
    const int64_t* c = per + CFG_PER_LAYER * l;
    L.window = c[LAY_WINDOW], L.rope_table = c[LAY_ROPE_TABLE], L.head_dim = c[LAY_HEAD_DIM];
    L.inter = c[LAY_INTER], L.kv_source = c[LAY_KV_SOURCE];
    const bool own = L.kv_source == l;
    const int64_t D = L.head_dim, QD = m.n_heads * D, KVD = m.n_kv_heads * D, I = L.inter;
    L.kv_offset = own ? m.kv_row : (L.kv_source < l ? layers[L.kv_source].kv_offset : -1);
    if (own) m.kv_row += KVD;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attn_norm = w.norm(H, p + "input_layernorm.weight");
    L.wq = w.matrix(QD, H, p + "self_attn.q_proj.weight");
    if (own) L.wk = w.matrix(KVD, H, p + "self_attn.k_proj.weight"), L.wv = w.matrix(KVD, H, p + "self_attn.v_proj.weight");
    L.wo = w.matrix(H, QD, p + "self_attn.o_proj.weight");
    L.bq = qkv_bias ? w.norm(QD, p + "self_attn.q_proj.bias") : nullptr;
    L.bk = qkv_bias && own ? w.norm(KVD, p + "self_attn.k_proj.bias") : nullptr;
    L.bv = qkv_bias && own ? w.norm(KVD, p + "self_attn.v_proj.bias") : nullptr;
    L.bo = o_bias ? w.norm(H, p + "self_attn.o_proj.bias") : nullptr;
    L.q_norm = qk ? w.norm(D, p + "self_attn.q_norm.weight") : nullptr;
    L.k_norm = qk && own ? w.norm(D, p + "self_attn.k_norm.weight") : nullptr;
    L.v_norm = v_norm && own ? w.norm(D, p + "=ones:self_attn.v_norm") : nullptr;
    // Models with output norms (Gemma) name their four norms by place.
    L.attn_out_norm = out_norms ? w.norm(H, p + "post_attention_layernorm.weight") : nullptr;
    L.mlp_norm = w.norm(H, p + (out_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"));
    L.w_gate = w.matrix(I, H, p + "mlp.gate_proj.weight");
    L.w_up = w.matrix(I, H, p + "mlp.up_proj.weight");
    L.w_down = w.matrix(H, I, p + "mlp.down_proj.weight");
    L.mlp_out_norm = out_norms ? w.norm(H, p + "post_feedforward_layernorm.weight") : nullptr;
    if (P > 0) {
      L.ple_gate = w.matrix(P, H, p + "per_layer_input_gate.weight");
      L.ple_proj = w.matrix(H, P, p + "per_layer_projection.weight");
      L.ple_out_norm = w.norm(H, p + "post_per_layer_input_norm.weight");
    }
    L.scalar = scalars ? w.norm(1, p + "layer_scalar") : nullptr;
  }
  m.layers = layers.data();
  det_layer_plan_build(m, storage.steps);
}
