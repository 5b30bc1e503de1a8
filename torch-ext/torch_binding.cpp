// torch_binding.cpp: op schemas (one line each) and the tensor -> pointer hand-off.
#include <torch/library.h>

#include <string>
#include <vector>

#include "../contract/det_unary.h"
#include "../det_infer_cpu/det_kernels_cpu.h"
#include "../det_infer_cpu/det_math_cpu.h"
#include "../det_infer_cpu/det_fpenv.h"
#include "../det_infer_cpu/det_parallel.h"
#include "model_args.h"
#include "registration.h"
#include "torch_binding.h"
#if defined(CUDA_KERNEL)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../det_infer_cuda/det_math_cuda.h"
#endif

namespace {

int unary_fn_index(const std::string& fn) {
  std::string known;
  for (int i = 0; i < DET_UNARY_COUNT; ++i) {
    if (fn == det_unary_fn_names[i]) return i;
    known += (i ? ", " : "") + std::string(det_unary_fn_names[i]);
  }
  TORCH_CHECK_VALUE(false, "det-infer: unknown contract function '", fn, "'; supported: ", known);
  return -1;
}

void check_dense(const torch::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, "det-infer: ", name, " must be ", dtype, ", got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), "det-infer: ", name, " must be contiguous");
}

void check_same_device(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "det-infer: ", what, " must be on one device, got ",
                    a.device(), " and ", b.device());
}

}  // namespace

void unary_f32(torch::Tensor& out, const torch::Tensor& x, const std::string& fn) {
  int f = unary_fn_index(fn);
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  check_same_device(out, x, "out and x");
  TORCH_CHECK_VALUE(out.numel() == x.numel(), "det-infer: out has ", out.numel(),
                    " elements, x has ", x.numel());
  if (x.is_cpu()) {
    det_cpu_unary_f32(f, x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return;
  }
#if defined(CUDA_KERNEL)
  const c10::cuda::CUDAGuard guard(x.device());
  int rc = det_cuda_unary_f32(f, x.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                              c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "det-infer: CUDA launch failed with error ", rc);
#else
  TORCH_CHECK_VALUE(false, "det-infer: this build has no ", x.device().type(), " executor");
#endif
}

void sincos_f64(torch::Tensor& sin_out, torch::Tensor& cos_out, const torch::Tensor& theta) {
  check_dense(theta, "theta", torch::kFloat64);
  check_dense(sin_out, "sin_out", torch::kFloat32);
  check_dense(cos_out, "cos_out", torch::kFloat32);
  check_same_device(sin_out, theta, "sin_out and theta");
  check_same_device(cos_out, theta, "cos_out and theta");
  TORCH_CHECK_VALUE(sin_out.numel() == theta.numel() && cos_out.numel() == theta.numel(),
                    "det-infer: sin_out and cos_out must have theta's ", theta.numel(), " elements");
  if (theta.is_cpu()) {
    det_cpu_sincos_f64(theta.data_ptr<double>(), sin_out.data_ptr<float>(),
                       cos_out.data_ptr<float>(), theta.numel());
    return;
  }
#if defined(CUDA_KERNEL)
  const c10::cuda::CUDAGuard guard(theta.device());
  int rc = det_cuda_sincos_f64(theta.data_ptr<double>(), sin_out.data_ptr<float>(),
                               cos_out.data_ptr<float>(), theta.numel(),
                               c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "det-infer: CUDA launch failed with error ", rc);
#else
  TORCH_CHECK_VALUE(false, "det-infer: this build has no ", theta.device().type(), " executor");
#endif
}

void gemv_ref(torch::Tensor& out, const torch::Tensor& w, const torch::Tensor& x) {
  TORCH_CHECK_VALUE(w.is_cpu() && x.is_cpu() && out.is_cpu(),
                    "det-infer: gemv_ref is the CPU reference; pass CPU tensors");
  TORCH_CHECK_VALUE(w.dim() == 2, "det-infer: w must be (rows, K), got ", w.dim(), " dims");
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  const int64_t rows = w.size(0), K = w.size(1);
  TORCH_CHECK_VALUE(x.numel() == K, "det-infer: x has ", x.numel(), " elements, w has K = ", K);
  TORCH_CHECK_VALUE(out.numel() == rows, "det-infer: out has ", out.numel(), " elements, w has ",
                    rows, " rows");
  if (w.scalar_type() == torch::kBFloat16) {
    check_dense(w, "w", torch::kBFloat16);
    det_cpu_gemv_bf16_ref(reinterpret_cast<const uint16_t*>(w.data_ptr()), x.data_ptr<float>(),
                          out.data_ptr<float>(), rows, K);
  } else {
    check_dense(w, "w (bf16 or fp32)", torch::kFloat32);
    det_cpu_gemv_f32_ref(w.data_ptr<float>(), x.data_ptr<float>(), out.data_ptr<float>(), rows, K);
  }
}

void sum_ref(torch::Tensor& out, const torch::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cpu() && out.is_cpu(), "det-infer: sum_ref is the CPU reference");
  TORCH_CHECK_VALUE(x.dim() == 2, "det-infer: x must be (rows, K), got ", x.dim(), " dims");
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  TORCH_CHECK_VALUE(out.numel() == x.size(0), "det-infer: out has ", out.numel(),
                    " elements, x has ", x.size(0), " rows");
  det_cpu_sum_f32_ref(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1));
}

// The engine's canonical sum of each row (det_sum_f32), for tests against sum_ref.
void sum_engine(torch::Tensor& out, const torch::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cpu() && out.is_cpu() && x.dim() == 2, "det-infer: sum_engine takes CPU (rows, K)");
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  TORCH_CHECK_VALUE(out.numel() == x.size(0), "det-infer: out has ", out.numel(), " elements, x has ", x.size(0),
                    " rows");
  det_fpenv_guard env;
  for (int64_t r = 0; r < x.size(0); ++r)
    out.data_ptr<float>()[r] = det_sum_f32(x.data_ptr<float>() + r * x.size(1), x.size(1));
}

int64_t argmax_f32(const torch::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cpu(), "det-infer: argmax_f32 is the CPU reference");
  check_dense(x, "x", torch::kFloat32);
  TORCH_CHECK_VALUE(x.numel() >= 1, "det-infer: argmax of an empty tensor");
  return det_cpu_argmax_f32(x.data_ptr<float>(), x.numel());
}

bool fpenv_probe() { return det_cpu_fpenv_probe() != 0; }

void isa_cap(int64_t level) {
  TORCH_CHECK_VALUE(level >= DET_ISA_REF && level <= DET_ISA_AVX512,
                    "det-infer: ISA level must be 0 (ref), 1 (avx2) or 2 (avx512: batch-1 GEMV, nf4 decode), got ", level);
  det_set_isa_cap((int)level);
}

void act_engine(torch::Tensor& out, const torch::Tensor& x, const std::string& fn,
                const std::optional<torch::Tensor>& up) {
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  TORCH_CHECK_VALUE(x.is_cpu() && out.is_cpu() && out.numel() == x.numel(),
                    "det-infer: act_engine takes CPU tensors of one size");
  const int64_t n = x.numel();
  det_fpenv_guard env;
  if (fn == "exp") {
    TORCH_CHECK_VALUE(!up, "det-infer: act_engine's up is for silu and gelu_tanh, not exp");
    det_exp_sub(x.data_ptr<float>(), 0.0f, out.data_ptr<float>(), n);  // exp(fl(x - 0)) = exp(x)
  } else if (fn == "silu" || fn == "gelu_tanh") {
    std::vector<float> ones;
    const float* u = nullptr;
    if (up) {
      check_dense(*up, "up", torch::kFloat32);
      TORCH_CHECK_VALUE(up->is_cpu() && up->numel() == n,
                        "det-infer: act_engine's up must be a CPU tensor of x's size");
      u = up->data_ptr<float>();
    } else {
      ones.assign(n, 1.0f);  // act(x) * 1 = act(x)
      u = ones.data();
    }
    det_act_mul(fn == "silu" ? DET_ACT_SILU : DET_ACT_GELU_TANH, x.data_ptr<float>(), u,
                out.data_ptr<float>(), n);
  } else {
    TORCH_CHECK_VALUE(false, "det-infer: act_engine supports exp, silu, gelu_tanh; got '", fn, "'");
  }
}

// out[i] = fl(canonical dot(q, k[i]) * scale): the engine's attention scores over the rows of k
// (row stride free, as in a KV cache).
void attn_scores_engine(torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k, double scale) {
  check_dense(q, "q", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  TORCH_CHECK_VALUE(q.is_cpu() && k.is_cpu() && out.is_cpu(), "det-infer: attn_scores_engine takes CPU tensors");
  TORCH_CHECK_VALUE(k.scalar_type() == torch::kFloat32 && k.dim() == 2 && k.stride(1) == 1 &&
                        q.numel() >= 1 && k.size(1) == q.numel() && out.numel() == k.size(0),
                    "det-infer: k must be fp32 (n, D) with unit column stride, q (D,) with D >= 1 and out (n,)");
  det_fpenv_guard env;
  det_attn_scores(q.data_ptr<float>(), k.data_ptr<float>(), k.stride(0), q.numel(), k.size(0), (float)scale,
                  out.data_ptr<float>());
}

// One chunk's attention partials (det_attn_chunk) of the queries q (nq, D), query i seeing slots
// ranges[i] = (j0, j1) of k and v (n <= 128 rows of D): stats (nq, 2) gets (m, l), o (nq, D) gets o.
// Returns the version that ran (det_attn_chunk_impl_name).
std::string attn_chunk_engine(torch::Tensor& stats, torch::Tensor& o, const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& ranges, double scale) {
  check_dense(stats, "stats", torch::kFloat32);
  check_dense(o, "o", torch::kFloat32);
  check_dense(q, "q", torch::kFloat32);
  check_dense(k, "k", torch::kFloat32);
  check_dense(v, "v", torch::kFloat32);
  TORCH_CHECK_VALUE(stats.is_cpu() && o.is_cpu() && q.is_cpu() && k.is_cpu() && v.is_cpu() && ranges.is_cpu(),
                    "det-infer: attn_chunk_engine takes CPU tensors");
  const int64_t nq = q.size(0), D = q.size(1), n = k.size(0);
  TORCH_CHECK_VALUE(q.dim() == 2 && k.dim() == 2 && k.sizes() == v.sizes() && k.size(1) == D && n <= DET_ATTN_CHUNK &&
                        ranges.scalar_type() == torch::kInt64 && ranges.is_contiguous() &&
                        ranges.sizes() == torch::IntArrayRef({nq, 2}) && stats.sizes() == torch::IntArrayRef({nq, 2}) &&
                        o.sizes() == q.sizes(),
                    "det-infer: attn_chunk_engine takes q (nq, D), k and v (n <= 128, D), ranges int64 (nq, 2), "
                    "stats (nq, 2), o (nq, D)");
  const int64_t* r = ranges.data_ptr<int64_t>();
  std::vector<det_attn_acc> parts(nq);
  std::vector<det_attn_query> qs(nq);
  for (int64_t i = 0; i < nq; ++i) {
    TORCH_CHECK_VALUE(0 <= r[2 * i] && r[2 * i] <= r[2 * i + 1] && r[2 * i + 1] < n,
                      "det-infer: attn_chunk_engine's ranges must satisfy 0 <= j0 <= j1 < n");
    qs[i] = {q.data_ptr<float>() + i * D, r[2 * i], r[2 * i + 1], &parts[i], o.data_ptr<float>() + i * D};
  }
  // k's rows into the cache's key panels (docs/SPEC.md §13.8) of a cache that ends after slot n - 1.
  std::vector<float> panels(n * D);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) panels[det_kv_key_at(n, D, j, d)] = k.data_ptr<float>()[j * D + d];
  det_fpenv_guard env;
  det_attn_chunk({panels.data(), v.data_ptr<float>(), n}, D, (float)scale, qs.data(), nq, {});
  for (int64_t i = 0; i < nq; ++i) {
    stats.data_ptr<float>()[2 * i] = parts[i].m;
    stats.data_ptr<float>()[2 * i + 1] = parts[i].l;
  }
  return det_attn_chunk_impl_name(D);
}

// w: bf16 (N, K), or nf4 uint8 codes (N, K/2) with absmax (its fp32 block scales).
std::string gemv_engine(torch::Tensor& out, const torch::Tensor& w, const torch::Tensor& x,
                        const c10::optional<torch::Tensor>& absmax) {
  check_dense(x, "x", torch::kFloat32);
  check_dense(out, "out", torch::kFloat32);
  const bool nf4 = absmax.has_value() && absmax->numel() > 0;
  TORCH_CHECK_VALUE(w.is_cpu() && x.is_cpu() && out.is_cpu() && w.dim() == 2 && x.dim() == 2 && out.dim() == 2,
                    "det-infer: gemv_engine takes CPU w (N, K) or nf4 codes (N, K/2), x (B, K), out (B, N)");
  const int64_t N = w.size(0), K = x.size(1), B = x.size(0);
  TORCH_CHECK_VALUE(w.size(1) == (nf4 ? K / 2 : K) && out.size(0) == B && out.size(1) == N,
                    "det-infer: gemv_engine shape mismatch");
  const det_matrix W = matrix_view(w, nf4 ? *absmax : torch::Tensor(), N, K, "w", torch::kCPU);
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  det_fpenv_guard env;
  det_staging staged;
  const det_matrix* list[] = {&W};
  const det_gemv_input in = det_gemv_stage(list, 1, xp, K, B, staged);
  det_parallel_chunks(N, [&](int64_t r0, int64_t r1) { det_gemv_rows(W, in, yp, N, r0, r1); });
  return det_gemv_impl_name(W, K, B);
}

// Nested absmax resolved by det_nf4_nested_absmax_f32: q2 uint8 (n,), code2 float32 (256,),
// absmax2 float32 (ceil(n / nested_block),).
torch::Tensor nf4_nested_absmax(const torch::Tensor& q2, const torch::Tensor& code2, const torch::Tensor& absmax2,
                                int64_t nested_block, double offset) {
  check_dense(q2, "q2", torch::kUInt8);
  check_dense(code2, "code2", torch::kFloat32);
  check_dense(absmax2, "absmax2", torch::kFloat32);
  const int64_t n = q2.numel();
  TORCH_CHECK_VALUE(q2.is_cpu() && code2.is_cpu() && absmax2.is_cpu(), "det-infer: nf4_nested_absmax takes CPU tensors");
  TORCH_CHECK_VALUE(code2.numel() == 256, "det-infer: the nested codebook must have 256 entries, got ", code2.numel());
  TORCH_CHECK_VALUE(nested_block >= 1 && absmax2.numel() == (n + nested_block - 1) / nested_block,
                    "det-infer: ", n, " nested codes in blocks of ", nested_block, " need ",
                    nested_block >= 1 ? (n + nested_block - 1) / nested_block : 0, " nested absmax values, got ",
                    absmax2.numel());
  torch::Tensor out = torch::empty({n}, torch::kFloat32);
  const uint8_t* q = q2.data_ptr<uint8_t>();
  const float *c = code2.data_ptr<float>(), *a = absmax2.data_ptr<float>();
  float* o = out.data_ptr<float>();
  det_fpenv_guard env;
  for (int64_t i = 0; i < n; ++i) o[i] = det_nf4_nested_absmax_f32(c[q[i]], a[i / nested_block], (float)offset);
  return out;
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // out = f(x) elementwise for a contract function f (exp, tanh, silu, gelu_tanh, rsqrt, bf16_round)
  ops.def("unary_f32(Tensor! out, Tensor x, str fn) -> ()");
  ops.impl("unary_f32", torch::kCPU, &unary_f32);
  // contract sin and cos of fp64 angles, rounded to fp32
  ops.def("sincos_f64(Tensor! sin_out, Tensor! cos_out, Tensor theta) -> ()");
  ops.impl("sincos_f64", torch::kCPU, &sincos_f64);
#if defined(CUDA_KERNEL)
  ops.impl("unary_f32", torch::kCUDA, &unary_f32);
  ops.impl("sincos_f64", torch::kCUDA, &sincos_f64);
#endif
  // out[r] = canonical dot(w[r], x); w bf16 or fp32 (rows, K)
  ops.def("gemv_ref(Tensor! out, Tensor w, Tensor x) -> ()");
  ops.impl("gemv_ref", torch::kCPU, &gemv_ref);
  // out[r] = canonical sum(x[r])
  ops.def("sum_ref(Tensor! out, Tensor x) -> ()");
  ops.impl("sum_ref", torch::kCPU, &sum_ref);
  // contract argmax: NaN above all, then largest, ties to the lowest id
  ops.def("argmax_f32(Tensor x) -> int");
  ops.impl("argmax_f32", torch::kCPU, &argmax_f32);
  // ---- test-only ops (the _test_ prefix): probes of the engine's kernels for tests/ and
  // benchmarks/, not part of the v1 surface.
  // true when a native call runs under the IEEE FP environment it installs
  ops.def("_test_fpenv_probe() -> bool");
  ops.impl("_test_fpenv_probe", c10::DispatchKey::CompositeExplicitAutograd, &fpenv_probe);
  // out (B, N) = x (B, K) times w (N, K)^T with the engine's GEMV (w bf16, or nf4 codes with
  // their absmax); returns the version used
  ops.def("_test_gemv_engine(Tensor! out, Tensor w, Tensor x, Tensor? absmax=None) -> str");
  ops.impl("_test_gemv_engine", torch::kCPU, &gemv_engine);
  // cap the engine's kernels at an ISA level (0 ref, 1 avx2, 2 avx512: batch-1 GEMV and nf4 decode;
  // above the CPU's = the CPU's)
  ops.def("_test_isa_cap(int level) -> ()");
  ops.impl("_test_isa_cap", c10::DispatchKey::CompositeExplicitAutograd, &isa_cap);
  // the engine's vectorized exp(x), or silu(x) / gelu_tanh(x) times up (1 when absent), for tests
  // against unary_f32
  ops.def("_test_act_engine(Tensor! out, Tensor x, str fn, Tensor? up=None) -> ()");
  ops.impl("_test_act_engine", torch::kCPU, &act_engine);
  // each row's canonical sum by the engine's vectorized loop (for tests against sum_ref)
  ops.def("_test_sum_engine(Tensor! out, Tensor x) -> ()");
  ops.impl("_test_sum_engine", torch::kCPU, &sum_engine);
  // the engine's attention scores of one query against rows of k (for tests against the contract)
  ops.def("_test_attn_scores_engine(Tensor! out, Tensor q, Tensor k, float scale) -> ()");
  ops.impl("_test_attn_scores_engine", torch::kCPU, &attn_scores_engine);
  // one chunk's attention partials of several queries (for tests of each ISA level against the loops)
  ops.def("_test_attn_chunk_engine(Tensor! stats, Tensor! o, Tensor q, Tensor k, Tensor v, Tensor ranges, "
          "float scale) -> str");
  ops.impl("_test_attn_chunk_engine", torch::kCPU, &attn_chunk_engine);
  // ---- the loaders' and the engine's ops
  // the contract's nf4 codebook, and nested absmax resolution (contract/det_nf4.h)
  ops.def("nf4_codebook() -> Tensor");
  ops.impl("nf4_codebook", c10::DispatchKey::CompositeExplicitAutograd, &nf4_codebook);
  ops.def("nf4_nested_absmax(Tensor q2, Tensor code2, Tensor absmax2, int nested_block, float offset) -> Tensor");
  ops.impl("nf4_nested_absmax", torch::kCPU, &nf4_nested_absmax);
  // The model, handed over once at load (model_args.h): (names, weights, scales, cfg, eps, inv_freq).
  ops.class_<NativeModel>("Model").def(
      torch::init<std::vector<std::string>, std::vector<torch::Tensor>, std::vector<torch::Tensor>,
                  std::vector<int64_t>, double, torch::Tensor>());
  register_llama_ops(ops);
  register_megakernel_ops(ops);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
