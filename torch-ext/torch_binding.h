// torch_binding.h: the ops of det-infer, as torch sees them. Each converts tensors to raw
// pointers, checks them, and calls the torch-free executor (det_infer_cpu/, det_infer_cuda/).
#pragma once

#include <torch/library.h>
#include <torch/torch.h>

void unary_f32(torch::Tensor& out, const torch::Tensor& x, const std::string& fn);
void sincos_f64(torch::Tensor& sin_out, torch::Tensor& cos_out, const torch::Tensor& theta);
void gemv_ref(torch::Tensor& out, const torch::Tensor& w, const torch::Tensor& x);
void sum_ref(torch::Tensor& out, const torch::Tensor& x);
int64_t argmax_f32(const torch::Tensor& x);
bool fpenv_probe();
void isa_cap(int64_t level);
void act_engine(torch::Tensor& out, const torch::Tensor& x, const std::string& fn,
                const std::optional<torch::Tensor>& up);
std::string gemv_engine(torch::Tensor& out, const torch::Tensor& w, const torch::Tensor& x,
                        const c10::optional<torch::Tensor>& absmax);

// llama_binding.cpp: the llama-family engine's ops, registered into the same library.
void register_llama_ops(torch::Library& ops);
// megakernel_binding.cpp: the megakernel's ops (GPU, or host SIMT emulation on CPU tensors).
void register_megakernel_ops(torch::Library& ops);
