// megakernel_binding.cpp: the mega_* ops. On CUDA tensors they launch the megakernel
// (det_infer_cuda/det_megakernel.cu); on CPU tensors they run the same device code under host SIMT
// emulation (megakernel/host/). Arguments are those of mak_forward / mak_generate (the model built
// at load, NativeModel) plus the launch
// geometry [grid, warps, ring, tile_rows, seed, attn, ahead, barrier, outs, stage, area_rows] (0 for grid, warps, tile_rows or area_rows: the launcher's
// choice on a GPU). Token, position and index tensors are CPU tensors on both paths: they are
// validated on the host before anything is launched.
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../megakernel/det_megakernel.h"
#include "model_args.h"
#include "torch_binding.h"
#if defined(CUDA_KERNEL)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../det_infer_cuda/det_megakernel_cuda.h"
#endif

namespace {

// The program's row and sequence arrays on the host, alive for the whole call.
struct HostProgram {
  det_program_rows rows;
  std::vector<int32_t> stops;
  std::vector<int64_t> capacities;
  std::vector<det_mk_seq> seqs;
  std::vector<det_sample_params> sample;  // empty: greedy
};

det_mk_geometry parse_geometry(c10::IntArrayRef g) {
  TORCH_CHECK_VALUE(g.size() == 11,
                    "det-infer: geometry is [grid, warps, ring, tile_rows, seed, attn, ahead, barrier, outs, stage, area_rows], got ",
                    g.size(), " values");
  for (int i : {0, 1, 2, 3, 5, 6, 7, 8, 9, 10})
    TORCH_CHECK_VALUE(g[i] >= 0 && g[i] <= 65535, "det-infer: geometry value ", g[i], " out of range");
  det_mk_geometry geo{};
  geo.grid = (int)g[0];
  geo.warps = (int)g[1];
  geo.ring = (int)g[2];
  geo.tile_rows = (int)g[3];
  geo.seed = (uint64_t)g[4];
  geo.attn = (int)g[5];
  geo.ahead = (int)g[6];
  geo.barrier = (int)g[7];
  geo.outs = (int)g[8];
  geo.stage = (int)g[9];
  geo.area_rows = (int)g[10];
  return geo;
}

void check(int rc, const char* why, const char* what) {
  TORCH_CHECK_VALUE(rc == DET_MK_OK, "det-infer: ", what, ": ", why ? why : "invalid arguments", " (code ", rc, ")");
}

HostProgram host_program(const std::vector<det_kv_cache>& views) {
  HostProgram h;
  for (const det_kv_cache& v : views) {
    // Split attention reads keys 16 bytes at a time (det_mk_attn_group.cuh): a cache that torch
    // allocated is aligned, a view into one at an odd offset would not be.
    TORCH_CHECK_VALUE(((uintptr_t)v.k | (uintptr_t)v.v) % 16 == 0,
                      "det-infer: the megakernel needs each KV cache 16-byte aligned (a KVState's own tensor is)");
    h.seqs.push_back({v.k, v.v, v.capacity});
    h.capacities.push_back(v.capacity);
  }
  return h;
}

#if defined(CUDA_KERNEL)
// A device copy of a host array (kept alive by the returned tensor).
template <typename T>
torch::Tensor upload(const std::vector<T>& v, const torch::Device& dev) {
  auto host = torch::from_blob((void*)v.data(), {(int64_t)(v.size() * sizeof(T))}, torch::kUInt8);
  return v.empty() ? torch::empty({16}, torch::dtype(torch::kUInt8).device(dev)) : host.to(dev);
}
#endif

// The profiling timeline's buffers (det_mk_program::timeline), or none.
struct Timeline {
  torch::Tensor* stamps = nullptr;  // int64, flat: (capacity, grid, det_mk_stamp_slots(warps)) once the grid is known
  torch::Tensor* tags = nullptr;    // int32 (capacity,)
  torch::Tensor* work = nullptr;    // emulation only: int64 (phases, grid * warps, 4), or empty
};

// Points prog's timeline at tl's buffers for a launch of geo.grid blocks.
void attach_timeline(det_mk_program& prog, const Timeline& tl, const det_mk_geometry& geo, const torch::Device& dev) {
  if (!tl.stamps) return;
  for (const torch::Tensor* x : {tl.stamps, tl.tags})
    TORCH_CHECK_VALUE(x->device() == dev && x->is_contiguous(), "det-infer: timeline buffers must be contiguous on ", dev);
  TORCH_CHECK_VALUE(tl.stamps->scalar_type() == torch::kInt64 && tl.tags->scalar_type() == torch::kInt32,
                    "det-infer: timeline stamps are int64, tags int32");
  prog.timeline_cap = std::min<int64_t>(tl.stamps->numel() / ((int64_t)det_mk_stamp_slots(geo.warps) * geo.grid),
                                        tl.tags->numel());
  prog.timeline = (uint64_t*)tl.stamps->data_ptr<int64_t>();
  prog.timeline_tag = tl.tags->data_ptr<int32_t>();
}

// Validates and runs a program whose outputs (prog.logits / out_* / step_logits) are already set;
// returns the geometry it ran with (the launcher's choices filled in).
det_mk_geometry run(const NativeModel& nm, HostProgram& h, det_mk_program prog, det_mk_geometry geo,
                    const Timeline& tl = {}) {
  const torch::Device& dev = nm.device;
  const char* why = nullptr;
  const det_program_rows& r = h.rows;
  prog.n_rows = r.size();
  prog.n_seq = (int64_t)h.seqs.size();
  prog.n_stop = (int64_t)h.stops.size();
  int rc = det_mk_check_model(&nm.model, &why);
  check(rc, why, "the megakernel cannot run this model");
  rc = det_mk_check_program(&nm.model, &prog, r.tokens.data(), r.positions.data(), r.seq.data(), r.want.data(),
                            h.capacities.data(), &why);
  check(rc, why, "invalid program");
  det_mk_params p{};
  p.model = nm.model;
  if (dev.is_cpu()) {
    rc = det_mk_check_geometry(&geo, &why);
    check(rc, why, "invalid geometry");
    torch::Tensor ws = torch::zeros({(int64_t)det_mk_workspace_bytes(&nm.model, geo.tile_rows) + 16}, torch::kUInt8);
    prog.tokens = r.tokens.data();
    prog.positions = r.positions.data();
    prog.seq = r.seq.data();
    prog.want = r.want.data();
    prog.seqs = h.seqs.data();
    prog.stop_ids = h.stops.data();
    prog.sample = h.sample.empty() ? nullptr : h.sample.data();
    p.prog = prog;
    p.ws = det_mk_workspace_carve(&nm.model, geo.tile_rows, ws.data_ptr());
    p.geo = geo;
    attach_timeline(p.prog, tl, geo, dev);
    const bool counted = tl.work && tl.work->numel() > 0;
    if (counted)
      TORCH_CHECK_VALUE(tl.work->scalar_type() == torch::kInt64 && tl.work->is_contiguous() && tl.work->is_cpu(),
                        "det-infer: the work profile is a contiguous int64 CPU tensor");
    rc = counted ? det_mk_run_emulated_counted(&p, tl.work->data_ptr<int64_t>(),
                                               tl.work->numel() / ((int64_t)geo.grid * geo.warps * 4))
                 : det_mk_run_emulated(&p);
    check(rc, "a synchronization was not reached by every thread (deadlock)", "emulation failed");
    return geo;
  }
#if defined(CUDA_KERNEL)
  const c10::cuda::CUDAGuard guard(dev);
  TORCH_CHECK_VALUE(!tl.work || tl.work->numel() == 0,
                    "det-infer: the work profile counts under emulation only (executor 'emulated')");
  rc = det_mk_check_alignment(&nm.model, &why);
  check(rc, why, "the megakernel cannot read these weights");
  rc = det_mk_cuda_resolve(&nm.model, &geo, dev.index(), &why);
  check(rc, why, "invalid geometry");
  auto tokens = upload(r.tokens, dev), positions = upload(r.positions, dev);
  auto seq = upload(r.seq, dev), want = upload(r.want, dev), seqs = upload(h.seqs, dev), stops = upload(h.stops, dev);
  auto sample = upload(h.sample, dev);
  torch::Tensor ws = torch::zeros({(int64_t)det_mk_workspace_bytes(&nm.model, geo.tile_rows) + 16},
                                  torch::dtype(torch::kUInt8).device(dev));
  p.model.layers = (const det_llama_layer*)nm.device_layers.data_ptr();  // copied at load
  p.model.steps = (const det_step*)nm.device_steps.data_ptr();
  prog.tokens = (const int32_t*)tokens.data_ptr();
  prog.positions = (const int64_t*)positions.data_ptr();
  prog.seq = (const int32_t*)seq.data_ptr();
  prog.want = (const uint8_t*)want.data_ptr();
  prog.seqs = (const det_mk_seq*)seqs.data_ptr();
  prog.stop_ids = (const int32_t*)stops.data_ptr();
  prog.sample = h.sample.empty() ? nullptr : (const det_sample_params*)sample.data_ptr();
  p.prog = prog;
  p.ws = det_mk_workspace_carve(&nm.model, geo.tile_rows, ws.data_ptr());
  p.geo = geo;
  attach_timeline(p.prog, tl, geo, dev);
  rc = det_mk_cuda_launch(&p, c10::cuda::getCurrentCUDAStream(dev.index()).stream(), &why);
  check(rc, why, "CUDA launch failed");
  // The uploads must outlive the kernel: wait before they are freed.
  C10_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(dev.index()).stream()));
  return geo;
#else
  TORCH_CHECK_VALUE(false, "det-infer: this build has no CUDA support; tensors on ", dev, " cannot be used");
  return geo;
#endif
}

}  // namespace

void mega_forward(Model model, const torch::Tensor& tokens, const torch::Tensor& positions,
                  const std::vector<torch::Tensor>& caches, const torch::Tensor& cache_index,
                  const torch::Tensor& want, torch::Tensor& logits, c10::IntArrayRef geometry) {
  const NativeModel& nm = *model;
  const torch::Device& dev = nm.device;
  HostProgram h = host_program(cache_views(nm.model, caches, dev));
  h.rows = forward_rows(tokens, positions, cache_index, want, (int64_t)h.seqs.size(), logits, nm.model.vocab, dev);
  det_mk_program prog{};
  prog.logits = logits.data_ptr<float>();
  run(nm, h, prog, parse_geometry(geometry));
}

namespace {

det_mk_geometry generate(Model model, const torch::Tensor& prompts, const torch::Tensor& prompt_offsets,
                         const torch::Tensor& start_positions, const std::vector<torch::Tensor>& caches,
                         int64_t max_new, const torch::Tensor& stop_ids, const torch::Tensor& sample_f,
                         const torch::Tensor& sample_i, torch::Tensor& out_tokens, torch::Tensor& out_lengths,
                         torch::Tensor& step_logits, c10::IntArrayRef geometry, const Timeline& tl) {
  const NativeModel& nm = *model;
  const torch::Device& dev = nm.device;
  HostProgram h = host_program(cache_views(nm.model, caches, dev));
  const int64_t B = (int64_t)h.seqs.size();
  TORCH_CHECK_VALUE(B >= 1 && B <= DET_MK_SEQ_MAX, "det-infer: the megakernel generates for 1..", DET_MK_SEQ_MAX,
                    " sequences, got ", B);
  check_generate_args(prompts, prompt_offsets, start_positions, B, max_new, out_tokens, out_lengths, step_logits,
                      nm.model.vocab, dev);
  det_program_prefill(B, prompts.data_ptr<int32_t>(), prompt_offsets.data_ptr<int64_t>(),
                      start_positions.data_ptr<int64_t>(), h.rows);
  const int32_t* st = host_ints<int32_t>(stop_ids, torch::kInt32, "stop_ids");
  h.stops.assign(st, st + stop_ids.numel());
  h.sample = sample_params(sample_f, sample_i, B);
  det_mk_program prog{};
  prog.max_new = max_new;
  prog.out_tokens = out_tokens.data_ptr<int32_t>();
  prog.out_lengths = out_lengths.data_ptr<int64_t>();
  if (step_logits.numel() > 0) prog.step_logits = step_logits.data_ptr<float>();
  return run(nm, h, prog, parse_geometry(geometry), tl);
}

}  // namespace

void mega_generate(Model model, const torch::Tensor& prompts, const torch::Tensor& prompt_offsets,
                   const torch::Tensor& start_positions, const std::vector<torch::Tensor>& caches, int64_t max_new,
                   const torch::Tensor& stop_ids, const torch::Tensor& sample_f, const torch::Tensor& sample_i,
                   torch::Tensor& out_tokens, torch::Tensor& out_lengths, torch::Tensor& step_logits,
                   c10::IntArrayRef geometry) {
  generate(model, prompts, prompt_offsets, start_positions, caches, max_new, stop_ids, sample_f, sample_i, out_tokens,
           out_lengths, step_logits, geometry, {});
}

// mega_generate with the profiling timeline on: stamps (int64, flat, on the model's device) and
// tags (int32) as det_mk_program::timeline describes; under emulation, a non-empty work tensor
// also counts each warp's work per phase (det_mk_run_emulated_counted). Returns the grid and the
// warps a block it ran with.
std::vector<int64_t> test_mega_timeline(Model model, const torch::Tensor& prompts, const torch::Tensor& prompt_offsets,
                           const torch::Tensor& start_positions, const std::vector<torch::Tensor>& caches,
                           int64_t max_new, const torch::Tensor& stop_ids, const torch::Tensor& sample_f,
                           const torch::Tensor& sample_i, torch::Tensor& out_tokens, torch::Tensor& out_lengths,
                           torch::Tensor& step_logits, c10::IntArrayRef geometry, torch::Tensor& stamps,
                           torch::Tensor& tags, torch::Tensor& work) {
  Timeline tl;
  tl.stamps = &stamps;
  tl.tags = &tags;
  tl.work = &work;
  const det_mk_geometry geo = generate(model, prompts, prompt_offsets, start_positions, caches, max_new, stop_ids,
                                       sample_f, sample_i, out_tokens, out_lengths, step_logits, geometry, tl);
  return {geo.grid, geo.warps};
}

void register_megakernel_ops(torch::Library& ops) {
  // mak_forward through the megakernel (CUDA tensors) or its host emulation (CPU tensors).
  ops.def("mega_forward(" DET_MODEL_TYPE " model, Tensor tokens, Tensor positions, "
          "Tensor(a!)[] caches, Tensor cache_index, Tensor want, Tensor! logits, int[] geometry) -> ()");
  ops.impl("mega_forward", c10::DispatchKey::CompositeExplicitAutograd, &mega_forward);
  // mak_generate as one megakernel launch (or its host emulation).
  ops.def("mega_generate(" DET_MODEL_TYPE " model, Tensor prompts, "
          "Tensor prompt_offsets, Tensor start_positions, Tensor(a!)[] caches, int max_new, Tensor stop_ids, "
          "Tensor sample_f, Tensor sample_i, Tensor! out_tokens, Tensor! out_lengths, Tensor! step_logits, "
          "int[] geometry) -> ()");
  ops.impl("mega_generate", c10::DispatchKey::CompositeExplicitAutograd, &mega_generate);
  // mega_generate with the profiling timeline (benchmarks/gpu_profile.py): returns [grid, warps].
  ops.def("_test_mega_timeline(" DET_MODEL_TYPE " model, Tensor prompts, "
          "Tensor prompt_offsets, Tensor start_positions, Tensor(a!)[] caches, int max_new, Tensor stop_ids, "
          "Tensor sample_f, Tensor sample_i, Tensor! out_tokens, Tensor! out_lengths, Tensor! step_logits, "
          "int[] geometry, Tensor! stamps, Tensor! tags, Tensor! work) -> int[]");
  ops.impl("_test_mega_timeline", c10::DispatchKey::CompositeExplicitAutograd, &test_mega_timeline);
}
