// llama_binding.cpp: the mak_* ops of the llama-family engine. Each call receives the model built
// once at load (NativeModel, model_args.h) and hands raw pointers to the torch-free engine.
#include <torch/library.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "../det_infer_cpu/det_fpenv.h"
#include "../det_infer_cpu/det_llama_cpu.h"
#include "../det_infer_cpu/det_logprob_cpu.h"
#include "../det_infer_cpu/det_sample_cpu.h"
#include "model_args.h"
#include "torch_binding.h"

namespace {

void check_rc(int rc) {
  TORCH_CHECK_VALUE(rc != DET_ERR_TOKEN, "det-infer: a token id is outside the vocabulary");
  TORCH_CHECK_VALUE(rc != DET_ERR_POSITION, "det-infer: a position is outside the KV cache capacity or the 1M bound");
  TORCH_CHECK_VALUE(rc != DET_ERR_ORDER, "det-infer: rows of one sequence must come in increasing position order");
  TORCH_CHECK_VALUE(rc == DET_OK, "det-infer: invalid arguments to the engine (code ", rc, ")");
}

}  // namespace

// The caches' views, as the pointer list the engine takes.
static std::vector<det_kv_cache*> cache_pointers(std::vector<det_kv_cache>& views) {
  std::vector<det_kv_cache*> out;
  for (det_kv_cache& v : views) out.push_back(&v);
  return out;
}

// The model of a CPU engine call: one on the CPU.
static const det_llama_model& cpu_model(const Model& model) {
  TORCH_CHECK_VALUE(model->device.is_cpu(), "det-infer: the CPU engine runs a model on the CPU, this one is on ",
                    model->device);
  return model->model;
}

void mak_forward(Model model, const torch::Tensor& tokens, const torch::Tensor& positions,
                 const std::vector<torch::Tensor>& caches, const torch::Tensor& cache_index,
                 const torch::Tensor& want, torch::Tensor& logits) {
  const det_llama_model& m = cpu_model(model);
  std::vector<det_kv_cache> views = cache_views(m, caches, torch::kCPU);
  const det_program_rows rows =
      forward_rows(tokens, positions, cache_index, want, (int64_t)views.size(), logits, m.vocab, torch::kCPU);
  check_rc(det_llama_forward(&m, rows.size(), rows.tokens.data(), rows.positions.data(), rows.seq.data(),
                             cache_pointers(views).data(), (int64_t)views.size(), rows.want.data(),
                             logits.data_ptr<float>()));
}

void mak_generate(Model model, const torch::Tensor& prompts,
                  const torch::Tensor& prompt_offsets, const torch::Tensor& start_positions,
                  const std::vector<torch::Tensor>& caches, int64_t max_new, const torch::Tensor& stop_ids,
                  const torch::Tensor& sample_f, const torch::Tensor& sample_i, torch::Tensor& out_tokens,
                  torch::Tensor& out_lengths, torch::Tensor& step_logits) {
  const det_llama_model& m = cpu_model(model);
  std::vector<det_kv_cache> views = cache_views(m, caches, torch::kCPU);
  const int64_t B = (int64_t)views.size();
  check_generate_args(prompts, prompt_offsets, start_positions, B, max_new, out_tokens, out_lengths, step_logits,
                      m.vocab, torch::kCPU);
  const std::vector<det_sample_params> sample = sample_params(sample_f, sample_i, B);
  check_rc(det_llama_generate(&m, B, prompts.data_ptr<int32_t>(), prompt_offsets.data_ptr<int64_t>(),
                              start_positions.data_ptr<int64_t>(), cache_pointers(views).data(), max_new,
                              host_ints<int32_t>(stop_ids, torch::kInt32, "stop_ids"), stop_ids.numel(),
                              sample.empty() ? nullptr : sample.data(), out_tokens.data_ptr<int32_t>(),
                              out_lengths.data_ptr<int64_t>(),
                              step_logits.numel() > 0 ? step_logits.data_ptr<float>() : nullptr));
}

// One row's draw by the engine (det_cpu_sample_f32) or, for tests, by the contract's own steps on one
// thread: scalar weights, the heap walk over every id and the draw (contract/det_sample.h).
static int64_t sample_row(const torch::Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p,
                          int64_t seed, int64_t position, bool reference) {
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_cpu() && logits.is_contiguous() &&
                        logits.dim() == 1 && logits.numel() >= 1,
                    "det-infer: sample_token takes a contiguous 1-d float32 CPU tensor of logits");
  TORCH_CHECK_VALUE(position >= 0, "det-infer: position must be >= 0");
  const torch::Tensor f = torch::tensor({(float)temperature, (float)top_p, (float)min_p}, torch::kFloat32);
  const torch::Tensor i = torch::tensor({top_k, seed}, torch::kInt64);
  const det_sample_params p = sample_params(f, i, 1)[0];
  const int64_t V = logits.numel();
  const float* lg = logits.data_ptr<float>();
  std::vector<float> e(V);
  std::vector<int32_t> heap(V);
  det_fpenv_guard env;
  if (!reference) return det_cpu_sample_f32(lg, V, p, position, e.data(), heap.data());
  if (det_sample_greedy(p)) return det_argmax_f32_ref(lg, V);
  for (int64_t k = 0; k < V; ++k)
    if (!det_sample_finite(lg[k])) return det_argmax_f32_ref(lg, V);
  float m = det_sample_scaled(lg[0], p);
  for (int64_t k = 0; k < V; ++k) {
    e[k] = det_sample_scaled(lg[k], p);
    m = e[k] > m ? e[k] : m;
  }
  for (int64_t k = 0; k < V; ++k) e[k] = det_sample_weight(e[k], m);
  return det_sample_walk(e.data(), V, det_sum_f32_ref(e.data(), V), p, position, heap.data());
}

int64_t sample_token(const torch::Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p,
                     int64_t seed, int64_t position) {
  return sample_row(logits, temperature, top_k, top_p, min_p, seed, position, false);
}

static int64_t test_sample_token_reference(const torch::Tensor& logits, double temperature, int64_t top_k, double top_p,
                                           double min_p, int64_t seed, int64_t position) {
  return sample_row(logits, temperature, top_k, top_p, min_p, seed, position, true);
}

// The decode-step rule (det_decode_continues) for the Python per-step path.
bool decode_continues(int64_t token, int64_t step, int64_t max_new, const torch::Tensor& stop_ids) {
  TORCH_CHECK_VALUE(step >= 0 && max_new >= 1, "det-infer: decode_continues needs step >= 0 and max_new >= 1");
  const int32_t* st = host_ints<int32_t>(stop_ids, torch::kInt32, "stop_ids");
  return det_decode_continues((int32_t)token, step, max_new, st, stop_ids.numel());
}

namespace {

det_sample_params logprob_params(double temperature, int64_t top_k, double top_p, double min_p) {
  TORCH_CHECK_VALUE(temperature > 0 && std::isfinite(temperature), "det-infer: logprobs need a finite temperature > 0, got ",
                    temperature);
  const torch::Tensor f = torch::tensor({(float)temperature, (float)top_p, (float)min_p}, torch::kFloat32);
  const torch::Tensor i = torch::tensor({top_k, (int64_t)0}, torch::kInt64);
  return sample_params(f, i, 1)[0];
}

}  // namespace

void logprob_rows(const torch::Tensor& logits, const torch::Tensor& targets, double temperature, int64_t k,
                  torch::Tensor& lp, torch::Tensor& rank, torch::Tensor& top_ids, torch::Tensor& top_lp) {
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_cpu() && logits.is_contiguous() &&
                        logits.dim() == 2 && logits.size(1) >= 1,
                    "det-infer: logprob_rows takes contiguous (n, V) float32 CPU logits");
  const int64_t n = logits.size(0), V = logits.size(1);
  TORCH_CHECK_VALUE(k >= 0 && k <= V, "det-infer: top_k must be in [0, ", V, "], got ", k);
  TORCH_CHECK_VALUE(targets.scalar_type() == torch::kInt64 && targets.is_contiguous() && targets.numel() == n,
                    "det-infer: targets must be ", n, " int64 ids");
  const int64_t* t = targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r)
    TORCH_CHECK_VALUE(t[r] >= 0 && t[r] < V, "det-infer: target id ", t[r], " is outside [0, ", V, ")");
  TORCH_CHECK_VALUE(lp.scalar_type() == torch::kFloat32 && lp.is_contiguous() && lp.numel() == n &&
                        rank.scalar_type() == torch::kInt64 && rank.is_contiguous() && rank.numel() == n &&
                        top_ids.scalar_type() == torch::kInt64 && top_ids.is_contiguous() && top_ids.numel() == n * k &&
                        top_lp.scalar_type() == torch::kFloat32 && top_lp.is_contiguous() && top_lp.numel() == n * k,
                    "det-infer: logprob_rows' outputs must be lp (n) float32, rank (n) int64, top_ids (n, k) int64, "
                    "top_lp (n, k) float32");
  det_cpu_logprob_rows(logits.data_ptr<float>(), n, V, t, logprob_params(temperature, 0, 1.0, 0.0), k,
                       lp.data_ptr<float>(), rank.data_ptr<int64_t>(), top_ids.data_ptr<int64_t>(),
                       top_lp.data_ptr<float>());
}

void log_softmax_rows(const torch::Tensor& logits, double temperature, torch::Tensor& out) {
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_cpu() && logits.is_contiguous() &&
                        logits.dim() == 2 && logits.size(1) >= 1,
                    "det-infer: log_softmax_rows takes contiguous (n, V) float32 CPU logits");
  TORCH_CHECK_VALUE(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.sizes() == logits.sizes(),
                    "det-infer: log_softmax_rows' out must be float32 of the logits' shape");
  det_cpu_log_softmax_rows(logits.data_ptr<float>(), logits.size(0), logits.size(1),
                           logprob_params(temperature, 0, 1.0, 0.0), out.data_ptr<float>());
}

std::tuple<torch::Tensor, torch::Tensor> logprob_kept(const torch::Tensor& logits, double temperature, int64_t top_k,
                                                      double top_p, double min_p) {
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_cpu() && logits.is_contiguous() &&
                        logits.dim() == 1 && logits.numel() >= 1,
                    "det-infer: logprob_kept takes a contiguous 1-d float32 CPU tensor of logits");
  const int64_t V = logits.numel();
  std::vector<int32_t> ids(V);
  std::vector<float> lp(V);
  const int64_t n = det_cpu_logprob_kept(logits.data_ptr<float>(), V, logprob_params(temperature, top_k, top_p, min_p),
                                         ids.data(), lp.data());
  torch::Tensor out_ids = torch::empty({n}, torch::kInt64), out_lp = torch::empty({n}, torch::kFloat32);
  for (int64_t j = 0; j < n; ++j) out_ids.data_ptr<int64_t>()[j] = ids[j], out_lp.data_ptr<float>()[j] = lp[j];
  return {out_ids, out_lp};
}

// The compression frequencies of rows of logits (contract/det_freq.h): out (n, V) int32.
void token_freqs(const torch::Tensor& logits, torch::Tensor& out) {
  TORCH_CHECK_VALUE(logits.scalar_type() == torch::kFloat32 && logits.is_cpu() && logits.is_contiguous() &&
                        logits.dim() == 2 && logits.size(1) >= 1,
                    "det-infer: token_freqs takes contiguous (n, V) float32 CPU logits");
  TORCH_CHECK_VALUE(out.scalar_type() == torch::kInt32 && out.is_contiguous() && out.sizes() == logits.sizes(),
                    "det-infer: token_freqs' out must be int32 of the logits' shape");
  det_cpu_token_freqs(logits.data_ptr<float>(), logits.size(0), logits.size(1), out.data_ptr<int32_t>());
}

// Test-only: the sampler's kept set of weights e with canonical sum S, by the CPU engine's radix
// ranking or (reference) the contract's heap: (ids in rank order, their running sum).
std::tuple<torch::Tensor, double> test_sample_keep(const torch::Tensor& e, double S, int64_t top_k, double top_p,
                                                   double min_p, bool reference) {
  TORCH_CHECK_VALUE(e.scalar_type() == torch::kFloat32 && e.is_cpu() && e.is_contiguous() && e.dim() == 1 &&
                        e.numel() >= 1,
                    "det-infer: _test_sample_keep takes a contiguous 1-d float32 CPU tensor of weights");
  const int64_t V = e.numel();
  const det_sample_params p{1.0f, (int32_t)top_k, (float)top_p, (float)min_p, 0};
  std::vector<int32_t> heap(V);
  float c;
  det_fpenv_guard env;
  const int64_t n = reference ? det_sample_keep(e.data_ptr<float>(), V, (float)S, p, heap.data(), &c)
                              : det_cpu_sample_keep(e.data_ptr<float>(), V, (float)S, p, heap.data(), &c);
  torch::Tensor ids = torch::empty({n}, torch::kInt64);
  for (int64_t j = 0; j < n; ++j) ids.data_ptr<int64_t>()[j] = heap[V - 1 - j];
  return {ids, (double)c};
}

// The model's layer plan (model/det_layer_plan.h): each step's kind name, and flat (layer, weight
// rows, k, output norm) per step: what a performance model needs of it (benchmarks/gpu_model.py), read from the
// plan the executors run. Weight rows: the rows of length k the step streams per tile (MLP: the
// gate's and the up projection's n each); output norm: a RESIDUAL step's second phase.
std::tuple<std::vector<std::string>, std::vector<int64_t>> layer_plan(const Model& model) {
  const det_llama_model& m = model->model;
  std::vector<std::string> kinds;
  std::vector<int64_t> fields;
  for (int64_t i = 0; i < m.n_steps; ++i) {
    const det_step& s = m.steps[i];
    const int64_t rows = s.kind == DET_STEP_MLP ? 2 * s.n : s.n;
    kinds.push_back(det_step_kind_names[s.kind]);
    fields.insert(fields.end(), {(int64_t)s.layer, rows, s.k, s.norm != nullptr});
  }
  return {kinds, fields};
}

void register_llama_ops(torch::Library& ops) {
  ops.def("layer_plan(" DET_MODEL_TYPE " model) -> (str[], int[])");
  ops.impl("layer_plan", c10::DispatchKey::CompositeExplicitAutograd, &layer_plan);
  // Forward pass of rows (token, position, cache) through a llama-family model; logits of the wanted rows.
  ops.def("mak_forward(" DET_MODEL_TYPE " model, Tensor tokens, Tensor positions, "
          "Tensor(a!)[] caches, Tensor cache_index, Tensor want, Tensor! logits) -> ()");
  ops.impl("mak_forward", torch::kCPU, &mak_forward);
  // A whole generation for B sequences (prefill + every decode step) in one native call: greedy,
  // or seeded sampling per sequence (sample_f / sample_i, docs/SPEC.md §15).
  ops.def("mak_generate(" DET_MODEL_TYPE " model, Tensor prompts, "
          "Tensor prompt_offsets, Tensor start_positions, Tensor(a!)[] caches, int max_new, Tensor stop_ids, "
          "Tensor sample_f, Tensor sample_i, Tensor! out_tokens, Tensor! out_lengths, Tensor! step_logits) -> ()");
  ops.impl("mak_generate", torch::kCPU, &mak_generate);
  // Whether a sequence that emitted `token` as its step-th new token continues (model/det_program.h).
  ops.def("decode_continues(int token, int step, int max_new, Tensor stop_ids) -> bool");
  ops.impl("decode_continues", torch::kCPU, &decode_continues);
  // The contract's next-token choice for one row of logits (docs/SPEC.md §15): greedy at
  // temperature 0, else the seeded draw for the token generated at `position`.
  ops.def("sample_token(Tensor logits, float temperature, int top_k, float top_p, float min_p, int seed, "
          "int position) -> int");
  ops.impl("sample_token", torch::kCPU, &sample_token);
  // The contract's logprobs of rows of logits (docs/SPEC.md §15.1) at a temperature: each row's
  // target logprob and rank, and its k best ids with their logprobs.
  ops.def("logprob_rows(Tensor logits, Tensor targets, float temperature, int k, Tensor! lp, Tensor! rank, "
          "Tensor! top_ids, Tensor! top_lp) -> ()");
  ops.impl("logprob_rows", torch::kCPU, &logprob_rows);
  // The whole log-softmax of each row at a temperature.
  ops.def("log_softmax_rows(Tensor logits, float temperature, Tensor! out) -> ()");
  ops.impl("log_softmax_rows", torch::kCPU, &log_softmax_rows);
  // The sampler's kept set of one row (rank order) and its renormalized logprobs.
  ops.def("logprob_kept(Tensor logits, float temperature, int top_k, float top_p, float min_p) -> (Tensor, Tensor)");
  ops.impl("logprob_kept", torch::kCPU, &logprob_kept);
  // Integer frequencies of rows of logits for lossless compression (docs/SPEC.md §18.1).
  ops.def("token_freqs(Tensor logits, Tensor! out) -> ()");
  ops.impl("token_freqs", torch::kCPU, &token_freqs);
  // Test-only: the kept set by the engine's ranking or the contract's heap (tests/test_sampling.py).
  ops.def("_test_sample_keep(Tensor e, float S, int top_k, float top_p, float min_p, bool reference) -> "
          "(Tensor, float)");
  ops.impl("_test_sample_keep", torch::kCPU, &test_sample_keep);
  // Test-only: sample_token's draw by the contract's own steps (the heap walk over every id).
  ops.def("_test_sample_token_reference(Tensor logits, float temperature, int top_k, float top_p, float min_p, "
          "int seed, int position) -> int");
  ops.impl("_test_sample_token_reference", torch::kCPU, &test_sample_token_reference);
}
