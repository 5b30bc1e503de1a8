// simt_selftest.cpp: the SIMT emulation must be able to expose a missing barrier. A two-phase
// kernel (each thread writes a value, then reads another warp's) runs under 8 fiber schedules with
// and without the barrier between the phases; prints the number of distinct results of each, then
// "deadlock" if a kernel whose thread 0 skips a block barrier is reported instead of hanging.
//
// With an argument, one of the negative controls of the stricter modes (DET_SIMT_MODES, set by the
// caller; tests/test_emulation_modes.py):
//   ring DEPTH SLACK   a weight ring as det_mk_gemv streams it (cp.async 16 bytes per lane, DEPTH
//                      stages, wait_group DEPTH - 1 + SLACK): prints "ring ok" or "ring mismatch"
//   overrun            reads the byte just past the block's shared memory: prints "overrun read"
//   unwritten          reads shared memory no thread wrote: prints "unwritten zero" or "unwritten nan"
//   grid SEEDS         the two-phase kernel across 3 blocks with its grid barrier, SEEDS schedules:
//                      prints "grid ok" when every thread read what the other block wrote
//   tree               det_mk_warp_tree_rows against det_mk_warp_tree for 1..32 rows of hostile
//                      values (NaNs, infinities, signed zeros, subnormals): prints "tree ok" when
//                      every row's result has the plain tree's bits (any NaN equal to any NaN)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <set>
#include <vector>

#include "megakernel/host/det_simt_host.h"
#include "megakernel/det_simt.h"
#include "megakernel/det_mk_warp.cuh"

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

// ---- negative controls of the stricter modes --------------------------------------------------
struct Ring {
  std::vector<float> src, out;
  int depth, slack;
};
constexpr int kRingSteps = 12;

// Each lane streams kRingSteps 16-byte chunks through its slots of the warp's ring, as det_mk_gemv
// does, and sums them; with slack 1 it waits for one group too few.
template <int Wait>
void ring_stream(Ring& a) {
  const int lane = det_lane(), gw = det_block() * det_warps() + det_warp(), depth = a.depth;
  det_vec_u32x4* ring = (det_vec_u32x4*)det_smem() + det_warp() * depth * DET_WARP;
  const float* src = a.src.data() + (size_t)gw * kRingSteps * DET_WARP * 4;
  int issued = 0;
  auto issue = [&]() {
    if (issued < kRingSteps)
      det_cp_async16(&ring[(issued % depth) * DET_WARP + lane], src + (issued * DET_WARP + lane) * 4);
    ++issued;
    det_cp_async_commit();
  };
  for (int f = 0; f < depth - 1; ++f) issue();
  float acc = 0.0f;
  for (int f = 0; f < kRingSteps; ++f) {
    issue();
    det_cp_async_wait<Wait>();
    det_vec_f32x4 v;
    memcpy(&v, &ring[(f % depth) * DET_WARP + lane], sizeof v);
    acc = acc + v.x + v.y + v.z + v.w;
  }
  a.out[(size_t)gw * DET_WARP + lane] = acc;
}

void ring_kernel(void* p) {
  Ring& a = *(Ring*)p;
  const int w = a.depth - 1 + a.slack;
  if (w == 1) ring_stream<1>(a);
  else if (w == 2) ring_stream<2>(a);
  else if (w == 3) ring_stream<3>(a);
  else ring_stream<4>(a);
}

bool ring_ok(int depth, int slack) {
  const int grid = 2, block = 64, warps = grid * block / DET_WARP;
  Ring a{std::vector<float>((size_t)warps * kRingSteps * DET_WARP * 4), std::vector<float>(grid * block), depth, slack};
  for (size_t i = 0; i < a.src.size(); ++i) a.src[i] = (float)(i % 97) * 0.25f;
  const size_t smem = (size_t)(block / DET_WARP) * depth * DET_WARP * 16;
  if (det_simt_host::launch(grid, block, smem, 3, ring_kernel, &a) != 0) return false;
  for (int gw = 0; gw < warps; ++gw)
    for (int lane = 0; lane < DET_WARP; ++lane) {
      float want = 0.0f;
      for (int f = 0; f < kRingSteps; ++f)
        for (int i = 0; i < 4; ++i) want = want + a.src[(((size_t)gw * kRingSteps + f) * DET_WARP + lane) * 4 + i];
      if (a.out[(size_t)gw * DET_WARP + lane] != want) return false;
    }
  return true;
}

struct Smem {
  size_t bytes;
  std::vector<unsigned> seen;
};

void overrun_kernel(void* p) {
  Smem& a = *(Smem*)p;
  if (det_thread() == 0) a.seen[det_block()] = ((volatile unsigned char*)det_smem())[a.bytes];
  det_sync_block();
}

void unwritten_kernel(void* p) {
  Smem& a = *(Smem*)p;
  float v;
  memcpy(&v, det_smem() + 4 * det_thread(), 4);
  a.seen[det_block() * det_threads() + det_thread()] = isnan(v) ? 2u : v == 0.0f ? 0u : 1u;
}

bool grid_ok(int seeds) {
  for (uint64_t seed = 1; seed <= (uint64_t)seeds; ++seed) {
    Args a{std::vector<unsigned>(3 * 64), std::vector<unsigned>(3 * 64), true};
    if (det_simt_host::launch(3, 64, 0, seed, two_phase, &a) != 0) return false;
    for (int g = 0; g < 3 * 64; ++g)
      if (a.out[g] != 1000u + (unsigned)((g + 37) % (3 * 64)) * 7u) return false;
  }
  return true;
}

}  // namespace

// One warp: rows of hostile values reduced by the plain tree and by the spread one.
struct TreeArgs {
  std::vector<uint32_t> in;  // (32 lanes, 32 rows) bit patterns
  int mismatches = 0, checked = 0;
};

template <int NB>
void tree_rows(TreeArgs& a) {
  float plain[NB], spread[NB];
  for (int b = 0; b < NB; ++b) memcpy(&plain[b], &a.in[det_lane() * 32 + b], 4);
  memcpy(spread, plain, sizeof plain);
  det_mk_warp_tree<NB>(plain);
  det_mk_warp_tree_rows<NB>(spread);
  float want[NB];  // lane 0's results, to every lane
  memcpy(want, plain, sizeof plain);
  det_shfl_idx_n(want, NB, 0);
  const int r = det_mk_tree_row<NB>();
  if (r >= 0) {
    __atomic_fetch_add(&a.checked, 1, __ATOMIC_RELAXED);
    const bool both_nan = spread[0] != spread[0] && want[r] != want[r];  // payloads are not the contract's (SPEC §2.4)
    if (!both_nan && memcmp(&spread[0], &want[r], 4) != 0) __atomic_fetch_add(&a.mismatches, 1, __ATOMIC_RELAXED);
  }
}

void tree_kernel(void* p) {
  TreeArgs& a = *(TreeArgs*)p;
  tree_rows<1>(a);
  tree_rows<2>(a);
  tree_rows<4>(a);
  tree_rows<8>(a);
  tree_rows<16>(a);
  tree_rows<32>(a);
}

bool tree_ok() {
  TreeArgs a;
  const uint32_t hostile[] = {0x7fc00001u, 0xffc00002u, 0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                              0x00000001u, 0x80000003u, 0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0xff7fffffu};
  uint64_t x = 12345;
  for (int i = 0; i < 32 * 32; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = (uint32_t)(x >> 32);
    a.in.push_back(r % 4 == 0 ? hostile[(r >> 8) % 12] : (r & 0x807fffffu) | ((100u + (r >> 24) % 50u) << 23));
  }
  if (det_simt_host::launch(1, 32, 0, 2, tree_kernel, &a) != 0) return false;
  return a.mismatches == 0 && a.checked == 1 + 2 + 4 + 8 + 16 + 32;  // one lane per row
}

int main(int argc, char** argv) {
  if (argc >= 4 && strcmp(argv[1], "ring") == 0) {
    printf("ring %s\n", ring_ok(atoi(argv[2]), atoi(argv[3])) ? "ok" : "mismatch");
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "overrun") == 0) {
    Smem a{40, std::vector<unsigned>(2)};
    if (det_simt_host::launch(2, 32, a.bytes, 5, overrun_kernel, &a) != 0) return 1;
    printf("overrun read\n");  // not reached under AddressSanitizer with DET_SIMT_MODES=smem
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "unwritten") == 0) {
    Smem a{256, std::vector<unsigned>(2 * 64)};
    if (det_simt_host::launch(2, 64, a.bytes, 5, unwritten_kernel, &a) != 0) return 1;
    std::set<unsigned> kinds(a.seen.begin(), a.seen.end());
    const char* what = kinds == std::set<unsigned>{0u} ? "zero" : kinds == std::set<unsigned>{2u} ? "nan" : "mixed";
    printf("unwritten %s\n", what);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "tree") == 0) {
    printf("tree %s\n", tree_ok() ? "ok" : "mismatch");
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "grid") == 0) {
    printf("grid %s\n", grid_ok(atoi(argv[2])) ? "ok" : "wrong");
    return 0;
  }
  printf("%zu %zu %s\n", distinct_results(true), distinct_results(false),
         det_simt_host::launch(1, 32, 0, 1, skips_barrier, nullptr) != 0 ? "deadlock" : "no-deadlock");
  return 0;
}
