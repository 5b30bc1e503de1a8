// contract_digest.cpp: evaluate every contract function on a fixed input set and write the raw
// outputs to stdout. tests/test_build_invariance.py compiles this file with many compilers and
// flags (and for aarch64 under qemu) and requires one SHA-256 over all of them; tests/
// contract_inputs.py builds the same inputs in numpy so the torch ops can be held to it too.
//
// Inputs come from splitmix64 streams and are assembled from integer bit fields only, so no
// floating-point operation sits between the seed and the function under test.
#include <stdint.h>
#include <stdio.h>

#include <vector>

#include "../../contract/det_argmax.h"
#include "../../contract/det_reduce.h"
#include "../../contract/det_trig.h"
#include "../../contract/det_unary.h"
#include "../../det_infer_cpu/det_fpenv.h"

static const int64_t kUnaryN = 1 << 17;
static const int64_t kAngleN = 1 << 16;
static const int64_t kReduceKs[] = {1, 7, 64, 255, 256, 257, 576, 1000, 1536};
static const int64_t kReduceRows = 3;

static uint64_t splitmix64_at(uint64_t seed, uint64_t i) {  // the i-th output of a stream
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// fp32 with exponent in [e_lo, e_hi] and random sign/mantissa; 1 in 8 raw 32-bit patterns.
static float f32_from(uint64_t u, int e_lo, int e_hi) {
  if ((u & 7) == 0) return det_bits_f32((uint32_t)(u >> 32));
  uint32_t e = (uint32_t)(e_lo + (int)(((u >> 40) & 0xffff) % (uint64_t)(e_hi - e_lo + 1)) + 127);
  return det_bits_f32((uint32_t)((u >> 63) << 31) | (e << 23) | (uint32_t)(u & 0x7fffff));
}

static double f64_from(uint64_t u) {  // |theta| in [2^-30, 2^22): exponents -30..21
  uint64_t e = (uint64_t)(-30 + (int)(((u >> 52) & 0x7ff) % 52) + 1023);
  uint64_t bits = ((u >> 63) << 63) | (e << 52) | (u & ((1ull << 52) - 1));
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static uint16_t bf16_from(uint64_t u) {  // finite bf16, exponents -10..3
  uint32_t e = (uint32_t)(-10 + (int)(((u >> 40) & 0xffff) % 14) + 127);
  return (uint16_t)(((u >> 63) << 15) | (e << 7) | (u & 0x7f));
}

static const int kUnaryRange[DET_UNARY_COUNT][2] = {
    {-30, 6}, {-30, 3}, {-30, 7}, {-30, 4}, {-126, 127}, {-126, 127}, {-126, 127}};

static void put(const void* p, size_t n) { fwrite(p, 1, n, stdout); }
static void put_f32(std::vector<float> v) {  // NaNs hashed canonically (docs/SPEC.md §2.4)
  for (float& a : v) a = det_canonical_f32(a);
  put(v.data(), v.size() * 4);
}

int main(int argc, char** argv) {
  det_fpenv_guard env;
#if defined(__x86_64__)
  // Negative control for the test: --ftz turns on flush-to-zero and denormals-are-zero under the
  // guard, which must change the digest (subnormal inputs and outputs are in the set).
  if (argc > 1 && strcmp(argv[1], "--ftz") == 0) _mm_setcsr(_mm_getcsr() | 0x8040u);
#else
  (void)argc;
  (void)argv;
#endif
  for (int fn = 0; fn < DET_UNARY_COUNT; ++fn) {
    std::vector<float> y(kUnaryN);
    for (int64_t i = 0; i < kUnaryN; ++i)
      y[i] = det_unary_apply_f32(
          fn, f32_from(splitmix64_at(1000 + fn, i), kUnaryRange[fn][0], kUnaryRange[fn][1]));
    put_f32(y);
  }
  {
    std::vector<float> s(kAngleN), c(kAngleN);
    for (int64_t i = 0; i < kAngleN; ++i) {
      det_sincos_f32 sc = det_sincos_f64(f64_from(splitmix64_at(2000, i)));
      s[i] = sc.s;
      c[i] = sc.c;
    }
    put_f32(s);
    put_f32(c);
  }
  for (int64_t K : kReduceKs) {
    std::vector<uint16_t> wb(kReduceRows * K);
    std::vector<float> wf(kReduceRows * K), x(K), y(3 * kReduceRows);
    for (int64_t i = 0; i < kReduceRows * K; ++i) {
      wb[i] = bf16_from(splitmix64_at(3000 + 7 * K, i));
      wf[i] = f32_from(splitmix64_at(5000 + 7 * K, i) | 1ull, -10, 3);
    }
    for (int64_t i = 0; i < K; ++i) x[i] = f32_from(splitmix64_at(4000 + 7 * K, i) | 1ull, -7, 3);
    for (int64_t r = 0; r < kReduceRows; ++r) {
      y[r] = det_dot_bf16_ref(&wb[r * K], x.data(), K);
      y[kReduceRows + r] = det_dot_f32_ref(&wf[r * K], x.data(), K);
      y[2 * kReduceRows + r] = det_sum_f32_ref(&wf[r * K], K);
    }
    put_f32(y);
  }
  {
    // argmax over small integers (many ties), then with NaNs planted, then signed zeros.
    std::vector<float> v(1000);
    for (int64_t i = 0; i < 1000; ++i) v[i] = (float)(int)(splitmix64_at(6000, i) % 16) - 8.0f;
    int64_t ids[3];
    ids[0] = det_argmax_f32_ref(v.data(), 1000);
    v[617] = det_bits_f32(0x7fc00000u);
    v[923] = det_bits_f32(0xffc00000u);
    ids[1] = det_argmax_f32_ref(v.data(), 1000);
    for (int64_t i = 0; i < 1000; ++i) v[i] = (i % 3) ? 0.0f : -0.0f;
    ids[2] = det_argmax_f32_ref(v.data(), 1000);
    put(ids, sizeof ids);
  }
  return 0;
}
