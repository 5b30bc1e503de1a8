// det_simt.h: the SIMT portability layer. The megakernel (det_megakernel.cuh) touches CUDA only
// through these functions, so the same source compiles for a GPU (nvcc: the CUDA built-ins below)
// and runs on the host under emulation (g++/clang: every CUDA thread a fiber,
// megakernel/host/det_simt_host.cpp). docs/SPEC.md §14.4.
//
// What the kernel may use:
//   det_lane() det_warp() det_warps() det_block() det_blocks()  thread coordinates (warps of 32)
//   det_sync_block()   __syncthreads            det_sync_warp()  __syncwarp
//   det_sync_grid(bar) the grid barrier (integer atomics on the GPU; on the host a rendezvous of
//                      every fiber, or with DET_SIMT_MODES=threads the GPU's algorithm between OS
//                      threads); all blocks must be resident (cooperative launch)
//   det_sync_grid_counter(bar, arrivals)  the same by a monotonic 64-bit arrival count (never
//                      reset): thread 0 passes the count that completes this barrier
//   det_warp_arrive(count)  every lane of a warp: its writes released, one arrival added to a
//                      32-bit global count, the arrivals before it returned on every lane, and
//                      the earlier arrivals' writes acquired (the last of n arrivals sees n - 1)
//   det_shfl_down_n(v, n, d) / det_shfl_idx_n(v, n, src)  warp shuffles of n 32-bit values
//   det_shfl_down_combine_n(v, n, d, f)  v[i] = f(v[i], v[i] of lane + d), all lanes at once
//   det_smem()         the block's dynamic shared memory
//   det_globaltimer()  nanoseconds (%globaltimer on the GPU, a steady clock on the host): profiling
//                      stamps only, never an input to arithmetic
//   det_load_f32x4(p)  one 16-byte load of 4 floats (p 16-byte aligned); det_load_f32x2, 8 bytes
//   det_ld(p)          one load of *p (any type): the kernel's reads of activations, caches and
//                      shared memory go through it so that the emulation can count them
//   det_work_fma(n)    n fmas this thread just did (a no-op on the GPU; counted under emulation)
//                      Under emulation with a work profile (det_simt_host::WorkProfile), every
//                      thread's global and shared bytes, loads and fmas are counted per warp and
//                      per phase (grid synchronizations the thread has passed)
//   det_prefetch_l2(p) a hint that the line of p is read soon (prefetch.global.L2; nothing on the host)
//   det_cp_async16 / det_cp_async4 / det_cp_async_commit / det_cp_async_wait<N>  16- and 4-byte
//                      async copies global -> shared (cp.async on sm_80+, a plain copy before
//                      sm_80; on the host a plain copy, or deferred to the wait_group with
//                      DET_SIMT_MODES=async)
//   det_cp_async16_l2  det_cp_async16 for data written earlier in the launch (the KV cache): read
//                      from L2, never through a non-coherent cache (cp.async.cg; __ldcg before sm_80)
// Every call that synchronizes must be reached by every thread of its scope (warp, block, grid),
// as on the GPU; the emulator reports a deadlock instead of hanging when one is not.
#pragma once

#include <stdint.h>

#define DET_WARP 32

#if defined(__CUDACC__)
// ================================ GPU =========================================================
#define DET_DEV __device__ __forceinline__
#define DET_DEV_NOINLINE __device__ __noinline__  // a phase: its own register allocation
#define DET_NO_UNROLL _Pragma("unroll 1")           // a loop whose body must stay one copy
#define DET_UNROLL _Pragma("unroll")                // a loop over a register array (large body)
typedef uint4 det_vec_u32x4;
typedef float4 det_vec_f32x4;
typedef float2 det_vec_f32x2;

DET_DEV int det_lane() { return threadIdx.x & (DET_WARP - 1); }
DET_DEV int det_warp() { return threadIdx.x / DET_WARP; }
DET_DEV int det_warps() { return blockDim.x / DET_WARP; }
DET_DEV int det_thread() { return threadIdx.x; }
DET_DEV int det_threads() { return blockDim.x; }
DET_DEV int det_block() { return blockIdx.x; }
DET_DEV int det_blocks() { return gridDim.x; }
DET_DEV void det_sync_block() { __syncthreads(); }
DET_DEV void det_sync_warp() { __syncwarp(); }

template <typename T>
DET_DEV void det_shfl_down_n(T* v, int n, int delta) {
  for (int i = 0; i < n; ++i) v[i] = __shfl_down_sync(0xffffffffu, v[i], delta);
}
template <typename T>
DET_DEV void det_shfl_idx_n(T* v, int n, int src) {
  for (int i = 0; i < n; ++i) v[i] = __shfl_sync(0xffffffffu, v[i], src);
}
template <typename T>
DET_DEV void det_shfl_xor_n(T* v, int n, int mask) {
  for (int i = 0; i < n; ++i) v[i] = __shfl_xor_sync(0xffffffffu, v[i], mask);
}
// The warp's lanes whose p is true, bit i for lane i (every lane takes part); a count of a word's
// ones; an add to a shared-memory word that other threads of the block may add to at once.
DET_DEV uint32_t det_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
DET_DEV int det_popc(uint32_t x) { return __popc(x); }
DET_DEV void det_atomic_add_shared(int* p, int v) {  // a shared-memory reduction (never a generic atomic)
  asm volatile("red.shared.add.s32 [%0], %1;\n" ::"r"((unsigned)__cvta_generic_to_shared(p)), "r"(v) : "memory");
}
// In place, one value at a time: no second copy of v lives in registers.
template <typename T, class F>
DET_DEV void det_shfl_down_combine_n(T* v, int n, int delta, F f) {
  for (int i = 0; i < n; ++i) v[i] = f(v[i], __shfl_down_sync(0xffffffffu, v[i], delta));
}

DET_DEV det_vec_f32x4 det_load_f32x4(const float* p) { return *(const float4*)p; }
DET_DEV det_vec_f32x2 det_load_f32x2(const float* p) { return *(const float2*)p; }
template <typename T>
DET_DEV T det_ld(const T* p) { return *p; }
DET_DEV void det_work_fma(int) {}

DET_DEV uint64_t det_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

DET_DEV unsigned char* det_smem() {
  extern __shared__ __align__(16) unsigned char det_dynamic_smem[];
  return det_dynamic_smem;
}

// The grid barrier: word 0 counts arrivals, word 1 is the generation. The last block to arrive
// resets the count and bumps the generation; the others wait for the bump. Integer atomics only.
DET_DEV void det_sync_grid(unsigned int* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* gen = bar + 1;
    const unsigned int g = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == g) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

// The monotonic grid barrier: bar[0..1] is one 64-bit arrival count (8-byte aligned, zero before
// launch), never reset. Each block adds 1 (a reduction: nothing waits for its result) and waits
// until the count reaches `arrivals` (thread 0's: the grid times the barriers its block has passed,
// this one included): one atomic a block, where det_sync_grid's last arrival also resets the count
// and bumps the generation behind a fence before anyone may leave (an H200: 0.99 us against 1.82
// for 132 blocks, ../shared/gpu/2026-12-04-h200/sync_bench.md). The fences are det_sync_grid's
// first and last (megakernel/host/det_grid_barrier.h).
DET_DEV void det_sync_grid_counter(unsigned int* bar, unsigned long long arrivals) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* count = (unsigned long long*)bar;
    __threadfence();
    atomicAdd(count, 1ull);
    while (*(volatile unsigned long long*)count < arrivals) __nanosleep(20);
    __threadfence();
  }
  __syncthreads();
}

// Split attention's arrival count (docs/SPEC.md §14.2): each lane's writes (a unit's partial),
// fenced, come before lane 0's add, which the fence after it and the warp barrier order before the
// warp's later reads (as det_sync_grid's last fence and __syncthreads do for a block); the arrivals
// before this one, on every lane. det_grid_barrier.h writes the same in C++ atomics
// (det_arrival_impl: F4, the add, F5) for the emulation's threads mode and the litmus test.
DET_DEV unsigned int det_warp_arrive(unsigned int* count) {
  __threadfence();  // F4: release
  __syncwarp();
  unsigned int before = 0;
  if ((threadIdx.x & (DET_WARP - 1)) == 0) before = atomicAdd(count, 1u);
  before = __shfl_sync(0xffffffffu, before, 0);
  __threadfence();  // F5: acquire
  __syncwarp();     // lane 0's acquire before every lane's reads (a shuffle is not a synchronization in PTX's model)
  return before;
}

// A hint: the 128-byte line holding p into L2 (no value, no fault, no effect on any result).
DET_DEV void det_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

DET_DEV void det_cp_async16(void* smem_dst, const void* gmem_src) {
#if __CUDA_ARCH__ >= 800
  const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *(uint4*)smem_dst = __ldg((const uint4*)gmem_src);
#endif
}
DET_DEV void det_cp_async16_l2(void* smem_dst, const void* gmem_src) {
#if __CUDA_ARCH__ >= 800
  det_cp_async16(smem_dst, gmem_src);  // .cg: L2 only
#else
  *(uint4*)smem_dst = __ldcg((const uint4*)gmem_src);
#endif
}
DET_DEV void det_cp_async4(void* smem_dst, const void* gmem_src) {
#if __CUDA_ARCH__ >= 800
  const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *(uint32_t*)smem_dst = __ldg((const unsigned int*)gmem_src);
#endif
}
DET_DEV void det_cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
DET_DEV void det_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#else
// ================================ host emulation ==============================================
#include <string.h>

#define DET_DEV inline
#define DET_DEV_NOINLINE inline
#define DET_NO_UNROLL
#define DET_UNROLL
struct alignas(16) det_vec_u32x4 {
  uint32_t x, y, z, w;
};
struct alignas(16) det_vec_f32x4 {
  float x, y, z, w;
};
struct alignas(8) det_vec_f32x2 {
  float x, y;
};

// Implemented by the fiber runtime (megakernel/host/det_simt_host.cpp).
namespace det_simt_host {
int thread_idx();
int block_dim();
int block_idx();
int grid_dim();
unsigned char* smem();
uint64_t globaltimer();
void sync_block();
void sync_warp();
void sync_grid(unsigned int* bar, unsigned long long arrivals);  // arrivals 0: the generation barrier
unsigned int arrival(unsigned int* count);  // det_warp_arrive's lane 0 (det_grid_barrier.h's det_arrival)
// Warp exchange: every lane offers n words and receives those of lane src (DET_SHFL_IDX), lane +
// src (DET_SHFL_DOWN: a lane outside the warp reads its own) or lane ^ src (DET_SHFL_XOR), as
// __shfl_sync / __shfl_down_sync / __shfl_xor_sync do.
enum { DET_SHFL_IDX = 0, DET_SHFL_DOWN = 1, DET_SHFL_XOR = 2 };
void exchange(uint32_t* words, int n, int src, int mode);
uint32_t ballot(bool p);  // a rendezvous like exchange: bit i is lane i's p
// Deferred async copies (DET_SIMT_MODES=async): nonzero while a launch in that mode runs.
extern int deferred_async;
// The work profile: nonzero while a launch that counts runs (det_simt_host.h's WorkProfile).
extern int work_counting;
void work_load(const void* p, int bytes);
void work_fma(int n);
void cp_async(void* smem_dst, const void* gmem_src, int bytes);
void cp_async_commit();
void cp_async_wait(int n);
}  // namespace det_simt_host

DET_DEV int det_lane() { return det_simt_host::thread_idx() & (DET_WARP - 1); }
DET_DEV int det_warp() { return det_simt_host::thread_idx() / DET_WARP; }
DET_DEV int det_warps() { return det_simt_host::block_dim() / DET_WARP; }
DET_DEV int det_thread() { return det_simt_host::thread_idx(); }
DET_DEV int det_threads() { return det_simt_host::block_dim(); }
DET_DEV int det_block() { return det_simt_host::block_idx(); }
DET_DEV int det_blocks() { return det_simt_host::grid_dim(); }
DET_DEV void det_sync_block() { det_simt_host::sync_block(); }
DET_DEV void det_sync_warp() { det_simt_host::sync_warp(); }
DET_DEV void det_sync_grid(unsigned int* bar) { det_simt_host::sync_grid(bar, 0); }
DET_DEV void det_sync_grid_counter(unsigned int* bar, unsigned long long arrivals) {
  det_simt_host::sync_grid(bar, arrivals);
}
DET_DEV unsigned char* det_smem() { return det_simt_host::smem(); }
DET_DEV uint64_t det_globaltimer() { return det_simt_host::globaltimer(); }
DET_DEV bool det_simt_counting() { return __atomic_load_n(&det_simt_host::work_counting, __ATOMIC_RELAXED) != 0; }
DET_DEV det_vec_f32x4 det_load_f32x4(const float* p) {
  if (det_simt_counting()) det_simt_host::work_load(p, 16);
  det_vec_f32x4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
DET_DEV det_vec_f32x2 det_load_f32x2(const float* p) {
  if (det_simt_counting()) det_simt_host::work_load(p, 8);
  det_vec_f32x2 v;
  memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
DET_DEV T det_ld(const T* p) {
  if (det_simt_counting()) det_simt_host::work_load(p, (int)sizeof(T));
  return *p;
}
DET_DEV void det_work_fma(int n) {
  if (det_simt_counting()) det_simt_host::work_fma(n);
}

template <typename T>
DET_DEV void det_shfl_n(T* v, int n, int src, int mode) {
  static_assert(sizeof(T) == 4, "warp shuffles move 32-bit values");
  uint32_t w[128];
  for (int i = 0; i < n; ++i) memcpy(&w[i], &v[i], 4);
  det_simt_host::exchange(w, n, src, mode);
  for (int i = 0; i < n; ++i) memcpy(&v[i], &w[i], 4);
}
DET_DEV uint32_t det_ballot(bool p) { return det_simt_host::ballot(p); }
DET_DEV int det_popc(uint32_t x) { return __builtin_popcount(x); }
// A block's fibers run on one OS thread in every mode and switch only at a rendezvous: a plain add.
DET_DEV void det_atomic_add_shared(int* p, int v) { *p += v; }
template <typename T>
DET_DEV void det_shfl_down_n(T* v, int n, int delta) { det_shfl_n(v, n, delta, det_simt_host::DET_SHFL_DOWN); }
// As on the GPU: the warp meets (a fiber switch, which orders the lanes' writes under TSan), lane 0
// adds with det_grid_barrier.h's fences, and its result reaches every lane by an exchange.
DET_DEV unsigned int det_warp_arrive(unsigned int* count) {
  det_sync_warp();
  unsigned int before[1] = {0};
  if (det_lane() == 0) before[0] = det_simt_host::arrival(count);
  det_shfl_n(before, 1, 0, det_simt_host::DET_SHFL_IDX);
  return before[0];
}
template <typename T>
DET_DEV void det_shfl_idx_n(T* v, int n, int src) { det_shfl_n(v, n, src, det_simt_host::DET_SHFL_IDX); }
template <typename T>
DET_DEV void det_shfl_xor_n(T* v, int n, int mask) { det_shfl_n(v, n, mask, det_simt_host::DET_SHFL_XOR); }
// One exchange for all n values (one rendezvous instead of n).
template <typename T, class F>
DET_DEV void det_shfl_down_combine_n(T* v, int n, int delta, F f) {
  T other[128];
  for (int i = 0; i < n; ++i) other[i] = v[i];
  det_shfl_n(other, n, delta, det_simt_host::DET_SHFL_DOWN);
  for (int i = 0; i < n; ++i) v[i] = f(v[i], other[i]);
}

// By default a copy lands at once (weights are read-only for the whole launch). Under
// DET_SIMT_MODES=async it lands only at the wait_group that covers its group, as cp.async may;
// until then its destination holds NaN words (det_simt_host.cpp).
// DET_SIMT_TEST_WAIT_SLACK (a test build's negative control) makes every wait_group N wait as
// wait_group N + slack would: a kernel that waits for too few groups.
#ifndef DET_SIMT_TEST_WAIT_SLACK
#define DET_SIMT_TEST_WAIT_SLACK 0
#endif
DET_DEV void det_prefetch_l2(const void*) {}  // a hint only: nothing to emulate

DET_DEV bool det_simt_deferred_async() {
  return __atomic_load_n(&det_simt_host::deferred_async, __ATOMIC_RELAXED) != 0;
}
DET_DEV void det_cp_async16(void* smem_dst, const void* gmem_src) {
  if (det_simt_counting()) det_simt_host::work_load(gmem_src, 16);
  if (det_simt_deferred_async()) det_simt_host::cp_async(smem_dst, gmem_src, 16);
  else memcpy(smem_dst, gmem_src, 16);
}
DET_DEV void det_cp_async16_l2(void* smem_dst, const void* gmem_src) { det_cp_async16(smem_dst, gmem_src); }
DET_DEV void det_cp_async4(void* smem_dst, const void* gmem_src) {
  if (det_simt_counting()) det_simt_host::work_load(gmem_src, 4);
  if (det_simt_deferred_async()) det_simt_host::cp_async(smem_dst, gmem_src, 4);
  else memcpy(smem_dst, gmem_src, 4);
}
DET_DEV void det_cp_async_commit() {
  if (det_simt_deferred_async()) det_simt_host::cp_async_commit();
}
template <int N>
DET_DEV void det_cp_async_wait() {
  if (det_simt_deferred_async()) det_simt_host::cp_async_wait(N + DET_SIMT_TEST_WAIT_SLACK);
}

#endif
