// tile_ceiling.cpp: how close the batched bf16 GEMV tile (det_gemv_tile_avx512.cpp) runs to this
// CPU's fp32 fma peak, on one core, and where the gap opens. Four groups of figures:
//   1. the peak: 12 independent fma chains in registers (ymm and zmm; Zen 4 splits zmm in two);
//   2. the tile's inner loop alone, as a long steady loop over L1-resident data: 4 staged weight
//      rows x 3 staged inputs, one zmm step = 4 + 3 loads, 12 fma;
//   3. the kernel itself, det_gemv_rows_tile_avx512, on SmolLM2-135M's shapes: all in L1
//      (4 rows, 3 inputs) and at batch 16 and 64 over whole matrices;
//   4. the kernel at batch 16 with its weights streamed from memory, as in a batched decode step
//      (what the kernel's prefetch is for).
// Row 3 below row 2 is what staging the weight rows (a transpose per 256 weights), the short last
// block and the per-output tree cost. The inputs are staged once, outside the timing.
// Run: bash benchmarks/tile_ceiling.sh (results in docs/RESULTS.md §5).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "../det_infer_cpu/det_kernels_cpu.h"
#include "../det_infer_cpu/det_lane_blocks.h"

#define ISA __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))
#define AVX512 ISA __attribute__((noinline))  // each timed loop stays its own function

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Median GFLOP/s of 9 windows of about 0.1 s, `flops` per call of f.
template <class F>
static double gflops(double flops, F f) {
  std::vector<double> rates;
  for (int w = 0; w < 9; ++w) {
    const double t0 = now();
    long calls = 0;
    do f(), ++calls; while (now() - t0 < 0.1);
    rates.push_back(flops * calls / (now() - t0) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[4];
}

static volatile float sink;  // keeps each loop's result alive

// 1. fma peak: 12 chains (4-cycle latency x 2 pipes needs 8), operands in registers.
#define PEAK_LOOP(name, V, fma, set)                                                            \
  AVX512 static void name(long n) {                                                              \
    const V b = set(1.0000001f), c = set(1e-7f);                                                 \
    V a0 = set(.1f), a1 = set(.2f), a2 = set(.3f), a3 = set(.4f), a4 = set(.5f), a5 = set(.6f);  \
    V a6 = set(.7f), a7 = set(.8f), a8 = set(.9f), a9 = set(1.1f), a10 = set(1.2f), a11 = set(1.3f); \
    for (long i = 0; i < n; ++i) {                                                               \
      a0 = fma(a0, b, c), a1 = fma(a1, b, c), a2 = fma(a2, b, c), a3 = fma(a3, b, c);            \
      a4 = fma(a4, b, c), a5 = fma(a5, b, c), a6 = fma(a6, b, c), a7 = fma(a7, b, c);            \
      a8 = fma(a8, b, c), a9 = fma(a9, b, c), a10 = fma(a10, b, c), a11 = fma(a11, b, c);        \
      __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), \
                       "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));                      \
    }                                                                                            \
    const V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;                     \
    sink = s[0];                                                                                 \
  }
PEAK_LOOP(peak_ymm, __m256, _mm256_fmadd_ps, _mm256_set1_ps)
PEAK_LOOP(peak_zmm, __m512, _mm512_fmadd_ps, _mm512_set1_ps)

// 2. The tile's inner loop, steady: one 16-accumulator step of 4 staged rows x 3 staged inputs,
// from 64-byte aligned rows, each loaded vector kept in a register as the kernel keeps it.
ISA static inline __m512 in_register(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}
AVX512 static void steady_loop(const float* S, const float* X, int64_t Kp, long n) {
  __m512 acc[4][3];
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < 3; ++b) acc[i][b] = _mm512_setzero_ps();
  for (long it = 0; it < n; ++it) {
    const int64_t k = (it & 15) * 16;  // walks the 16 half-steps of a 256-weight block, in L1
    __m512 w[4];
    for (int i = 0; i < 4; ++i) w[i] = in_register(_mm512_load_ps(S + i * Kp + k));
    for (int b = 0; b < 3; ++b) {
      const __m512 x = in_register(_mm512_load_ps(X + b * Kp + k));
      for (int i = 0; i < 4; ++i) acc[i][b] = _mm512_fmadd_ps(w[i], x, acc[i][b]);
    }
  }
  float s = 0;
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < 3; ++b) s += ((float*)&acc[i][b])[0];
  sink = s;
}

int main() {
  const double peak = gflops(2.0 * 8 * 12 * 1e6, [] { peak_ymm(1000000); });
  printf("| what | GFLOP/s, one core | of the ymm peak |\n|---|---|---|\n");
  printf("| fma peak, ymm registers | %.1f | 100%% |\n", peak);
  const double zpeak = gflops(2.0 * 16 * 12 * 1e6, [] { peak_zmm(1000000); });
  printf("| fma peak, zmm registers | %.1f | %.0f%% |\n", zpeak, 100 * zpeak / peak);

  srand(1);
  auto weights = [](int64_t n) {  // bf16 of magnitude about 2^-8 .. 2^0, either sign
    std::vector<uint16_t> w(n);
    for (auto& v : w) v = (uint16_t)((0x3b80 + rand() % 0x400) | (rand() & 1) << 15);
    return w;
  };
  auto inputs = [](int64_t n) {
    std::vector<float> x(n);
    for (auto& v : x) v = rand() / (float)RAND_MAX - 0.5f;
    return x;
  };
  {
    const int64_t K = 576;
    const auto S = inputs(4 * K), X = inputs(3 * K);
    det_staging s_area, x_area;  // aligned copies, as the kernel's staged rows and inputs are
    float* Sa = s_area.get(4 * K);
    float* Xa = x_area.get(3 * K);
    std::copy(S.begin(), S.end(), Sa);
    std::copy(X.begin(), X.end(), Xa);
    const double g = gflops(2.0 * 16 * 12 * 1e6, [&] { steady_loop(Sa, Xa, K, 1000000); });
    printf("| tile inner loop alone, steady, L1 | %.1f | %.0f%% |\n", g, 100 * g / peak);
  }
  // Groups 3 and 4. From memory: a set of matrices larger than the 32 MB L3, each call taking the
  // next one, as a batched decode step streams its weights.
  struct Shape { int64_t N, K, B; bool from_memory; const char* what; };
  const Shape shapes[] = {{4, 576, 3, false, "kernel, 4 rows x 3 inputs, K = 576 (all in L1)"},
                          {4, 1536, 3, false, "kernel, 4 rows x 3 inputs, K = 1536 (all in L1)"},
                          {1536, 576, 16, false, "kernel, gate/up 1536 x 576, batch 16"},
                          {576, 1536, 16, false, "kernel, down 576 x 1536, batch 16"},
                          {1536, 576, 64, false, "kernel, gate/up 1536 x 576, batch 64 (a prefill block)"},
                          {1536, 576, 16, true, "kernel, gate/up 1536 x 576, batch 16, weights from memory"},
                          {576, 1536, 16, true, "kernel, down 576 x 1536, batch 16, weights from memory"}};
  for (const Shape& s : shapes) {
    const int64_t count = s.from_memory ? int64_t{256000000} / (2 * s.N * s.K) : 1;
    std::vector<std::vector<uint16_t>> Ws;
    for (int64_t m = 0; m < count; ++m) Ws.push_back(weights(s.N * s.K));
    const auto& W = Ws[0];
    const auto X = inputs(s.B * s.K);
    std::vector<float> Y(s.B * s.N);
    det_staging staging;
    float* xp = staging.get(s.B * det_staged_len(s.K));
    det_stage_inputs(X.data(), s.K, s.B, xp);
    auto matrix = [](const std::vector<uint16_t>& w) { det_matrix m{}; m.bf16 = w.data(); return m; };
    det_gemv_rows_tile_avx512(matrix(W), s.K, xp, s.B, Y.data(), s.N, 0, s.N);
    for (int64_t b = 0; b < s.B; ++b)  // the kernel must give the contract's bits
      for (int64_t r = 0; r < s.N; r += std::max<int64_t>(1, s.N / 7)) {
        const float ref = det_dot_bf16_ref(W.data() + r * s.K, X.data() + b * s.K, s.K);
        if (det_f32_bits(ref) != det_f32_bits(Y[b * s.N + r])) {
          fprintf(stderr, "tile kernel differs from the contract at row %ld, input %ld\n", (long)r, (long)b);
          return 1;
        }
      }
    int64_t next = 0;
    const double g = gflops(2.0 * s.N * s.K * s.B, [&] {
      det_gemv_rows_tile_avx512(matrix(Ws[next]), s.K, xp, s.B, Y.data(), s.N, 0, s.N);
      next = (next + 1) % count;
    });
    printf("| %s | %.1f | %.0f%% |\n", s.what, g, 100 * g / peak);
  }
  return 0;
}
