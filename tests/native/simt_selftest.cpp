// simt_selftest.cpp: the SIMT emulation must be able to expose a missing barrier. A two-phase
// kernel (each thread writes a value, then reads another warp's) runs under 8 fiber schedules with
// and without the barrier between the phases; prints the number of distinct results of each, then
// "deadlock" if a kernel whose thread 0 skips a block barrier is reported instead of hanging.
#include <stdio.h>

#include <set>
#include <vector>

#include "det_infer_cpu/emu/det_simt_host.h"
#include "megakernel/det_simt.h"

namespace {

struct Args {
  std::vector<unsigned> data, out;
  bool barrier;
};

void two_phase(void* p) {
  Args& a = *(Args*)p;
  const int n = det_threads() * det_blocks(), g = det_block() * det_threads() + det_thread();
  a.data[g] = 1000u + (unsigned)g * 7u;
  if (a.barrier) det_sync_grid(nullptr);
  a.out[g] = a.data[(g + 37) % n];
}

void skips_barrier(void*) {
  if (det_thread() != 0) det_sync_block();
}

size_t distinct_results(bool barrier) {
  std::set<std::vector<unsigned>> seen;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Args a{std::vector<unsigned>(3 * 64), std::vector<unsigned>(3 * 64), barrier};
    if (det_simt_host::launch(3, 64, 0, seed, two_phase, &a) != 0) return 0;
    seen.insert(a.out);
  }
  return seen.size();
}

}  // namespace

int main() {
  printf("%zu %zu %s\n", distinct_results(true), distinct_results(false),
         det_simt_host::launch(1, 32, 0, 1, skips_barrier, nullptr) != 0 ? "deadlock" : "no-deadlock");
  return 0;
}
