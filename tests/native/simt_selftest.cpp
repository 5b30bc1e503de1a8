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
//   area               the phase area's row layout (det_mk_area_at): rows copied into it by
//                      det_mk_block_copy_l2 at several offsets, read back by det_mk_load_x8 and
//                      det_mk_warp_dot_f32 as the GEMV and the norm read them: "area ok" when every
//                      lane gets its run's elements in order and the dot has the plain row's bits,
//                      with the fewest banks a quarter warp's 16-byte loads cover (by the loader's
//                      address rule); the same for a plain row; "control caught" when an area row
//                      read as plain gives wrong elements or dot bits
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
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

// One block of one warp: a row of K elements copied into shared memory (in the area layout or
// plain) at float offset `at` (a multiple of 8, as every area row starts), then read as the GEMV
// and the norm read it (as the area layout or plain).
constexpr int kAreaK = 3 * 256 + 64;  // three whole blocks of runs and a partial one (lanes 0..7)
struct AreaArgs {
  std::vector<float> src;
  int at = 0, bad = 0;
  float dot_read = 0.0f, dot_plain = 0.0f;
  std::vector<int> offsets;  // per lane: where its two 16-byte loads of its first run start
  bool copy_area = true, read_area = true;
};

void area_kernel(void* p) {
  AreaArgs& a = *(AreaArgs*)p;
  float* row = (float*)det_smem() + a.at;
  det_mk_block_copy_l2(row, a.src.data(), kAreaK, a.copy_area);
  det_cp_async_commit();
  det_cp_async_wait<0>();
  det_sync_block();
  const int lower = det_mk_run_lower(a.read_area);
  for (int k = 8 * det_lane(); k < kAreaK; k += 256) {
    float xv[8];
    det_mk_load_x8(row + k, lower, xv);
    for (int t = 0; t < 8; ++t)
      if (memcmp(&xv[t], &a.src[k + t], 4) != 0) __atomic_fetch_add(&a.bad, 1, __ATOMIC_RELAXED);
  }
  // det_mk_load_x8's rule: its first load at the run's start + lower, its second at + 4 - lower.
  a.offsets[2 * det_lane()] = a.at + 8 * det_lane() + lower;
  a.offsets[2 * det_lane() + 1] = a.at + 8 * det_lane() + 4 - lower;
  const float d = a.read_area ? det_mk_warp_dot_f32<true>(row, row, kAreaK) : det_mk_warp_dot_f32(row, row, kAreaK);
  const float plain = det_mk_warp_dot_f32(a.src.data(), a.src.data(), kAreaK);
  if (det_lane() == 0) a.dot_read = d, a.dot_plain = plain;
}

// The fewest distinct banks a quarter warp's 16-byte load covers, over quarter warps and the two
// loads (32: conflict-free).
int fewest_banks(const std::vector<int>& offsets) {
  int fewest = 32;
  for (int q = 0; q < 4; ++q)
    for (int load = 0; load < 2; ++load) {
      std::set<int> banks;
      for (int l = 8 * q; l < 8 * q + 8; ++l)
        for (int i = 0; i < 4; ++i) banks.insert((offsets[2 * l + load] + i) % 32);
      fewest = std::min(fewest, (int)banks.size());
    }
  return fewest;
}

// Runs a row through area_kernel at every starting offset: whether every lane read its run in order
// and the dot had the plain row's bits, and the fewest banks seen.
bool area_run(bool copy_area, bool read_area, int* banks) {
  bool ok = true;
  *banks = 32;
  for (int at = 0; at < 64; at += 8) {
    AreaArgs a;
    a.at = at;
    a.copy_area = copy_area, a.read_area = read_area;
    a.offsets.assign(2 * DET_WARP, 0);
    uint64_t x = 977 + at;
    for (int k = 0; k < kAreaK; ++k) {  // nonzero, signs and exponents spread: sums depend on the order
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t r = (uint32_t)(x >> 32);
      const uint32_t bits = (r & 0x807fffffu) | ((100u + (r >> 23) % 40u) << 23);
      float v;
      memcpy(&v, &bits, 4);
      a.src.push_back(v);
    }
    if (det_simt_host::launch(1, DET_WARP, (size_t)(at + kAreaK) * 4, 3, area_kernel, &a) != 0) return false;
    ok = ok && a.bad == 0 && memcmp(&a.dot_read, &a.dot_plain, 4) == 0;
    *banks = std::min(*banks, fewest_banks(a.offsets));
  }
  return ok;
}

// The area layout read as such, a plain row read as such, and the control: an area row read as plain.
void area_check() {
  int area_banks, plain_banks, control_banks;
  const bool area_ok = area_run(true, true, &area_banks), plain_ok = area_run(false, false, &plain_banks);
  const bool control_ok = area_run(true, false, &control_banks);
  printf("area %s banks %d plain %s banks %d control %s\n", area_ok ? "ok" : "wrong", area_banks,
         plain_ok ? "ok" : "wrong", plain_banks, control_ok ? "missed" : "caught");
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
  if (argc >= 2 && strcmp(argv[1], "area") == 0) {
    area_check();
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
