// det_attn_ahead.h: what every ISA version of one chunk's attention partials shares (AVX-512:
// det_attn_chunk_avx512.cpp and det_attn_lanes_avx512.cpp; AVX2: det_attn_chunk_avx2.cpp): the
// next chunk's rows requested while this one computes, and the key panels widened where the
// cache ends inside one. Baseline code, so that a caller of any ISA may inline it.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "../det_kernels_cpu.h"

// Cached rows come from memory (a head's K and V are 2 x 32 KB a chunk at D = 64). While a chunk
// computes, the next one's K and V are requested into L2 a share at a time as its work goes on:
// asked for all at once, or all during the short V pass, they filled the miss queues and stalled
// the requests themselves (perf, 2026-12-05). Requests are hints only: nothing is read.
struct det_attn_ahead {
  const char *k = nullptr, *v = nullptr;
  int64_t lines = 0, done = 0;  // lines of K (as many of V); requests issued, of 2 * lines
  det_attn_ahead(const det_attn_rows& next, int64_t D)
      : k((const char*)next.k), v((const char*)next.v), lines(next.k ? (next.n * D * 4 + 63) / 64 : 0) {}
  // Requests the next chunk's lines, K and V alternately, up to the fraction num / den of them.
  void upto(int64_t num, int64_t den) {
    for (const int64_t n = 2 * lines * num / den; done < n; ++done)
      _mm_prefetch((done & 1 ? v : k) + 64 * (done >> 1), _MM_HINT_T1);
  }
};
// The shares of the next chunk's lines requested by the end of each phase of this one, in
// hundredths: about each phase's share of the time (scores, then the exps and sums, then V).
constexpr int kDetAheadScores = 40, kDetAheadExp = 65;

// The chunk's key panels that hold slots u0..u1, kt[(j / 16) * 16 D + 16 d + j % 16] = slot j's
// element d: the cache itself (§13.8 stores keys so), unless the capacity ends inside one of them;
// then they are copied into buf, the narrow panel widened to 16 with zeros.
inline const float* det_attn_wide_panels(const det_attn_rows& rows, int64_t D, int u0, int u1, std::vector<float>& buf) {
  const int last = u1 / DET_KV_PANEL * DET_KV_PANEL;
  if (last + DET_KV_PANEL <= rows.n) return rows.k;
  buf.resize(DET_ATTN_CHUNK * D);
  for (int b = u0 / DET_KV_PANEL * DET_KV_PANEL; b < last; b += DET_KV_PANEL)
    memcpy(buf.data() + b * D, rows.k + b * D, DET_KV_PANEL * D * sizeof(float));
  const int64_t w = rows.n - last;
  for (int64_t d = 0; d < D; ++d)
    for (int t = 0; t < DET_KV_PANEL; ++t)
      buf[last * D + d * DET_KV_PANEL + t] = t < w ? rows.k[last * D + d * w + t] : 0.0f;
  return buf.data();
}
