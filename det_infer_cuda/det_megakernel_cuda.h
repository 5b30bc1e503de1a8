// det_megakernel_cuda.h: launching the megakernel on a GPU (det_megakernel.cu).
#pragma once

#include "../megakernel/det_megakernel.h"

// Fills the geometry's zero fields for this device (grid: every block resident, warps: 8,
// ring: 4, tile_rows: the largest of 16, 8, 4, 2, 1 whose shared memory fits, area_rows: the most
// of an asked-for tile's rows that fit; det_mk_plan_geometry
// with the device's and the kernel's figures) and checks the rest against the device's limits
// (co-residency of the grid, shared memory per block), the runtime's occupancy calculator last.
int det_mk_cuda_resolve(const det_llama_model* m, det_mk_geometry* g, int device, const char** why);

// One cooperative launch of the program on `stream` (a cudaStream_t). The params hold device
// pointers; the geometry must have been resolved. Asynchronous: returns after the launch.
int det_mk_cuda_launch(const det_mk_params* p, void* stream, const char** why);
