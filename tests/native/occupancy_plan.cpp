// occupancy_plan.cpp: the megakernel's launch planning (det_mk_plan_geometry and
// det_mk_blocks_per_sm, megakernel/det_megakernel_plan.cpp) run on devices described on stdin,
// beside NVIDIA's occupancy calculator (cuda_occupancy.h, header-only host code of the CUDA
// toolkit). tests/test_cuda_compile.py builds it with the host compiler and feeds it every
// architecture's limits; no GPU is involved.
//
// Input, one request per line:
//   D cc_major cc_minor sm_count max_threads_per_sm max_blocks_per_sm regs_per_sm regs_per_block
//     smem_per_sm smem_per_block smem_per_block_optin smem_reserved kernel_regs kernel_max_threads
//     kernel_static_smem                         the device (and compiled kernel) of the lines below
//   P hidden head_dim grid warps ring tile_rows area_rows outs attn stage
//                                                plan a geometry (0: the planner's choice)
//   O threads dyn_smem                           blocks per SM of one launch shape
// Output, one line per P:  rc grid warps ring tile_rows area_rows stage smem ours nvidia | why
//                          (smem: of the geometry as filled in, refused or not)
//                 per O:   ours nvidia
// where ours is det_mk_blocks_per_sm and nvidia cudaOccMaxActiveBlocksPerMultiprocessor (with the
// opt-in dynamic shared memory limit the launcher sets); both are -1 for a refused plan.
#include <cuda_occupancy.h>
#include <stdio.h>
#include <string.h>

#include "../../megakernel/det_megakernel.h"

namespace {

cudaOccDeviceProp occ_prop;
cudaOccFuncAttributes occ_attr;
det_mk_device dev;

int nvidia_blocks_per_sm(int threads, size_t dyn_smem) {
  cudaOccResult result;
  cudaOccDeviceState state;  // default cache and carveout preferences, as the launcher leaves them
  if (cudaOccMaxActiveBlocksPerMultiprocessor(&result, &occ_prop, &occ_attr, &state, threads, dyn_smem) !=
      CUDA_OCC_SUCCESS)
    return -2;
  return result.activeBlocksPerMultiprocessor;
}

}  // namespace

int main() {
  char kind[4];
  while (scanf("%3s", kind) == 1) {
    if (!strcmp(kind, "D")) {
      long v[14];
      for (long& x : v)
        if (scanf("%ld", &x) != 1) return 2;
      occ_prop.computeMajor = (int)v[0];
      occ_prop.computeMinor = (int)v[1];
      occ_prop.numSms = (int)v[2];
      occ_prop.maxThreadsPerMultiprocessor = (int)v[3];
      occ_prop.maxThreadsPerBlock = 1024;
      occ_prop.regsPerMultiprocessor = (int)v[5];
      occ_prop.regsPerBlock = (int)v[6];
      occ_prop.warpSize = 32;
      occ_prop.sharedMemPerMultiprocessor = (size_t)v[7];
      occ_prop.sharedMemPerBlock = (size_t)v[8];
      occ_prop.sharedMemPerBlockOptin = (size_t)v[9];
      occ_prop.reservedSharedMemPerBlock = (size_t)v[10];
      dev = {.cc_major = (int)v[0], .sm_count = (int)v[2], .max_threads_per_sm = (int)v[3],
             .max_blocks_per_sm = (int)v[4], .regs_per_sm = (int)v[5], .regs_per_block = (int)v[6],
             .smem_per_sm = (size_t)v[7], .smem_per_block_optin = (size_t)v[9],
             .smem_reserved_per_block = (size_t)v[10], .kernel_regs = (int)v[11],
             .kernel_max_threads = (int)v[12], .kernel_static_smem = (size_t)v[13]};
      // The kernel as cudaFuncGetAttributes reports it, after the launcher's
      // cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, opt-in maximum).
      occ_attr.maxThreadsPerBlock = (int)v[12];
      occ_attr.numRegs = (int)v[11];
      occ_attr.sharedSizeBytes = (size_t)v[13];
      occ_attr.partitionedGCConfig = PARTITIONED_GC_OFF;
      occ_attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
      occ_attr.maxDynamicSharedSizeBytes = (size_t)v[9] - (size_t)v[13];
      occ_attr.numBlockBarriers = 1;
      occ_attr.virtualResourceCount = 0;
    } else if (!strcmp(kind, "P")) {
      long hidden, head_dim;
      det_mk_geometry g{};
      if (scanf("%ld %ld %d %d %d %d %d %d %d %d", &hidden, &head_dim, &g.grid, &g.warps, &g.ring, &g.tile_rows,
                &g.area_rows, &g.outs, &g.attn, &g.stage) != 10)
        return 2;
      det_llama_model m{};
      m.hidden = hidden;
      m.head_dim = head_dim;
      const char* why = "";
      const int rc = det_mk_plan_geometry(&m, &g, &dev, &why);
      const bool filled = g.warps > 0 && g.ring > 0 && g.tile_rows > 0;
      const size_t smem = filled ? det_mk_smem_bytes(&m, &g) : 0;
      const int ours = rc == DET_MK_OK ? det_mk_blocks_per_sm(&dev, g.warps * 32, smem) : -1;
      const int nvidia = rc == DET_MK_OK ? nvidia_blocks_per_sm(g.warps * 32, smem) : -1;
      printf("%d %d %d %d %d %d %d %zu %d %d | %s\n", rc, g.grid, g.warps, g.ring, g.tile_rows, g.area_rows, g.stage,
             smem, ours, nvidia, rc == DET_MK_OK ? "" : why);
    } else if (!strcmp(kind, "O")) {
      int threads;
      size_t dyn;
      if (scanf("%d %zu", &threads, &dyn) != 2) return 2;
      printf("%d %d\n", det_mk_blocks_per_sm(&dev, threads, dyn), nvidia_blocks_per_sm(threads, dyn));
    } else {
      return 2;
    }
  }
  return 0;
}
