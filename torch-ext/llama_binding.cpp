// llama_binding.cpp: the mak_* ops of the llama-family engine. Each call receives the model as a
// tensor list in the canonical order (torch-ext/det_infer/names.py, LLAMA_LAYER_TENSORS), checks
// every tensor against the config, and hands raw pointers to the torch-free engine.
#include <torch/library.h>

#include <string>
#include <vector>

#include "../det_infer_cpu/det_llama_cpu.h"
#include "torch_binding.h"

namespace {

// cfg: the integer config, in this order (torch-ext/det_infer/config.py, LLAMA_CFG_FIELDS).
enum {
  CFG_HIDDEN, CFG_LAYERS, CFG_HEADS, CFG_KV_HEADS, CFG_HEAD_DIM, CFG_INTER, CFG_VOCAB,
  CFG_ROPE_PAIRS, CFG_SLIDING_WINDOW, CFG_QK_NORM, CFG_TIED, CFG_COUNT
};

struct Assembled {
  det_llama_model model;
  std::vector<det_llama_layer> layers;
};

const uint16_t* bf16_ptr(const torch::Tensor& t, std::vector<int64_t> shape, const std::string& what) {
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kBFloat16, "det-infer: ", what, " must be bfloat16, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.is_cpu() && t.is_contiguous(), "det-infer: ", what, " must be a contiguous CPU tensor");
  TORCH_CHECK_VALUE(t.sizes() == c10::IntArrayRef(shape), "det-infer: ", what, " has shape ", t.sizes(),
                    ", expected ", c10::IntArrayRef(shape));
  return reinterpret_cast<const uint16_t*>(t.data_ptr());
}

Assembled assemble(const std::vector<torch::Tensor>& w, c10::IntArrayRef cfg, double eps,
                   const torch::Tensor& inv_freq) {
  TORCH_CHECK_VALUE(cfg.size() == CFG_COUNT, "det-infer: cfg has ", cfg.size(), " fields, expected ", CFG_COUNT);
  for (int i = 0; i < CFG_COUNT; ++i)
    TORCH_CHECK_VALUE(cfg[i] >= 0, "det-infer: cfg field ", i, " is negative");
  Assembled a{};
  det_llama_model& m = a.model;
  m.hidden = cfg[CFG_HIDDEN]; m.n_layers = cfg[CFG_LAYERS]; m.n_heads = cfg[CFG_HEADS];
  m.n_kv_heads = cfg[CFG_KV_HEADS]; m.head_dim = cfg[CFG_HEAD_DIM]; m.inter = cfg[CFG_INTER];
  m.vocab = cfg[CFG_VOCAB]; m.rope_pairs = cfg[CFG_ROPE_PAIRS]; m.sliding_window = cfg[CFG_SLIDING_WINDOW];
  m.rms_eps = (float)eps;
  TORCH_CHECK_VALUE(m.hidden > 0 && m.n_layers > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0 &&
                        m.inter > 0 && m.vocab > 0 && m.n_heads % m.n_kv_heads == 0 &&
                        2 * m.rope_pairs <= m.head_dim,
                    "det-infer: inconsistent model config");
  const bool qk = cfg[CFG_QK_NORM] != 0, tied = cfg[CFG_TIED] != 0;
  const size_t per_layer = qk ? 11 : 9, head = tied ? 2 : 3;
  TORCH_CHECK_VALUE(w.size() == head + per_layer * m.n_layers, "det-infer: got ", w.size(),
                    " weight tensors, expected ", head + per_layer * m.n_layers);
  TORCH_CHECK_TYPE(inv_freq.scalar_type() == torch::kFloat64 && inv_freq.is_contiguous() &&
                       inv_freq.numel() == m.rope_pairs,
                   "det-infer: inv_freq must be contiguous float64 with ", m.rope_pairs, " entries");
  m.inv_freq = inv_freq.data_ptr<double>();
  const int64_t H = m.hidden, D = m.head_dim, QD = m.n_heads * D, KVD = m.n_kv_heads * D, I = m.inter;
  m.embed = bf16_ptr(w[0], {m.vocab, H}, "embed_tokens");
  m.final_norm = bf16_ptr(w[1], {H}, "norm");
  m.lm_head = tied ? m.embed : bf16_ptr(w[2], {m.vocab, H}, "lm_head");
  a.layers.resize(m.n_layers);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    size_t i = head + l * per_layer;
    std::string p = "layers." + std::to_string(l) + ".";
    det_llama_layer& L = a.layers[l];
    L.attn_norm = bf16_ptr(w[i++], {H}, p + "input_layernorm");
    L.wq = bf16_ptr(w[i++], {QD, H}, p + "q_proj");
    L.wk = bf16_ptr(w[i++], {KVD, H}, p + "k_proj");
    L.wv = bf16_ptr(w[i++], {KVD, H}, p + "v_proj");
    L.wo = bf16_ptr(w[i++], {H, QD}, p + "o_proj");
    L.q_norm = qk ? bf16_ptr(w[i++], {D}, p + "q_norm") : nullptr;
    L.k_norm = qk ? bf16_ptr(w[i++], {D}, p + "k_norm") : nullptr;
    L.mlp_norm = bf16_ptr(w[i++], {H}, p + "post_attention_layernorm");
    L.w_gate = bf16_ptr(w[i++], {I, H}, p + "gate_proj");
    L.w_up = bf16_ptr(w[i++], {I, H}, p + "up_proj");
    L.w_down = bf16_ptr(w[i++], {H, I}, p + "down_proj");
  }
  m.layers = a.layers.data();
  return a;
}

std::vector<det_kv_cache> cache_views(const det_llama_model& m, const std::vector<torch::Tensor>& caches) {
  std::vector<det_kv_cache> out;
  const int64_t KVD = m.n_kv_heads * m.head_dim;
  for (size_t i = 0; i < caches.size(); ++i) {
    const torch::Tensor& c = caches[i];
    TORCH_CHECK_TYPE(c.scalar_type() == torch::kFloat32, "det-infer: KV cache ", i, " must be float32");
    TORCH_CHECK_VALUE(c.is_cpu() && c.is_contiguous() && c.dim() == 4 && c.size(0) == 2 &&
                          c.size(1) == m.n_layers && c.size(3) == KVD,
                      "det-infer: KV cache ", i, " must be a contiguous (2, ", m.n_layers, ", capacity, ",
                      KVD, ") float32 CPU tensor, got ", c.sizes());
    float* base = c.data_ptr<float>();
    out.push_back({base, base + c.numel() / 2, c.size(2)});
  }
  return out;
}

void check_rc(int rc) {
  TORCH_CHECK_VALUE(rc != DET_ERR_TOKEN, "det-infer: a token id is outside the vocabulary");
  TORCH_CHECK_VALUE(rc != DET_ERR_POSITION, "det-infer: a position is outside the KV cache capacity or the 1M bound");
  TORCH_CHECK_VALUE(rc != DET_ERR_ORDER, "det-infer: rows of one sequence must come in increasing position order");
  TORCH_CHECK_VALUE(rc == DET_OK, "det-infer: invalid arguments to the engine (code ", rc, ")");
}

template <typename T>
const T* int_ptr(const torch::Tensor& t, at::ScalarType type, const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == type, "det-infer: ", what, " must be ", type, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_cpu() && t.is_contiguous() && t.dim() == 1, "det-infer: ", what,
                    " must be a contiguous 1-d CPU tensor");
  return t.data_ptr<T>();
}

}  // namespace

void mak_forward(const std::vector<torch::Tensor>& weights, c10::IntArrayRef cfg, double eps,
                 const torch::Tensor& inv_freq, const torch::Tensor& tokens, const torch::Tensor& positions,
                 const std::vector<torch::Tensor>& caches, const torch::Tensor& cache_index,
                 const torch::Tensor& want, torch::Tensor& logits) {
  Assembled a = assemble(weights, cfg, eps, inv_freq);
  std::vector<det_kv_cache> views = cache_views(a.model, caches);
  const int64_t n = tokens.numel();
  const int32_t* tok = int_ptr<int32_t>(tokens, torch::kInt32, "tokens");
  const int64_t* pos = int_ptr<int64_t>(positions, torch::kInt64, "positions");
  const int64_t* idx = int_ptr<int64_t>(cache_index, torch::kInt64, "cache_index");
  const uint8_t* wl = int_ptr<uint8_t>(want, torch::kUInt8, "want");
  TORCH_CHECK_VALUE(positions.numel() == n && cache_index.numel() == n && want.numel() == n,
                    "det-infer: tokens, positions, cache_index and want must have one entry per row");
  std::vector<det_kv_cache*> row_cache(n);
  int64_t n_want = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(idx[i] >= 0 && idx[i] < (int64_t)views.size(), "det-infer: cache_index out of range");
    row_cache[i] = &views[idx[i]];
    n_want += wl[i] != 0;
  }
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_contiguous() &&
                        logits.numel() == n_want * a.model.vocab,
                    "det-infer: logits must be contiguous float32 with ", n_want, " x ", a.model.vocab, " entries");
  check_rc(det_llama_forward(&a.model, n, tok, pos, row_cache.data(), wl, logits.data_ptr<float>()));
}

void mak_generate(const std::vector<torch::Tensor>& weights, c10::IntArrayRef cfg, double eps,
                  const torch::Tensor& inv_freq, const torch::Tensor& prompts,
                  const torch::Tensor& prompt_offsets, const torch::Tensor& start_positions,
                  const std::vector<torch::Tensor>& caches, int64_t max_new, const torch::Tensor& stop_ids,
                  torch::Tensor& out_tokens, torch::Tensor& out_lengths, torch::Tensor& step_logits) {
  Assembled a = assemble(weights, cfg, eps, inv_freq);
  std::vector<det_kv_cache> views = cache_views(a.model, caches);
  const int64_t B = (int64_t)views.size();
  TORCH_CHECK_VALUE(B >= 1 && prompt_offsets.numel() == B + 1 && start_positions.numel() == B,
                    "det-infer: one cache, one start position and one prompt per sequence");
  TORCH_CHECK_VALUE(max_new >= 1, "det-infer: max_new must be at least 1");
  const int64_t* off = int_ptr<int64_t>(prompt_offsets, torch::kInt64, "prompt_offsets");
  TORCH_CHECK_VALUE(off[0] == 0 && off[B] == prompts.numel(), "det-infer: prompt_offsets do not cover prompts");
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK_VALUE(off[b + 1] > off[b], "det-infer: prompt ", b, " is empty");
  TORCH_CHECK_VALUE(out_tokens.scalar_type() == torch::kInt32 && out_tokens.is_contiguous() &&
                        out_tokens.numel() == B * max_new,
                    "det-infer: out_tokens must be contiguous int32 (B, max_new)");
  TORCH_CHECK_VALUE(out_lengths.scalar_type() == torch::kInt64 && out_lengths.numel() == B,
                    "det-infer: out_lengths must be int64 (B,)");
  float* sl = nullptr;
  if (step_logits.numel() > 0) {
    TORCH_CHECK_VALUE(step_logits.scalar_type() == torch::kFloat32 && step_logits.is_contiguous() &&
                          step_logits.numel() == B * max_new * a.model.vocab,
                      "det-infer: step_logits must be empty or contiguous float32 (B, max_new, vocab)");
    sl = step_logits.data_ptr<float>();
  }
  std::vector<det_kv_cache*> ptrs;
  for (auto& v : views) ptrs.push_back(&v);
  check_rc(det_llama_generate(&a.model, B, int_ptr<int32_t>(prompts, torch::kInt32, "prompts"), off,
                              int_ptr<int64_t>(start_positions, torch::kInt64, "start_positions"),
                              ptrs.data(), max_new, int_ptr<int32_t>(stop_ids, torch::kInt32, "stop_ids"),
                              stop_ids.numel(), out_tokens.data_ptr<int32_t>(),
                              out_lengths.data_ptr<int64_t>(), sl));
}

void register_llama_ops(torch::Library& ops) {
  // Forward pass of rows (token, position, cache) through a llama-family model; logits of the wanted rows.
  ops.def("mak_forward(Tensor[] weights, int[] cfg, float eps, Tensor inv_freq, Tensor tokens, Tensor positions, "
          "Tensor(a!)[] caches, Tensor cache_index, Tensor want, Tensor! logits) -> ()");
  ops.impl("mak_forward", torch::kCPU, &mak_forward);
  // A whole greedy generation for B sequences (prefill + every decode step) in one native call.
  ops.def("mak_generate(Tensor[] weights, int[] cfg, float eps, Tensor inv_freq, Tensor prompts, "
          "Tensor prompt_offsets, Tensor start_positions, Tensor(a!)[] caches, int max_new, Tensor stop_ids, "
          "Tensor! out_tokens, Tensor! out_lengths, Tensor! step_logits) -> ()");
  ops.impl("mak_generate", torch::kCPU, &mak_generate);
}
