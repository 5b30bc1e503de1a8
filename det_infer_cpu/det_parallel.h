// det_parallel.h: the CPU engine's ways to split work across threads: static chunks of an index
// range, or its tasks round robin; each thread under its own FP-environment guard. Splitting
// decides only which thread computes an output, never how: no reduction ever crosses a task.
#pragma once

#include <stdint.h>

#include "det_fpenv.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(DET_CPU_NO_CLONES)
// Hot loops are compiled for the baseline ISA and for x86-64-v3 (AVX2 + FMA), chosen at load
// time; same source, same operations (tests/test_build_invariance.py holds them to one digest).
#define DET_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DET_CPU_CLONES
#endif

// Runs body(t, nt) on each of the nt threads of one OpenMP team (t = 0 .. nt-1), each under its
// own FP-environment guard.
template <typename Body>
void det_parallel_team(Body body) {
#pragma omp parallel
  {
    det_fpenv_guard env;
    int64_t nt = 1, t = 0;
#if defined(_OPENMP)
    nt = omp_get_num_threads();
    t = omp_get_thread_num();
#endif
    body(t, nt);
  }
}

// The threads a parallel region of this thread would run (1 without OpenMP).
inline int64_t det_parallel_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Inside det_parallel_team's body: waits until every thread of the team has reached it.
inline void det_parallel_barrier() {
#if defined(_OPENMP)
#pragma omp barrier
#endif
}

// Runs body(begin, end) over [0, n), one static chunk per OpenMP thread. Ranges shorter than
// min_parallel run on the calling thread (which must hold its own det_fpenv_guard), since waking
// the team costs more than the work.
template <typename Body>
void det_parallel_chunks(int64_t n, Body body, int64_t min_parallel = 1) {
  if (n < min_parallel) {
    if (n > 0) body(0, n);
    return;
  }
  det_parallel_team([&](int64_t t, int64_t nt) {
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) body(begin, end);
  });
}

// Runs body(first, step) once per OpenMP thread: the thread takes tasks first, first + step, ... of
// [0, n) (round robin). For tasks whose cost grows along the range (attention rows at increasing
// positions), where static chunks would leave the last thread the heaviest share.
template <typename Body>
void det_parallel_round_robin(int64_t n, Body body) {
  det_parallel_team([&](int64_t t, int64_t nt) {
    if (t < n) body(t, nt);
  });
}
