// det_megakernel.cu: the megakernel on the GPU: the __global__ entry around det_mk_run
// (megakernel/det_megakernel.cuh), the choice of geometry, and the cooperative launch (all blocks
// resident, which the grid barrier needs; the launch fails instead of hanging when they cannot be).
#include <cuda_runtime.h>

#include "../megakernel/det_megakernel.cuh"
#include "det_megakernel_cuda.h"

// 256 threads at most per block (8 warps): a lane's batch accumulators (one per row, 16 at most) stay
// in registers (docs/RESULTS.md reports registers and spills per architecture).
#define DET_MK_MAX_THREADS 256

// __grid_constant__: the phases take the parameters by reference without a local copy.
__global__ void __launch_bounds__(DET_MK_MAX_THREADS) det_mk_kernel(const __grid_constant__ det_mk_params p) {
  det_mk_run(p);
}

namespace {

int fail(const char** why, int code, const char* text) {
  (void)cudaGetLastError();  // a failed CUDA call must not surface later in an unrelated op
  if (why) *why = text;
  return code;
}


}  // namespace

int det_mk_cuda_resolve(const det_llama_model* m, det_mk_geometry* g, int device, const char** why) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return fail(why, DET_MK_ERR_LAUNCH, "cudaGetDeviceProperties failed");
  if (!prop.cooperativeLaunch) return fail(why, DET_MK_ERR_LAUNCH, "the device does not support cooperative launch");
  const void* k = (const void*)&det_mk_kernel;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, k) != cudaSuccess) return fail(why, DET_MK_ERR_LAUNCH, "cudaFuncGetAttributes failed");
  // The planner (megakernel/det_megakernel_plan.cpp) chooses and checks the geometry from these
  // figures; tests/test_cuda_compile.py runs it offline for every architecture.
  det_mk_device d;
  d.cc_major = prop.major;
  d.sm_count = prop.multiProcessorCount;
  d.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  d.max_blocks_per_sm = prop.maxBlocksPerMultiProcessor;
  d.regs_per_sm = prop.regsPerMultiprocessor;
  d.regs_per_block = prop.regsPerBlock;
  d.smem_per_sm = prop.sharedMemPerMultiprocessor;
  d.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  d.smem_reserved_per_block = prop.reservedSharedMemPerBlock;
  d.kernel_regs = attr.numRegs;
  d.kernel_max_threads = attr.maxThreadsPerBlock < DET_MK_MAX_THREADS ? attr.maxThreadsPerBlock : DET_MK_MAX_THREADS;
  d.kernel_static_smem = attr.sharedSizeBytes;
  const bool grid_auto = g->grid == 0;
  const int rc = det_mk_plan_geometry(m, g, &d, why);
  if (rc != DET_MK_OK) return rc;
  // Always the device's maximum: the setting is per function, shared by every model and thread.
  const size_t smem_max = d.smem_per_block_optin - d.kernel_static_smem;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_max) != cudaSuccess)
    return fail(why, DET_MK_ERR_LAUNCH, "cudaFuncSetAttribute failed");
  // The runtime's own calculator has the last word on co-residency.
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, g->warps * 32, det_mk_smem_bytes(m, g)) != cudaSuccess ||
      per_sm < 1)
    return fail(why, DET_MK_ERR_LAUNCH, "no block of this geometry fits on a multiprocessor");
  const int resident = per_sm * prop.multiProcessorCount;
  if (grid_auto && g->grid > resident) g->grid = resident;
  if (g->grid > resident) return fail(why, DET_MK_ERR_GEOMETRY, "grid exceeds the blocks that can be resident at once");
  return DET_MK_OK;
}

int det_mk_cuda_launch(const det_mk_params* p, void* stream, const char** why) {
  // The model and program were checked on the host (det_mk_check_model reads the layer table,
  // which here is a device pointer).
  const int rc = det_mk_check_geometry(&p->geo, why);
  if (rc != DET_MK_OK) return rc;
  cudaStream_t s = (cudaStream_t)stream;
  if (cudaMemsetAsync(p->ws.barrier, 0, 2 * sizeof(unsigned int), s) != cudaSuccess)
    return fail(why, DET_MK_ERR_LAUNCH, "cudaMemsetAsync of the grid barrier failed");
  void* args[] = {(void*)p};
  const size_t smem = det_mk_smem_bytes(&p->model, &p->geo);
  cudaError_t e = cudaLaunchCooperativeKernel((const void*)&det_mk_kernel, dim3(p->geo.grid), dim3(p->geo.warps * 32),
                                              args, smem, s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return DET_MK_ERR_LAUNCH;
  }
  return DET_MK_OK;
}
