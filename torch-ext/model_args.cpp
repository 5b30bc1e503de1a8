// model_args.cpp: see model_args.h.
#include "model_args.h"

#include <cmath>
#include <map>
#include <mutex>

namespace {

const uint16_t* bf16_ptr(const torch::Tensor& t, std::vector<int64_t> shape, const std::string& what,
                         const torch::Device& device) {
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kBFloat16, "det-infer: ", what, " must be bfloat16, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device && t.is_contiguous(), "det-infer: ", what, " must be a contiguous tensor on ",
                    device, ", got one on ", t.device());
  TORCH_CHECK_VALUE(t.sizes() == c10::IntArrayRef(shape), "det-infer: ", what, " has shape ", t.sizes(),
                    ", expected ", c10::IntArrayRef(shape));
  return reinterpret_cast<const uint16_t*>(t.data_ptr());
}

const float* f32_ptr(const torch::Tensor& t, int64_t n, const std::string& what, const torch::Device& device) {
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kFloat32, "det-infer: norm ", what, " must be float32 multipliers, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device && t.is_contiguous() && t.dim() == 1 && t.size(0) == n, "det-infer: norm ",
                    what, " must be a contiguous (", n, ",) tensor on ", device, ", got ", t.sizes(), " on ", t.device());
  return t.data_ptr<float>();
}

// The codebook on `device`, made once per device (the matrices point into it).
const float* nf4_code(const torch::Device& device) {
  static std::mutex mu;
  static std::map<std::string, torch::Tensor> tables;
  std::lock_guard<std::mutex> lock(mu);
  torch::Tensor& t = tables[device.str()];
  if (!t.defined()) t = nf4_codebook().to(device);
  return t.data_ptr<float>();
}

}  // namespace

torch::Tensor nf4_codebook() {
  static const uint32_t bits[16] = DET_NF4_CODE_BITS;
  torch::Tensor t = torch::empty({16}, torch::kInt32);
  memcpy(t.data_ptr(), bits, sizeof bits);
  return t.view(torch::kFloat32);
}

det_matrix matrix_view(const torch::Tensor& w, const torch::Tensor& absmax, int64_t rows, int64_t cols,
                       const std::string& what, const torch::Device& device) {
  det_matrix m{};
  if (!absmax.defined() || absmax.numel() == 0) {
    m.bf16 = bf16_ptr(w, {rows, cols}, what, device);
    return m;
  }
  const int64_t n = rows * cols;
  TORCH_CHECK_TYPE(w.scalar_type() == torch::kUInt8 && absmax.scalar_type() == torch::kFloat32,
                   "det-infer: nf4 ", what, " must be uint8 codes with float32 absmax, got ", w.scalar_type(),
                   " and ", absmax.scalar_type());
  TORCH_CHECK_VALUE(w.device() == device && absmax.device() == device && w.is_contiguous() && absmax.is_contiguous(),
                    "det-infer: nf4 ", what, " and its absmax must be contiguous tensors on ", device);
  TORCH_CHECK_VALUE(cols % 2 == 0 && w.numel() == n / 2 && absmax.dim() == 1,
                    "det-infer: nf4 ", what, " of shape (", rows, ", ", cols, ") needs an even row length and ",
                    n / 2, " code bytes, got ", w.numel());
  // The block length is the power of two 2^s >= 8 with ceil(n / 2^s) == absmax.numel() (unique
  // when there are two or more blocks; with one block any 2^s >= n reads the same absmax).
  int64_t shift = DET_NF4_MIN_BLOCK_SHIFT;
  while (shift < DET_NF4_MAX_BLOCK_SHIFT && ((n - 1) >> shift) + 1 > absmax.numel()) ++shift;
  TORCH_CHECK_VALUE(((n - 1) >> shift) + 1 == absmax.numel(), "det-infer: nf4 ", what, " has ", absmax.numel(),
                    " absmax values for ", n, " elements; blocks must be powers of two from ",
                    1 << DET_NF4_MIN_BLOCK_SHIFT, " to ", 1 << DET_NF4_MAX_BLOCK_SHIFT, " elements");
  m.nf4 = w.data_ptr<uint8_t>();
  m.absmax = absmax.data_ptr<float>();
  m.code = nf4_code(device);
  m.block_shift = shift;
  return m;
}

Assembled assemble(const std::vector<torch::Tensor>& w, const std::vector<torch::Tensor>& scales,
                   c10::IntArrayRef cfg, double eps, const torch::Tensor& inv_freq, const torch::Device& device) {
  TORCH_CHECK_VALUE(cfg.size() >= CFG_COUNT && cfg[CFG_LAYERS] >= 0 &&
                        (int64_t)cfg.size() == CFG_COUNT + 2 * cfg[CFG_LAYERS],
                    "det-infer: cfg has ", cfg.size(), " fields, expected ", CFG_COUNT, " + 2 per layer");
  for (size_t i = 0; i < cfg.size(); ++i)
    TORCH_CHECK_VALUE(cfg[i] >= 0, "det-infer: cfg field ", i, " is negative");
  Assembled a{};
  det_llama_model& m = a.model;
  m.hidden = cfg[CFG_HIDDEN]; m.n_layers = cfg[CFG_LAYERS]; m.n_heads = cfg[CFG_HEADS];
  m.n_kv_heads = cfg[CFG_KV_HEADS]; m.head_dim = cfg[CFG_HEAD_DIM]; m.inter = cfg[CFG_INTER];
  m.vocab = cfg[CFG_VOCAB]; m.rope_pairs = cfg[CFG_ROPE_PAIRS]; m.rope_tables = cfg[CFG_ROPE_TABLES];
  m.act = cfg[CFG_ACT]; m.attn_scale_dim = cfg[CFG_ATTN_SCALE_DIM];
  m.rms_eps = (float)eps;
  TORCH_CHECK_VALUE(m.hidden > 0 && m.n_layers > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.head_dim > 0 &&
                        m.inter > 0 && m.vocab > 0 && m.n_heads % m.n_kv_heads == 0 &&
                        2 * m.rope_pairs <= m.head_dim && m.rope_tables >= 1 &&
                        m.rope_tables <= DET_ROPE_TABLES_MAX && m.attn_scale_dim >= 1 &&
                        (m.act == DET_ACT_SILU || m.act == DET_ACT_GELU_TANH),
                    "det-infer: inconsistent model config");
  // Gemma's embedding scale: the correctly rounded fp32 square root of hidden (IEEE sqrt).
  m.embed_scale = cfg[CFG_EMBED_SCALE] ? std::sqrt((float)m.hidden) : 1.0f;
  const bool qk = cfg[CFG_QK_NORM] != 0, tied = cfg[CFG_TIED] != 0, out_norms = cfg[CFG_OUT_NORMS] != 0;
  const size_t per_layer = 9 + (qk ? 2 : 0) + (out_norms ? 2 : 0), head = tied ? 2 : 3;
  TORCH_CHECK_VALUE(w.size() == head + per_layer * m.n_layers, "det-infer: got ", w.size(),
                    " weight tensors, expected ", head + per_layer * m.n_layers);
  TORCH_CHECK_TYPE(inv_freq.scalar_type() == torch::kFloat64 && inv_freq.is_contiguous() &&
                       inv_freq.numel() == m.rope_tables * m.rope_pairs && inv_freq.device() == device,
                   "det-infer: inv_freq must be contiguous float64 with ", m.rope_tables, " x ", m.rope_pairs,
                   " entries on ", device);
  TORCH_CHECK_VALUE(scales.empty() || scales.size() == w.size(), "det-infer: got ", scales.size(),
                    " scale tensors for ", w.size(), " weights (expected none or one per weight)");
  auto matrix = [&](size_t i, int64_t rows, int64_t cols, const std::string& what) {
    return matrix_view(w[i], scales.empty() ? torch::Tensor() : scales[i], rows, cols, what, device);
  };
  for (size_t i = 0; i < scales.size(); ++i)
    TORCH_CHECK_VALUE(scales[i].numel() == 0 || w[i].scalar_type() == torch::kUInt8,
                      "det-infer: weight ", i, " has a scale tensor but is not uint8 nf4 codes");
  m.inv_freq = inv_freq.data_ptr<double>();
  const int64_t H = m.hidden, D = m.head_dim, QD = m.n_heads * D, KVD = m.n_kv_heads * D, I = m.inter;
  m.embed = bf16_ptr(w[0], {m.vocab, H}, "embed_tokens", device);
  m.final_norm = f32_ptr(w[1], H, "norm", device);
  m.lm_head = tied ? m.embed : bf16_ptr(w[2], {m.vocab, H}, "lm_head", device);
  a.layers.resize(m.n_layers);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    size_t i = head + l * per_layer;
    std::string p = "layers." + std::to_string(l) + ".";
    det_llama_layer& L = a.layers[l];
    L.attn_norm = f32_ptr(w[i++], H, p + "input_layernorm", device);
    L.wq = matrix(i, QD, H, p + "q_proj"), ++i;
    L.wk = matrix(i, KVD, H, p + "k_proj"), ++i;
    L.wv = matrix(i, KVD, H, p + "v_proj"), ++i;
    L.wo = matrix(i, H, QD, p + "o_proj"), ++i;
    L.q_norm = qk ? f32_ptr(w[i++], D, p + "q_norm", device) : nullptr;
    L.k_norm = qk ? f32_ptr(w[i++], D, p + "k_norm", device) : nullptr;
    L.attn_out_norm = out_norms ? f32_ptr(w[i++], H, p + "attention output norm", device) : nullptr;
    L.mlp_norm = f32_ptr(w[i++], H, p + "MLP input norm", device);
    L.w_gate = matrix(i, I, H, p + "gate_proj"), ++i;
    L.w_up = matrix(i, I, H, p + "up_proj"), ++i;
    L.w_down = matrix(i, H, I, p + "down_proj"), ++i;
    L.mlp_out_norm = out_norms ? f32_ptr(w[i++], H, p + "MLP output norm", device) : nullptr;
    L.window = cfg[CFG_COUNT + 2 * l];
    L.rope_table = cfg[CFG_COUNT + 2 * l + 1];
    TORCH_CHECK_VALUE(L.rope_table < m.rope_tables, "det-infer: layer ", l, " uses rope table ", L.rope_table,
                      " of ", m.rope_tables);
  }
  m.layers = a.layers.data();
  return a;
}

std::vector<det_kv_cache> cache_views(const det_llama_model& m, const std::vector<torch::Tensor>& caches,
                                      const torch::Device& device) {
  std::vector<det_kv_cache> out;
  const int64_t KVD = m.n_kv_heads * m.head_dim;
  for (size_t i = 0; i < caches.size(); ++i) {
    const torch::Tensor& c = caches[i];
    TORCH_CHECK_TYPE(c.scalar_type() == torch::kFloat32, "det-infer: KV cache ", i, " must be float32");
    TORCH_CHECK_VALUE(c.device() == device && c.is_contiguous() && c.dim() == 4 && c.size(0) == 2 &&
                          c.size(1) == m.n_layers && c.size(3) == KVD,
                      "det-infer: KV cache ", i, " must be a contiguous (2, ", m.n_layers, ", capacity, ",
                      KVD, ") float32 tensor on ", device, ", got ", c.sizes(), " on ", c.device());
    float* base = c.data_ptr<float>();
    out.push_back({base, base + c.numel() / 2, c.size(2)});
  }
  return out;
}


std::vector<det_sample_params> sample_params(const torch::Tensor& f, const torch::Tensor& i, int64_t B) {
  std::vector<det_sample_params> out;
  if (f.numel() == 0 && i.numel() == 0) return out;
  TORCH_CHECK_VALUE(f.scalar_type() == torch::kFloat32 && f.is_cpu() && f.is_contiguous() && f.numel() == 3 * B,
                    "det-infer: sample_f must be a contiguous (", B, ", 3) float32 CPU tensor");
  TORCH_CHECK_VALUE(i.scalar_type() == torch::kInt64 && i.is_cpu() && i.is_contiguous() && i.numel() == 2 * B,
                    "det-infer: sample_i must be a contiguous (", B, ", 2) int64 CPU tensor");
  const float* fp = f.data_ptr<float>();
  const int64_t* ip = i.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    det_sample_params p{fp[3 * b], (int32_t)ip[2 * b], fp[3 * b + 1], fp[3 * b + 2], (uint64_t)ip[2 * b + 1]};
    TORCH_CHECK_VALUE(p.temperature >= 0.0f && p.temperature - p.temperature == 0.0f,
                      "det-infer: temperature must be finite and >= 0, got ", p.temperature);
    TORCH_CHECK_VALUE(ip[2 * b] >= 0 && ip[2 * b] <= INT32_MAX, "det-infer: top_k must be >= 0, got ", ip[2 * b]);
    TORCH_CHECK_VALUE(p.top_p > 0.0f && p.top_p <= 1.0f, "det-infer: top_p must be in (0, 1], got ", p.top_p);
    TORCH_CHECK_VALUE(p.min_p >= 0.0f && p.min_p <= 1.0f, "det-infer: min_p must be in [0, 1], got ", p.min_p);
    out.push_back(p);
  }
  return out;
}
