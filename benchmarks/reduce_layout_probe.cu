// reduce_layout_probe.cu: what the two candidate orders for contract 2 (contract/det_reduce.h) cost
// a warp GEMV on the GPU, y[b][r] = dot(W[r], x[b]) with W bf16 (rows x K) and x fp32 (NB x K).
// Both orders use 32 accumulators (each from +0, fma chain in increasing k) and the tree
// s = 16, 8, 4, 2, 1; they differ in which columns accumulator j takes:
//   (a) lane blocks: in each 256-column block, accumulator l takes columns k0+8l .. k0+8l+7
//       (contract 2 as written: det_dot_bf16_ref);
//   (b) residues:    accumulator j takes every column k = j (mod 32).
// Kernels (each instantiated for NB = 1 and 16):
//   LANE_BLOCKS     (a) one warp per row; lane l loads its 16 bytes (8 bf16) of each 256-column
//                   block and runs 8 chained fmas per batch row. x is staged in shared memory with
//                   a 16-byte-chunk swizzle so the two LDS.128 per batch row are conflict free.
//   RES_SMEM        (b) one warp per row; the warp writes the 512-byte block to a per-warp shared
//                   buffer (lane l its 16 bytes, double-buffered: one __syncwarp per block), lane j
//                   reads its 8 bf16 at columns j, j+32, .., j+224.
//   RES_LDG16       (b) one warp per row; lane j loads its 8 bf16 straight from global memory
//                   (8 coalesced 2-byte loads, 64 bytes per warp instruction), no shared memory.
//   RES_4LANE       (b) a different mapping of the same order: 4 lanes per row, 8 rows per warp;
//                   lane q of a row holds accumulators 8q .. 8q+7 and loads 16 bytes at columns
//                   32m+8q .. 32m+8q+7, which are exactly its accumulators' next terms. The tree's
//                   steps s = 16, 8 are shuffles, s = 4, 2, 1 stay in the lane. (NB accumulators x 8
//                   per lane, so registers grow 8x with the batch.)
// Every kernel walks 512 bytes of weights per warp per loop iteration. Only _rn intrinsics are used;
// the build uses --fmad=false -ftz=false -prec-div=true -prec-sqrt=true.
// What it measures: reduce_layout_probe.sh compiles this for sm_90 and sm_80 and reports, per
// kernel, registers / spills (ptxas -v), LDL/STL in SASS, and the SASS instruction mix of the main
// loop per weight byte. The binary itself, run on a machine with a GPU, first checks every kernel
// bit for bit against a host reference of its own order (memcmp), then times it (median of 21).
// Run: bash benchmarks/reduce_layout_probe.sh   (add --run to also execute it on a GPU)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../contract/det_reduce.h"

enum Layout { LANE_BLOCKS = 0, RES_SMEM = 1, RES_LDG16 = 2, RES_4LANE = 3 };
static const char* kLayoutName[] = {"a_lane_blocks", "b_res_smem", "b_res_ldg16", "b_res_4lane"};

constexpr int kWarps = 8;  // warps per thread block

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

// Streaming 16-byte weight load (read once: keep it out of L1).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
// bf16 pair in one 32-bit word -> two fp32 (exact: the bf16 bits are the fp32 high half).
__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ void unpack8(uint4 w, float* f) {
  f[0] = bf_lo(w.x), f[1] = bf_hi(w.x), f[2] = bf_lo(w.y), f[3] = bf_hi(w.y);
  f[4] = bf_lo(w.z), f[5] = bf_hi(w.z), f[6] = bf_lo(w.w), f[7] = bf_hi(w.w);
}

// Stage x (NB x K fp32, K % 32 == 0, K <= kXStride) into shared memory, zero padded to a multiple
// of 256, with the fixed row stride kXStride (a compile-time stride makes every batch row's LDS an
// immediate offset, as in a kernel specialised per shape), one of three ways:
//   X_PLAIN  as is;
//   X_SWZ    16-byte chunk c of every 256-column block stored at chunk c ^ ((c >> 3) & 1): lane l
//            reads chunks 2l and 2l+1, and unswizzled, lanes l and l+4 of each 8-lane LDS.128 phase
//            would hit the same banks (2-way conflict);
//   X_PERM   each 256-column block transposed, position 8j + i holding column k0 + j + 32i, then
//            swizzled as X_SWZ: lane j of order (b) reads its 8 x values of a block with the same two
//            conflict-free LDS.128 as order (a) instead of 8 LDS.32 (done once per launch).
enum XStage { X_PLAIN, X_SWZ, X_PERM };
__host__ __device__ constexpr int padded(int K) { return (K + 255) / 256 * 256; }
constexpr int kXStride = 1536;  // floats per staged x row: the largest K probed

template <int NB>
__device__ void stage_x(float* xs, const float* __restrict__ x, int K, XStage mode) {
  const int Kp = padded(K);
  for (int e = threadIdx.x; e < NB * Kp; e += blockDim.x) {  // e: (batch row, padded column)
    const int b = e / Kp, p = e % Kp, k0 = p / 256 * 256, o = p % 256;
    const int src = k0 + (mode == X_PERM ? o / 8 + 32 * (o % 8) : o);
    const int c = o / 4, phys = mode == X_PLAIN ? o : 4 * (c ^ ((c >> 3) & 1)) + o % 4;
    xs[b * kXStride + k0 + phys] = src < K ? x[b * K + src] : 0.0f;
  }
  __syncthreads();
}

// Warp tree s = 16, 8, 4, 2, 1 (lane j adds lane j+s); lane 0 writes.
template <int NB>
__device__ __forceinline__ void tree_store(float* acc, float* __restrict__ y, int row, int rows, int lane) {
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[b] = __fadd_rn(acc[b], __shfl_down_sync(0xffffffffu, acc[b], s));
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < NB; ++b) y[(size_t)b * rows + row] = acc[b];
}

// ---- (a) lane blocks ------------------------------------------------------------------------
template <int NB>
__device__ __forceinline__ void lb_step(float* acc, uint4 w, const float4* xb, int K4, int o0, int o1) {
  float f[8];
  unpack8(w, f);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const float4 p = xb[b * K4 + o0], q = xb[b * K4 + o1];
    float a = acc[b];
    a = __fmaf_rn(f[0], p.x, a), a = __fmaf_rn(f[1], p.y, a), a = __fmaf_rn(f[2], p.z, a);
    a = __fmaf_rn(f[3], p.w, a), a = __fmaf_rn(f[4], q.x, a), a = __fmaf_rn(f[5], q.y, a);
    a = __fmaf_rn(f[6], q.z, a), a = __fmaf_rn(f[7], q.w, a);
    acc[b] = a;
  }
}

template <int NB>
__global__ void __launch_bounds__(kWarps * 32) gemv_lane_blocks(const uint16_t* __restrict__ W,
                                                              const float* __restrict__ x,
                                                              float* __restrict__ y, int rows, int K) {
  extern __shared__ float4 xs4[];
  stage_x<NB>(reinterpret_cast<float*>(xs4), x, K, X_SWZ);
  const int lane = threadIdx.x & 31, row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  constexpr int K4 = kXStride / 4;
  const int o0 = (2 * lane) ^ ((lane >> 2) & 1), o1 = o0 ^ 1;  // swizzled chunks
  const uint4* w4 = reinterpret_cast<const uint4*>(W + (size_t)row * K) + lane;
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
  const int nfull = K / 256;
#pragma unroll 1
  for (int kb = 0; kb < nfull; ++kb) lb_step<NB>(acc, ld_stream(w4 + kb * 32), xs4 + kb * 64, K4, o0, o1);
  // Last block of rem < 256 columns: accumulators 0 .. rem/8 - 1 take 8 terms each.
  if (8 * lane < K - nfull * 256) lb_step<NB>(acc, ld_stream(w4 + nfull * 32), xs4 + nfull * 64, K4, o0, o1);
  tree_store<NB>(acc, y, row, rows, lane);
}

// ---- (b) residues, block through a per-warp shared buffer -----------------------------------
// n (<= 8) steps of order (b) for one lane: wf[i] is its weight at column k0 + lane + 32i, and the
// X_PERM block xb holds the matching x values in its chunks o0, o1.
template <int NB>
__device__ __forceinline__ void res_step(float* acc, const float* wf, const float4* xb, int K4, int o0, int o1, int n) {
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const float4 p = xb[b * K4 + o0], q = xb[b * K4 + o1];
    const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
    float a = acc[b];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) a = __fmaf_rn(wf[i], xv[i], a);
    acc[b] = a;
  }
}

template <int NB>
__global__ void __launch_bounds__(kWarps * 32) gemv_res_smem(const uint16_t* __restrict__ W,
                                                           const float* __restrict__ x,
                                                           float* __restrict__ y, int rows, int K) {
  extern __shared__ float4 xs4[];
  __shared__ uint4 wst[kWarps][2][32];  // per warp, double-buffered 512-byte block
  stage_x<NB>(reinterpret_cast<float*>(xs4), x, K, X_PERM);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row = blockIdx.x * kWarps + warp;
  if (row >= rows) return;
  constexpr int K4 = kXStride / 4;
  const int o0 = (2 * lane) ^ ((lane >> 2) & 1), o1 = o0 ^ 1;  // swizzled chunks
  const uint4* w4 = reinterpret_cast<const uint4*>(W + (size_t)row * K) + lane;
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
  const int nfull = K / 256, rem = K - nfull * 256;
  // One block of n 32-column steps: stage (lanes 0 .. 4n-1 own its 16n bf16), read transposed.
  auto block = [&](int kb, int n, float* wf) {
    uint4* buf = wst[warp][kb & 1];
    if (8 * lane < 32 * n) buf[lane] = ld_stream(w4 + kb * 32);
    __syncwarp();  // double buffer: the reads of block kb-2 precede the previous __syncwarp
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(buf);
#pragma unroll
    for (int i = 0; i < 8; ++i) wf[i] = i < n ? __uint_as_float((uint32_t)ws[lane + 32 * i] << 16) : 0.0f;
  };
#pragma unroll 1
  for (int kb = 0; kb < nfull; ++kb) {
    float wf[8];
    block(kb, 8, wf);
    res_step<NB>(acc, wf, xs4 + kb * 64, K4, o0, o1, 8);
  }
  if (rem) {  // last block: accumulators j take rem/32 terms each
    float wf[8];
    block(nfull, rem / 32, wf);
    res_step<NB>(acc, wf, xs4 + nfull * 64, K4, o0, o1, rem / 32);
  }
  tree_store<NB>(acc, y, row, rows, lane);
}

// ---- (b) residues, 2-byte loads straight from global ----------------------------------------
template <int NB>
__global__ void __launch_bounds__(kWarps * 32) gemv_res_ldg16(const uint16_t* __restrict__ W,
                                                            const float* __restrict__ x,
                                                            float* __restrict__ y, int rows, int K) {
  extern __shared__ float4 xs4[];
  stage_x<NB>(reinterpret_cast<float*>(xs4), x, K, X_PERM);
  const int lane = threadIdx.x & 31, row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  constexpr int K4 = kXStride / 4;
  const int o0 = (2 * lane) ^ ((lane >> 2) & 1), o1 = o0 ^ 1;  // swizzled chunks
  const unsigned short* wr = W + (size_t)row * K + lane;
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = 0.0f;
  const int nfull = K / 256, rem = K - nfull * 256;
  auto block = [&](int kb, int n, float (&wf)[8]) {  // the lane's first n residues of block kb
#pragma unroll
    for (int i = 0; i < 8; ++i) wf[i] = i < n ? __uint_as_float((uint32_t)__ldcs(wr + kb * 256 + 32 * i) << 16) : 0.0f;
  };
#pragma unroll 1
  for (int kb = 0; kb < nfull; ++kb) {
    float wf[8];
    block(kb, 8, wf);
    res_step<NB>(acc, wf, xs4 + kb * 64, K4, o0, o1, 8);
  }
  if (rem) {
    float wf[8];
    block(nfull, rem / 32, wf);
    res_step<NB>(acc, wf, xs4 + nfull * 64, K4, o0, o1, rem / 32);
  }
  tree_store<NB>(acc, y, row, rows, lane);
}

// ---- (b) residues, 4 lanes x 8 accumulators per row -----------------------------------------
template <int NB>
__global__ void __launch_bounds__(kWarps * 32) gemv_res_4lane(const uint16_t* __restrict__ W,
                                                            const float* __restrict__ x,
                                                            float* __restrict__ y, int rows, int K) {
  extern __shared__ float4 xs4[];
  stage_x<NB>(reinterpret_cast<float*>(xs4), x, K, X_PLAIN);
  const int lane = threadIdx.x & 31, q = lane & 3;
  const int row = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * 8 + (lane >> 2);
  if (row >= rows) return;  // rows % 8 == 0: whole warps exit together
  constexpr int K4 = kXStride / 4;
  const uint4* w4 = reinterpret_cast<const uint4*>(W + (size_t)row * K) + q;
  float acc[NB][8];  // acc[b][t] is accumulator 8q + t
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int t = 0; t < 8; ++t) acc[b][t] = 0.0f;
#pragma unroll 1
  for (int m = 0; m < K / 32; ++m) {  // columns 32m .. 32m+31: one term for each accumulator
    float f[8];
    unpack8(ld_stream(w4 + 4 * m), f);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float4 p = xs4[b * K4 + 8 * m + 2 * q], r = xs4[b * K4 + 8 * m + 2 * q + 1];
      acc[b][0] = __fmaf_rn(f[0], p.x, acc[b][0]), acc[b][1] = __fmaf_rn(f[1], p.y, acc[b][1]);
      acc[b][2] = __fmaf_rn(f[2], p.z, acc[b][2]), acc[b][3] = __fmaf_rn(f[3], p.w, acc[b][3]);
      acc[b][4] = __fmaf_rn(f[4], r.x, acc[b][4]), acc[b][5] = __fmaf_rn(f[5], r.y, acc[b][5]);
      acc[b][6] = __fmaf_rn(f[6], r.z, acc[b][6]), acc[b][7] = __fmaf_rn(f[7], r.w, acc[b][7]);
    }
  }
  // Tree: s = 16 (lane q += lane q+2), s = 8 (q += q+1), then s = 4, 2, 1 inside lane q = 0.
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int d = 2; d >= 1; d >>= 1)
#pragma unroll
      for (int t = 0; t < 8; ++t) acc[b][t] = __fadd_rn(acc[b][t], __shfl_down_sync(0xffffffffu, acc[b][t], d));
#pragma unroll
    for (int s = 4; s >= 1; s >>= 1)
#pragma unroll
      for (int t = 0; t < s; ++t) acc[b][t] = __fadd_rn(acc[b][t], acc[b][t + s]);
    if (q == 0) y[(size_t)b * rows + row] = acc[b][0];
  }
}

// ---- host --------------------------------------------------------------------------------------
typedef void (*Kern)(const uint16_t*, const float*, float*, int, int);
template <int NB>
static Kern kernel_of(int layout) {
  switch (layout) {
    case LANE_BLOCKS: return gemv_lane_blocks<NB>;
    case RES_SMEM: return gemv_res_smem<NB>;
    case RES_LDG16: return gemv_res_ldg16<NB>;
    default: return gemv_res_4lane<NB>;
  }
}

// Host reference of order (b): accumulator j takes k = j (mod 32) in increasing k, then the tree.
static float dot_residues_ref(const uint16_t* w, const float* x, long long K) {
  float acc[32];
  for (int j = 0; j < 32; ++j) acc[j] = 0.0f;
  for (long long k = 0; k < K; ++k) acc[k % 32] = det_fma_f32(det_bf16_to_f32(w[k]), x[k], acc[k % 32]);
  return det_reduce_tree_f32(acc);
}

static uint32_t rng_state = 12345u;
static uint32_t rng() { return rng_state = rng_state * 1664525u + 1013904223u; }
static float rnd() { return (int32_t)rng() * (1.0f / 2147483648.0f); }  // [-1, 1)

template <int NB>
static void run_one(int layout, int K, int rows_check, int rows_time) {
  const Kern kern = kernel_of<NB>(layout);
  const size_t smem = (size_t)NB * kXStride * sizeof(float);
  CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int rows_per_block = layout == RES_4LANE ? kWarps * 8 : kWarps;
  std::vector<uint16_t> hW((size_t)rows_time * K);
  std::vector<float> hx((size_t)NB * K);
  for (auto& v : hW) v = det_f32_to_bf16(rnd());
  for (auto& v : hx) v = rnd();
  uint16_t* dW;
  float *dx, *dy;
  CHECK(cudaMalloc(&dW, hW.size() * 2));
  CHECK(cudaMalloc(&dx, hx.size() * 4));
  CHECK(cudaMalloc(&dy, (size_t)NB * rows_time * 4));
  CHECK(cudaMemcpy(dW, hW.data(), hW.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  // 1. bit-exact check on the first rows_check rows against the host reference of this order.
  kern<<<rows_check / rows_per_block, kWarps * 32, smem>>>(dW, dx, dy, rows_check, K);
  CHECK(cudaGetLastError());
  std::vector<float> got((size_t)NB * rows_check), want((size_t)NB * rows_check);
  CHECK(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < rows_check; ++r) {
      const uint16_t* w = &hW[(size_t)r * K];
      const float* xb = &hx[(size_t)b * K];
      want[(size_t)b * rows_check + r] = layout == LANE_BLOCKS ? det_dot_bf16_ref(w, xb, K) : dot_residues_ref(w, xb, K);
    }
  const bool ok = memcmp(got.data(), want.data(), got.size() * 4) == 0;
  // 2. time over rows_time rows (weights far beyond L2), median of 21 launches.
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int rep = 0; rep < 22; ++rep) {
    CHECK(cudaEventRecord(e0));
    kern<<<rows_time / rows_per_block, kWarps * 32, smem>>>(dW, dx, dy, rows_time, K);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (rep) ms.push_back(t);  // first launch is warm-up
  }
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2] * 1e-3;
  printf("| %-13s | %2d | %5d | %-4s | %8.3f | %7.1f | %7.1f |\n", kLayoutName[layout], NB, K, ok ? "ok" : "FAIL",
         t * 1e6, (double)rows_time * K * 2 / t / 1e9, 2.0 * NB * rows_time * K / t / 1e9);
  CHECK(cudaFree(dW));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: kernels compiled only (see the SASS report)\n");
    return 0;
  }
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("%s\n| kernel        | NB |     K | bits | time us  | W GB/s  | GFLOP/s |\n", p.name);
  printf("|---|---|---|---|---|---|---|\n");
  for (int K : {576, 1536})
    for (int layout = 0; layout < 4; ++layout) {
      const int rows_time = (int)((256ll << 20) / (2ll * K)) / 64 * 64;  // 256 MiB of weights
      run_one<1>(layout, K, 512, rows_time);
      run_one<16>(layout, K, 512, rows_time);
    }
  return 0;
}
