// model_args.h: turning the mak_* / mega_* op arguments (a weight list in the canonical order of
// torch-ext/det_infer/names.py, the integer config, KV-cache tensors, index tensors) into the
// torch-free structs of model/det_llama_model.h, checking every tensor on the way.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "../model/det_llama_model.h"
#include "../model/det_model_cfg.h"
#include "../model/det_program.h"
#include "../contract/det_sample.h"

// The model handed to the native side once, at load (torch.classes.<ns>.Model): its tensors, kept
// alive, bound by checkpoint name (names[i] names weights[i]: names.py's names, "=..." for those
// the loader makes) and checked against the config; the model struct pointing into them; on CUDA
// the device copies of the layer table and plan the megakernel reads. inv_freq is (rope_pairs,)
// float64. Norms are float32 multipliers, everything else bf16; scales is empty (every
// projection dense) or parallel to weights: an empty tensor for a dense weight, the fp32 absmax
// for an nf4 projection (whose weight holds its uint8 codes; the block length is the power of two
// that gives absmax.numel() blocks, the last one possibly partial). All on one device.
struct NativeModel : torch::CustomClassHolder {
  NativeModel(std::vector<std::string> names, std::vector<torch::Tensor> weights, std::vector<torch::Tensor> scales,
              std::vector<int64_t> cfg, double eps, torch::Tensor inv_freq);
  std::vector<torch::Tensor> weights, scales;
  torch::Tensor inv_freq;
  torch::Device device;
  det_llama_model model{};
  det_model_storage storage;                  // model.layers and model.steps point here
  torch::Tensor device_layers, device_steps;  // CUDA: copies of storage's tables; else undefined
};
using Model = c10::intrusive_ptr<NativeModel>;

// The op schema's type of a NativeModel argument.
#define DET_MODEL_STR_(x) #x
#define DET_MODEL_STR(x) DET_MODEL_STR_(x)
#define DET_MODEL_TYPE "__torch__.torch.classes." DET_MODEL_STR(TORCH_EXTENSION_NAME) ".Model"

// The contract's nf4 codebook (contract/det_nf4.h), 16 float32 values in a new CPU tensor.
torch::Tensor nf4_codebook();

// One projection: dense bf16 (absmax undefined or empty) or nf4 codes with their absmax.
det_matrix matrix_view(const torch::Tensor& w, const torch::Tensor& absmax, int64_t rows, int64_t cols,
                       const std::string& what, const torch::Device& device);

// Views of (2, capacity, m.kv_row) float32 KV-cache tensors on `device`: K then V, each capacity *
// kv_row floats laid out by layer, KV head, then position (det_kv_head_base, model/det_llama_model.h).
std::vector<det_kv_cache> cache_views(const det_llama_model& m, const std::vector<torch::Tensor>& caches,
                                      const torch::Device& device);

// The rows of a forward call: token, position, cache index (into n_seq caches) and want per row,
// each a 1-d CPU tensor with one entry per row; the logits tensor checked against the wanted rows.
det_program_rows forward_rows(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& cache_index, const torch::Tensor& want, int64_t n_seq,
                              const torch::Tensor& logits, int64_t vocab, const torch::Device& device);

// The arguments of a generate call for n_seq sequences: prompts, offsets, start positions,
// max_new and the output tensors (out_tokens (B, max_new) int32, out_lengths (B,) int64,
// step_logits empty or (B, max_new, vocab) float32) on `device`. The rows are then
// det_program_prefill's.
void check_generate_args(const torch::Tensor& prompts, const torch::Tensor& prompt_offsets,
                         const torch::Tensor& start_positions, int64_t n_seq, int64_t max_new,
                         const torch::Tensor& out_tokens, const torch::Tensor& out_lengths,
                         const torch::Tensor& step_logits, int64_t vocab, const torch::Device& device);

// A contiguous 1-d CPU tensor of the given type.
template <typename T>
const T* host_ints(const torch::Tensor& t, at::ScalarType type, const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == type, "det-infer: ", what, " must be ", type, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_cpu() && t.is_contiguous() && t.dim() == 1, "det-infer: ", what,
                    " must be a contiguous 1-d CPU tensor");
  return t.data_ptr<T>();
}

// Per-sequence sampling parameters from a (B, 3) float32 [temperature, top_p, min_p] and a (B, 2)
// int64 [top_k, seed] CPU tensor; both empty: greedy for every sequence (an empty vector).
std::vector<det_sample_params> sample_params(const torch::Tensor& f, const torch::Tensor& i, int64_t B);
