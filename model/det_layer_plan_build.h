// det_layer_plan_build.h: the one builder of a model's layer plan (det_layer_plan.h), from the
// model struct; host code. Adding an architecture feature means adding its steps (or operands)
// here and, if it brings new arithmetic, a contract header and a case in each executor.
#pragma once

#include <vector>

#include "det_llama_model.h"

// Host storage of a model struct's arrays (m.layers, m.steps point into it).
struct det_model_storage {
  std::vector<det_llama_layer> layers;
  std::vector<det_step> steps;
};

// Fills steps with m's plan and points m.steps at it. Per layer: QKV, ROPE, ATTEND, RESIDUAL
// (Wo), MLP, RESIDUAL (Wdown), and with per-layer inputs PLE_GATE, RESIDUAL (the branch's
// projection); the layer scalar rides on the layer's last RESIDUAL. Around them EMBED (and
// PLE_PROJECT, PLE_FINISH) first and HEAD last.
inline void det_layer_plan_build(det_llama_model& m, std::vector<det_step>& steps) {
  steps.clear();
  auto add = [&](int kind, int64_t layer, int64_t n, int64_t k) -> det_step& {
    det_step s{};
    s.kind = kind, s.layer = (int32_t)layer, s.n = n, s.k = k;
    steps.push_back(s);
    return steps.back();
  };
  auto residual = [&](int64_t l, const det_matrix& w, int input, int64_t k, const float* norm,
                      const float* bias = nullptr) {
    det_step& s = add(DET_STEP_RESIDUAL, l, m.hidden, k);
    s.w = w, s.input = input, s.norm = norm, s.bias = bias;
  };
  const int64_t H = m.hidden, P = m.ple_dim;
  add(DET_STEP_EMBED, -1, 0, 0);
  if (P > 0) {
    add(DET_STEP_PLE_PROJECT, -1, m.n_layers * P, H).reads_embedding = 1;
    add(DET_STEP_PLE_FINISH, -1, 0, 0);
  }
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const det_llama_layer& L = m.layers[l];
    const int64_t QD = m.n_heads * L.head_dim, KVD = m.n_kv_heads * L.head_dim;
    add(DET_STEP_QKV, l, L.kv_source == l ? QD + 2 * KVD : QD, H).reads_embedding = l == 0 && P == 0;
    add(DET_STEP_ROPE, l, 0, 0);
    add(DET_STEP_ATTEND, l, 0, 0);
    residual(l, L.wo, DET_IN_ATT, QD, L.attn_out_norm, L.bo);
    add(DET_STEP_MLP, l, L.inter, H);
    residual(l, L.w_down, DET_IN_ACT, L.inter, L.mlp_out_norm);
    if (P > 0) {
      add(DET_STEP_PLE_GATE, l, P, H);
      residual(l, L.ple_proj, DET_IN_ACT, P, L.ple_out_norm);
    }
    steps.back().scalar = L.scalar;
  }
  add(DET_STEP_HEAD, -1, m.vocab, H);
  m.steps = steps.data();
  m.n_steps = (int64_t)steps.size();
}
