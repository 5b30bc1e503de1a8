// det_argmax.h: greedy selection (docs/SPEC.md §10). A total order on (value, id): NaN ranks
// above every number (so a NaN logit is never hidden), larger values rank higher, +0 and -0 are
// equal, and among equals the lowest id wins. Because the order is total, any reduction tree
// over any partition of the ids returns the same id.
#pragma once

#include "det_round.h"

// True when candidate (va, ia) ranks strictly above (vb, ib).
DET_HD bool det_argmax_better(float va, long long ia, float vb, long long ib) {
  bool na = det_isnan_f32(va), nb = det_isnan_f32(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// Reference: the id of the best of v[0..n), n >= 1.
DET_HD long long det_argmax_f32_ref(const float* v, long long n) {
  long long best = 0;
  for (long long i = 1; i < n; ++i)
    if (det_argmax_better(v[i], i, v[best], best)) best = i;
  return best;
}
