// det_megakernel_emu.cpp: the megakernel's device code (megakernel/det_megakernel.cuh), compiled
// for the host and run under the SIMT emulation, one fiber per CUDA thread. This is how every line
// of the GPU path is executed on machines without a GPU (docs/SPEC.md §14.4).
#include "../det_megakernel.cuh"
#include "../../det_infer_cpu/det_fpenv.h"
#include "det_simt_host.h"

namespace {

void kernel_entry(void* arg) { det_mk_run(*(const det_mk_params*)arg); }

}  // namespace

namespace {

int run(const det_mk_params* p, det_simt_host::WorkProfile* work) {
  int rc = det_mk_check_model(&p->model, nullptr);
  if (rc == DET_MK_OK) rc = det_mk_check_geometry(&p->geo, nullptr);
  if (rc != DET_MK_OK) return rc;
  det_fpenv_guard env;  // every fiber starts from this thread's (IEEE) environment
  const size_t smem = det_mk_smem_bytes(&p->model, &p->geo);
  p->ws.barrier[0] = p->ws.barrier[1] = 0;
  const int block = p->geo.warps * DET_WARP;
  const int ok = work ? det_simt_host::launch_counted(p->geo.grid, block, smem, p->geo.seed, kernel_entry, (void*)p, work)
                      : det_simt_host::launch(p->geo.grid, block, smem, p->geo.seed, kernel_entry, (void*)p);
  return ok == 0 ? DET_MK_OK : DET_MK_ERR_DEADLOCK;
}

}  // namespace

int det_mk_run_emulated(const det_mk_params* p) { return run(p, nullptr); }

int det_mk_run_emulated_counted(const det_mk_params* p, int64_t* work, int64_t phases) {
  det_simt_host::WorkProfile w;
  w.counts = work;
  w.phases_cap = phases;
  return run(p, &w);
}
