// det_simt_host.h: launching device code on the host, one fiber per CUDA thread
// (det_simt_host.cpp). The device side of the layer is megakernel/det_simt.h.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace det_simt_host {

// Runs kernel(arg) as a grid of `grid` blocks of `block` threads (a multiple of 32) with
// smem_bytes of zeroed shared memory per block, on the calling OS thread. Fibers run until they
// synchronize; the next runnable fiber is chosen by a generator seeded with `seed` (0: a fixed
// order), so every run with one seed is the same schedule and different seeds interleave the
// threads differently. Returns 0, or -1 when a synchronization can never complete (a deadlock:
// some thread of the scope did not arrive) or stacks could not be allocated.
// DET_SIMT_MODES, read at each launch, makes it stricter (det_simt_host.cpp): async (cp.async
// deferred to its wait_group), smem (exactly sized, NaN-filled shared memory), threads (an OS
// thread per block and the GPU's atomic grid barrier), strict (all three).
int launch(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg);

// What each warp did in each phase of a launch (a phase: the work between two grid
// synchronizations, as each thread passes them), counted when a launch is given one.
enum WorkKind { kGlobalBytes, kSharedBytes, kLoads, kFmas, kWorkKinds };
struct WorkProfile {
  int64_t phases_cap = 0;        // phases kept (later work is not counted)
  int64_t* counts = nullptr;     // (phases_cap, grid * warps, kWorkKinds), zeroed by the caller
};
// launch() with the work profile on (one launch at a time in the process).
int launch_counted(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg,
                   WorkProfile* work);

}  // namespace det_simt_host
