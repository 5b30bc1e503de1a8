// reduce_layout_tile.cpp: what the two candidate orders for contract 2 (contract/det_reduce.h) cost
// a register-tiled bf16 GEMM tile on one x86 core with AVX-512, Y[b][r] = dot(W[r], X[b]).
// Both orders use 32 fp32 accumulators (each from +0, fma chain in increasing k) and the tree
// s = 16, 8, 4, 2, 1; they differ in which columns accumulator j takes:
//   (a) lane blocks: in each 256-column block, accumulator l takes columns k0+8l .. k0+8l+7
//       (contract 2 as written: det_dot_bf16_ref);
//   (b) residues:    accumulator j takes every column k = j (mod 32).
// A zmm holds 16 accumulators, so each (row, input) pair owns two zmm (accumulators 0-15, 16-31)
// and an R x T tile holds 2RT accumulators (24 for the 12-pair tiles here, + R weights + 1 x).
//   (b) plain: 32 contiguous bf16 of a row are two zmm (vpmovzxwd + shift), x read contiguously;
//       no transpose, and K = 576 has no partial block.
//   (a) staged: each row block's R rows are transposed once per call into an L1/L2 staging buffer
//       of widened fp32 (per 256 columns: 8 loads, 8 + 16 vpermt2w/vpermi2w, the second stage
//       zero-masked so each bf16 lands in the high half of an fp32 lane, 16 stores); the tile then
//       reads the staged rows for every input group, with x permuted once per call
//       (xp[k0+32i+l] = x[k0+8l+i], -0 where k0+8l+i >= K, the additive identity the padding needs).
//       Inline transposing is no option for these tiles: 24 accumulators leave no room for the 8
//       source zmm. The batch-1 GEMV does transpose inline (2 rows, 4 accumulators).
// (The x permutation here is a plain scalar loop, once per call: with the 96-row L2 problems it is
// a visible share of the call, see its column; over a real matrix's rows it vanishes.)
// Every kernel is first checked bit for bit (memcmp) against a scalar reference of its own order,
// then timed: median of 9 repetitions. Shapes: batch 16 (3x4, 6x2) and prefill, batch 48 (4x3, 3x4),
// K = 576 and 1536, weights L2-resident (96 rows) and streamed from memory (~128 MB of rows); and
// batch 1 (one input, all rows from memory) for both orders.
// Run: bash benchmarks/reduce_layout_probe.sh --cpu
//  (= g++ -O3 -march=native -ffp-contract=off -std=c++17 ...; taskset -c 0 build/reduce_layout_tile)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "../contract/det_reduce.h"

typedef uint16_t bf16;
#define INLINE __attribute__((always_inline)) inline

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
// Median seconds per call of f over 9 repetitions, each repeating f for at least 20 ms.
static double seconds(const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int rep = 0; rep < 9; ++rep) {
    const double t0 = now();
    long n = 0;
    do f(), ++n; while (now() - t0 < 0.02);
    t.push_back((now() - t0) / n);
  }
  std::sort(t.begin(), t.end());
  return t[4];
}

// ---- scalar references -------------------------------------------------------------------------
static float ref_a(const bf16* w, const float* x, int K) { return det_dot_bf16_ref(w, x, K); }
static float ref_b(const bf16* w, const float* x, int K) {
  float acc[32];
  for (int j = 0; j < 32; ++j) acc[j] = 0.0f;
  for (int k = 0; k < K; ++k) acc[k % 32] = det_fma_f32(det_bf16_to_f32(w[k]), x[k], acc[k % 32]);
  return det_reduce_tree_f32(acc);
}

// ---- shared pieces -----------------------------------------------------------------------------
// The tree over accumulators 0-15 (lo) and 16-31 (hi): s = 16, 8, 4, 2, 1, each an exact fp32 add.
static INLINE float tree(__m512 lo, __m512 hi) {
  const __m512 a = _mm512_add_ps(lo, hi);                                                        // s = 16
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));       // s = 8
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));           // s = 4
  const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));                                           // s = 2
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));                                       // s = 1
}
// 16 contiguous bf16 -> 16 fp32 (exact).
static INLINE __m512 widen16(const bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static INLINE __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }

// ---- (b) residues, plain -----------------------------------------------------------------------
// R rows x T inputs; K % 32 == 0. Zmm h of a 32-column group holds accumulators 16h .. 16h+15.
template <int R, int T>
static void tile_b(const bf16* W, int K, const float* X, float* Y, int ldy) {
  __m512 acc[R][T][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 32)
    for (int h = 0; h < 2; ++h) {
      __m512 w[R];
      for (int r = 0; r < R; ++r) w[r] = widen16(W + (size_t)r * K + k + 16 * h);
      for (int t = 0; t < T; ++t) {
        __m512 x = _mm512_loadu_ps(X + (size_t)t * K + k + 16 * h);
        __asm__("" : "+v"(x));  // one load per input, not one folded into each of the R fmas
        for (int r = 0; r < R; ++r) acc[r][t][h] = fma(w[r], x, acc[r][t][h]);
      }
    }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[(size_t)t * ldy + r] = tree(acc[r][t][0], acc[r][t][1]);
}
template <int R, int T>
__attribute__((noinline)) static void gemm_b(const bf16* W, int N, int K, const float* X, int B, float* Y) {
  for (int r0 = 0; r0 < N; r0 += R)
    for (int t0 = 0; t0 < B; t0 += T) tile_b<R, T>(W + (size_t)r0 * K, K, X + (size_t)t0 * K, Y + (size_t)t0 * N + r0, N);
}

// ---- (a) lane blocks: transpose tables ---------------------------------------------------------
// A 256-column block of a row is 8 zmm v[0..7] of 32 bf16; v[c] holds accumulators 4c .. 4c+3,
// accumulator l's step-i term at word 8(l - 4c) + i. Output zmm (i, h): lane m = accumulator 16h+m's
// step-i term, in the high half of the 32-bit lane (low half zero), i.e. already fp32.
// Stage 1 (per half h, q = 0, 1): S[p][q] = vpermt2w(v[4h+2p], v[4h+2p+1]): word 8(i-4q) + m' holds
//   accumulator 16h + 8p + m' at step i, for i in 4q .. 4q+3, m' in 0 .. 7.
// Stage 2: out(i, h) = zero-masked vpermt2w(S[0][i/4], S[1][i/4]): word 2m+1 <- S[m/8] word
//   8(i%4) + m%8.
struct Perm {
  __m512i s1[2], s2[4];
  Perm() {
    alignas(64) uint16_t a[32];
    for (int q = 0; q < 2; ++q) {
      for (int t = 0; t < 32; ++t) {
        const int i = 4 * q + t / 8, mp = t % 8;
        a[t] = (uint16_t)((mp / 4) * 32 + 8 * (mp % 4) + i);
      }
      s1[q] = _mm512_load_si512(a);
    }
    for (int i4 = 0; i4 < 4; ++i4) {
      for (int t = 0; t < 32; ++t) {
        const int m = t / 2;
        a[t] = (uint16_t)((m / 8) * 32 + 8 * i4 + m % 8);  // even words are masked to zero
      }
      s2[i4] = _mm512_load_si512(a);
    }
  }
};
static const __mmask32 kHighHalves = 0xAAAAAAAAu;

// Transposes one block (n <= 256 columns, n % 32 == 0) and hands out(i, h) to f(i, h, zmm).
template <class F>
static INLINE void transpose_block(const Perm& P, const bf16* w, int n, F f) {
  __m512i v[8];
  for (int c = 0; c < 8; ++c) v[c] = 32 * c < n ? _mm512_loadu_si512(w + 32 * c) : _mm512_setzero_si512();
  const int nh = n > 128 ? 2 : 1;  // a half with no terms is skipped (its accumulators stay)
  for (int h = 0; h < nh; ++h) {
    __m512i S[2][2];
    for (int p = 0; p < 2; ++p)
      for (int q = 0; q < 2; ++q) S[p][q] = _mm512_permutex2var_epi16(v[4 * h + 2 * p], P.s1[q], v[4 * h + 2 * p + 1]);
    for (int i = 0; i < 8; ++i)
      f(i, h, _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(kHighHalves, S[0][i / 4], P.s2[i % 4], S[1][i / 4])));
  }
}

// Staged row: for block kb, zmm (kb*16 + 2i + h) is out(i, h). A skipped half stays unwritten.
static INLINE void stage_row(const Perm& P, const bf16* w, int K, float* S) {
  for (int k0 = 0; k0 < K; k0 += 256)
    transpose_block(P, w + k0, std::min(256, K - k0),
                    [&](int i, int h, __m512 o) { _mm512_storeu_ps(S + (size_t)(k0 / 16 + 2 * i + h) * 16, o); });
}
static int padded(int K) { return (K + 255) / 256 * 256; }

// x permuted once per call: xp[k0 + 32i + l] = x[k0 + 8l + i], -0 beyond K.
static void permute_x(const float* X, int B, int K, float* XP) {
  const int Kp = padded(K);
  for (int b = 0; b < B; ++b)
    for (int k0 = 0; k0 < Kp; k0 += 256)
      for (int i = 0; i < 8; ++i)
        for (int l = 0; l < 32; ++l) {
          const int k = k0 + 8 * l + i;
          XP[(size_t)b * Kp + k0 + 32 * i + l] = k < K ? X[(size_t)b * K + k] : -0.0f;
        }
}

// (a) tile over staged rows S (stride Kp floats) and permuted inputs XP (stride Kp).
template <int R, int T, int NH>
static INLINE void tile_a_block(__m512 (&acc)[R][T][2], const float* S, const float* XP, int Kp, int k0) {
  for (int i = 0; i < 8; ++i)
    for (int h = 0; h < NH; ++h) {
      __m512 w[R];
      for (int r = 0; r < R; ++r) {
        w[r] = _mm512_load_ps(S + (size_t)r * Kp + k0 + 32 * i + 16 * h);
        __asm__("" : "+v"(w[r]));  // keep it in a register: else gcc folds it into T fmas (T loads)
      }
      for (int t = 0; t < T; ++t) {
        __m512 x = _mm512_load_ps(XP + (size_t)t * Kp + k0 + 32 * i + 16 * h);
        __asm__("" : "+v"(x));
        for (int r = 0; r < R; ++r) acc[r][t][h] = fma(w[r], x, acc[r][t][h]);
      }
    }
}
template <int R, int T>
static void tile_a(const float* S, int K, const float* XP, float* Y, int ldy) {
  const int Kp = padded(K), kfull = K / 256 * 256;
  __m512 acc[R][T][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  for (int k0 = 0; k0 < kfull; k0 += 256) tile_a_block<R, T, 2>(acc, S, XP, Kp, k0);
  if (kfull < K) {  // last block: accumulators 0 .. (K-kfull)/8 - 1 (lanes beyond get +0 * -0)
    if (K - kfull > 128)
      tile_a_block<R, T, 2>(acc, S, XP, Kp, kfull);
    else
      tile_a_block<R, T, 1>(acc, S, XP, Kp, kfull);
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[(size_t)t * ldy + r] = tree(acc[r][t][0], acc[r][t][1]);
}
// Whole call: permute x, then per row block stage R rows and run every input group over them.
// With stage = false (timing the tile alone) x and the rows are not staged: S and XP keep what the
// last call left there.
template <int R, int T>
__attribute__((noinline)) static void gemm_a(const Perm& P, const bf16* W, int N, int K, const float* X, int B, float* Y,
                                             float* XP, float* S, bool stage = true) {
  const int Kp = padded(K);
  if (stage) permute_x(X, B, K, XP);
  for (int r0 = 0; r0 < N; r0 += R) {
    if (stage)
      for (int r = 0; r < R; ++r) stage_row(P, W + (size_t)(r0 + r) * K, K, S + (size_t)r * Kp);
    for (int t0 = 0; t0 < B; t0 += T) tile_a<R, T>(S, K, XP + (size_t)t0 * Kp, Y + (size_t)t0 * N + r0, N);
  }
}
// Staging alone over all rows (the transpose's cost).
__attribute__((noinline)) static void stage_all(const Perm& P, const bf16* W, int N, int K, float* S, int R) {
  const int Kp = padded(K);
  for (int r = 0; r < N; ++r) stage_row(P, W + (size_t)r * K, K, S + (size_t)(r % R) * Kp);
}

// ---- batch 1 -----------------------------------------------------------------------------------
// (b): 4 rows at a time, 8 accumulator zmm.
__attribute__((noinline)) static void gemv_b(const bf16* W, int N, int K, const float* x, float* y) {
  for (int r0 = 0; r0 < N; r0 += 4) tile_b<4, 1>(W + (size_t)r0 * K, K, x, y + r0, N);
}
// (a): 2 rows at a time, transposed inline, fma straight from the stage-2 output.
__attribute__((noinline)) static void gemv_a(const Perm& P, const bf16* W, int N, int K, const float* xp, float* y) {
  const int Kp = padded(K);
  (void)Kp;
  for (int r0 = 0; r0 < N; r0 += 2) {
    __m512 acc[2][2];
    for (int r = 0; r < 2; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int k0 = 0; k0 < K; k0 += 256)
      for (int r = 0; r < 2; ++r)
        transpose_block(P, W + (size_t)(r0 + r) * K + k0, std::min(256, K - k0), [&](int i, int h, __m512 o) {
          acc[r][h] = fma(o, _mm512_loadu_ps(xp + k0 + 32 * i + 16 * h), acc[r][h]);
        });
    for (int r = 0; r < 2; ++r) y[r0 + r] = tree(acc[r][0], acc[r][1]);
  }
}

// ---- driver ------------------------------------------------------------------------------------
static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint32_t rng() {
  rng_s ^= rng_s << 13, rng_s ^= rng_s >> 7, rng_s ^= rng_s << 17;
  return (uint32_t)rng_s;
}
static float rnd() { return (int32_t)rng() * (1.0f / 2147483648.0f); }

// 64-byte aligned buffer (every zmm load of W, X, XP and S is then within one cache line).
template <class E>
struct Buf {
  E* p;
  size_t n;
  explicit Buf(size_t n_) : p((E*)aligned_alloc(64, (n_ * sizeof(E) + 63) / 64 * 64)), n(n_) {}
  ~Buf() { free(p); }
  Buf(const Buf&) = delete;
  E* data() const { return p; }
  size_t size() const { return n; }
  E* begin() const { return p; }
  E* end() const { return p + n; }
  E& operator[](size_t i) const { return p[i]; }
};

struct Problem {
  int N, K, B;
  Buf<bf16> W;
  Buf<float> X, XP, S, Y;
  Problem(int N_, int K_, int B_) : N(N_), K(K_), B(B_), W((size_t)N_ * K_), X((size_t)B_ * K_),
        XP((size_t)B_ * padded(K_)), S((size_t)8 * padded(K_)), Y((size_t)B_ * N_) {
    for (auto& v : W) v = det_f32_to_bf16(rnd());
    for (auto& v : X) v = rnd();
  }
  bool check(bool order_a) const {  // Y against the scalar reference of the order, bit for bit
    std::vector<float> want(Y.size());
    for (int b = 0; b < B; ++b)
      for (int r = 0; r < N; ++r) {
        const bf16* w = &W[(size_t)r * K];
        const float* x = &X[(size_t)b * K];
        want[(size_t)b * N + r] = order_a ? ref_a(w, x, K) : ref_b(w, x, K);
      }
    return memcmp(want.data(), Y.data(), Y.size() * sizeof(float)) == 0;
  }
};

static const Perm P;
static int failures = 0;

template <int R, int T>
static void tile_rows(int K, int B, const char* shape) {
  const int rows_mem = (int)((128ll << 20) / (2ll * K)) / 24 * 24;
  Problem c(96, K, B);  // check problem = the L2-resident one
  gemm_b<R, T>(c.W.data(), c.N, K, c.X.data(), B, c.Y.data());
  const bool okb = c.check(false);
  std::fill(c.Y.begin(), c.Y.end(), 0.0f);
  gemm_a<R, T>(P, c.W.data(), c.N, K, c.X.data(), B, c.Y.data(), c.XP.data(), c.S.data());
  const bool oka = c.check(true);
  failures += !okb + !oka;
  Problem m(rows_mem, K, B);
  for (int mem = 0; mem < 2; ++mem) {
    Problem& p = mem ? m : c;
    const double fl = 2.0 * p.N * p.B * K;
    const double tb = seconds([&] { gemm_b<R, T>(p.W.data(), p.N, K, p.X.data(), B, p.Y.data()); });
    const double ta = seconds([&] { gemm_a<R, T>(P, p.W.data(), p.N, K, p.X.data(), B, p.Y.data(), p.XP.data(), p.S.data()); });
    const double tt = seconds([&] { gemm_a<R, T>(P, p.W.data(), p.N, K, p.X.data(), B, p.Y.data(), p.XP.data(), p.S.data(), false); });
    const double tx = seconds([&] { permute_x(p.X.data(), B, K, p.XP.data()); });
    const double ts = seconds([&] { stage_all(P, p.W.data(), p.N, K, p.S.data(), R); });
    const double wb = 2.0 * p.N * K;
    printf("| %-7s %dx%d | %4d | %2d | %-6s | %-4s | %6.1f | %6.1f | %5.1f%% | %6.1f | %6.1f | %5.1f%% | %5.1f%% |\n", shape, R, T, K,
           B, mem ? "memory" : "L2", okb && oka ? "ok" : "FAIL", fl / tb / 1e9, fl / ta / 1e9, 100 * (ta / tb - 1),
           fl / tt / 1e9, ts / wb * 1e12, 100 * ts / ta, 100 * tx / ta);
  }
}

int main() {
  printf("Tiles (GFLOP/s = 2*rows*inputs*K / call time; staging = the (a) transpose alone; bits: memcmp vs the\n"
         "scalar reference of each order, both kernels)\n\n");
  printf("| shape RxT | K | batch | weights | bits | (b) GFLOP/s | (a) GFLOP/s | (a) slower by | (a) tile alone GFLOP/s |"
         " staging ps/B | staging share of (a) | x permute share of (a) |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int K : {576, 1536}) {
    tile_rows<3, 4>(K, 16, "batch16");
    tile_rows<6, 2>(K, 16, "batch16");
    tile_rows<4, 3>(K, 48, "prefill");
    tile_rows<3, 4>(K, 48, "prefill");
  }
  printf("\nBatch 1 (one input, all rows from memory, ~128 MB of bf16 weights)\n\n");
  printf("| K | rows | bits | (b) GB/s | (a) GB/s | (a) slower by |\n|---|---|---|---|---|---|\n");
  for (int K : {576, 1536}) {
    const int rows = (int)((128ll << 20) / (2ll * K)) / 24 * 24;
    Problem p(rows, K, 1);
    Problem c(96, K, 1);
    gemv_b(c.W.data(), c.N, K, c.X.data(), c.Y.data());
    const bool okb = c.check(false);
    permute_x(c.X.data(), 1, K, c.XP.data());
    gemv_a(P, c.W.data(), c.N, K, c.XP.data(), c.Y.data());
    const bool oka = c.check(true);
    failures += !okb + !oka;
    const double tb = seconds([&] { gemv_b(p.W.data(), p.N, K, p.X.data(), p.Y.data()); });
    const double ta = seconds([&] {
      permute_x(p.X.data(), 1, K, p.XP.data());
      gemv_a(P, p.W.data(), p.N, K, p.XP.data(), p.Y.data());
    });
    const double wb = 2.0 * p.N * K;
    printf("| %4d | %6d | %-4s | %6.1f | %6.1f | %5.1f%% |\n", K, rows, okb && oka ? "ok" : "FAIL", wb / tb / 1e9,
           wb / ta / 1e9, 100 * (ta / tb - 1));
  }
  if (failures) printf("\n%d bit-exactness FAILURES\n", failures);
  return failures != 0;
}
