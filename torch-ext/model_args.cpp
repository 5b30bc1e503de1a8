// model_args.cpp: see model_args.h.
#include "model_args.h"


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
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kFloat32, "det-infer: ", what,
                   " must be float32 (norm multipliers, biases and scalars are), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device && t.is_contiguous() && t.dim() == 1 && t.size(0) == n, "det-infer: ",
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

NativeModel::NativeModel(std::vector<std::string> names, std::vector<torch::Tensor> w, std::vector<torch::Tensor> sc,
                         std::vector<int64_t> cfg, double eps, torch::Tensor freq)
    : weights(std::move(w)), scales(std::move(sc)), inv_freq(std::move(freq)),
      device(weights.empty() ? torch::Device(torch::kCPU) : weights[0].device()) {
  TORCH_CHECK_VALUE(!weights.empty() && names.size() == weights.size(), "det-infer: got ", names.size(), " names for ",
                    weights.size(), " weight tensors (expected one name per tensor, at least one)");
  TORCH_CHECK_VALUE(det_cfg_well_formed(cfg.data(), cfg.size()), "det-infer: cfg has ", cfg.size(),
                    " fields or a negative one; expected ", CFG_COUNT, " + ", CFG_PER_TABLE,
                    " per rope table (1 or 2) + ", CFG_PER_LAYER, " per layer, none negative");
  TORCH_CHECK_VALUE(scales.empty() || scales.size() == weights.size(), "det-infer: got ", scales.size(),
                    " scale tensors for ", weights.size(), " weights (expected none or one per weight)");
  for (size_t i = 0; i < scales.size(); ++i)
    TORCH_CHECK_VALUE(scales[i].numel() == 0 || weights[i].scalar_type() == torch::kUInt8, "det-infer: weight ",
                      names[i], " has a scale tensor but is not uint8 nf4 codes");
  // Each weight by name, checked (type, shape, device) as the config asks for it.
  struct Taker {
    const NativeModel& nm;
    const std::vector<std::string>& names;
    std::map<std::string, size_t> index;
    std::vector<bool> used;
    size_t find(const std::string& name) {
      auto it = index.find(name);
      TORCH_CHECK_VALUE(it != index.end(), "det-infer: the config needs tensor ", name, ", which was not given");
      used[it->second] = true;
      return it->second;
    }
    const uint16_t* bf16(int64_t rows, int64_t cols, const std::string& name) {
      return bf16_ptr(nm.weights[find(name)], {rows, cols}, name, nm.device);
    }
    det_matrix matrix(int64_t rows, int64_t cols, const std::string& name) {
      const size_t k = find(name);
      return matrix_view(nm.weights[k], nm.scales.empty() ? torch::Tensor() : nm.scales[k], rows, cols, name,
                         nm.device);
    }
    const float* norm(int64_t n, const std::string& name) { return f32_ptr(nm.weights[find(name)], n, name, nm.device); }
  } take{*this, names, {}, std::vector<bool>(names.size(), false)};
  for (size_t i = 0; i < names.size(); ++i)
    TORCH_CHECK_VALUE(take.index.emplace(names[i], i).second, "det-infer: tensor ", names[i], " is given twice");
  det_llama_model& m = model;
  det_model_from_cfg(cfg.data(), m, storage, take);
  for (size_t i = 0; i < names.size(); ++i)
    TORCH_CHECK_VALUE(take.used[i], "det-infer: tensor ", names[i], " is not used by this config");
  m.rms_eps = (float)eps;
  TORCH_CHECK_TYPE(inv_freq.scalar_type() == torch::kFloat64 && inv_freq.is_contiguous() &&
                       inv_freq.numel() == m.rope_pairs && inv_freq.device() == device,
                   "det-infer: inv_freq must be contiguous float64 with ", m.rope_pairs, " entries on ", device);
  m.inv_freq = inv_freq.data_ptr<double>();
  TORCH_CHECK_VALUE(m.hidden > 0 && m.n_layers > 0 && m.n_heads > 0 && m.n_kv_heads > 0 && m.vocab > 0 &&
                        m.n_heads % m.n_kv_heads == 0 && det_llama_model_valid(&m),
                    "det-infer: inconsistent model config (shapes, switches, rope tables, or a layer's head size, "
                    "MLP width or K/V source)");
  if (device.is_cuda()) {
    auto upload = [&](void* p, size_t bytes) {
      return torch::from_blob(p, {(int64_t)bytes}, torch::kUInt8).to(device);
    };
    device_layers = upload(storage.layers.data(), storage.layers.size() * sizeof(det_llama_layer));
    device_steps = upload(storage.steps.data(), storage.steps.size() * sizeof(det_step));
  }
}

std::vector<det_kv_cache> cache_views(const det_llama_model& m, const std::vector<torch::Tensor>& caches,
                                      const torch::Device& device) {
  std::vector<det_kv_cache> out;
  for (size_t i = 0; i < caches.size(); ++i) {
    const torch::Tensor& c = caches[i];
    TORCH_CHECK_TYPE(c.scalar_type() == torch::kFloat32, "det-infer: KV cache ", i, " must be float32");
    TORCH_CHECK_VALUE(c.device() == device && c.is_contiguous() && c.dim() == 3 && c.size(0) == 2 &&
                          c.size(2) == m.kv_row,
                      "det-infer: KV cache ", i, " must be a contiguous (2, capacity, ", m.kv_row,
                      ") float32 tensor on ", device, ", got ", c.sizes(), " on ", c.device());
    float* base = c.data_ptr<float>();
    out.push_back({base, base + c.numel() / 2, c.size(1)});
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

namespace {

void check_output(const torch::Tensor& t, at::ScalarType type, int64_t numel, const torch::Device& dev, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == type && t.is_contiguous() && t.numel() == numel && t.device() == dev,
                    "det-infer: ", what, " must be a contiguous ", type, " tensor of ", numel, " elements on ", dev);
}

}  // namespace

det_program_rows forward_rows(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& cache_index, const torch::Tensor& want, int64_t n_seq,
                              const torch::Tensor& logits, int64_t vocab, const torch::Device& device) {
  const int64_t n = tokens.numel();
  TORCH_CHECK_VALUE(positions.numel() == n && cache_index.numel() == n && want.numel() == n,
                    "det-infer: tokens, positions, cache_index and want must have one entry per row");
  const int32_t* tok = host_ints<int32_t>(tokens, torch::kInt32, "tokens");
  const int64_t* pos = host_ints<int64_t>(positions, torch::kInt64, "positions");
  const int64_t* idx = host_ints<int64_t>(cache_index, torch::kInt64, "cache_index");
  const uint8_t* wl = host_ints<uint8_t>(want, torch::kUInt8, "want");
  det_program_rows rows;
  int64_t n_want = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(idx[i] >= 0 && idx[i] < n_seq, "det-infer: cache_index out of range");
    rows.add(tok[i], pos[i], (int32_t)idx[i], wl[i] != 0);
    n_want += wl[i] != 0;
  }
  check_output(logits, torch::kFloat32, n_want * vocab, device, "logits");
  return rows;
}

void check_generate_args(const torch::Tensor& prompts, const torch::Tensor& prompt_offsets,
                         const torch::Tensor& start_positions, int64_t n_seq, int64_t max_new,
                         const torch::Tensor& out_tokens, const torch::Tensor& out_lengths,
                         const torch::Tensor& step_logits, int64_t vocab, const torch::Device& device) {
  const int64_t B = n_seq;
  TORCH_CHECK_VALUE(B >= 1 && prompt_offsets.numel() == B + 1 && start_positions.numel() == B,
                    "det-infer: one cache, one start position and one prompt per sequence");
  TORCH_CHECK_VALUE(max_new >= 1, "det-infer: max_new must be at least 1");
  host_ints<int32_t>(prompts, torch::kInt32, "prompts");
  host_ints<int64_t>(start_positions, torch::kInt64, "start_positions");
  const int64_t* off = host_ints<int64_t>(prompt_offsets, torch::kInt64, "prompt_offsets");
  TORCH_CHECK_VALUE(off[0] == 0 && off[B] == prompts.numel(), "det-infer: prompt_offsets do not cover prompts");
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK_VALUE(off[b + 1] > off[b], "det-infer: prompt ", b, " is empty");
  check_output(out_tokens, torch::kInt32, B * max_new, device, "out_tokens");
  check_output(out_lengths, torch::kInt64, B, device, "out_lengths");
  if (step_logits.numel() > 0) check_output(step_logits, torch::kFloat32, B * max_new * vocab, device, "step_logits");
}
