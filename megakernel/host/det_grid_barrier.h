// det_grid_barrier.h: the GPU's grid barriers (megakernel/det_simt.h, the thread-0 part of
// det_sync_grid and det_sync_grid_counter) and its arrival count (det_warp_arrive's lane 0) written
// line for line in C++ atomics, so that the host can run it between real OS
// threads: the SIMT emulation's thread-per-block mode (det_simt_host.cpp, DET_SIMT_MODES=threads)
// and the litmus test (tests/native/grid_barrier_litmus.cpp) both call this function.
//
// From the PTX the GPU side compiles to (PTX ISA, memory consistency model) to C++:
//   volatile load of the generation   ld.volatile (relaxed)           -> relaxed atomic load
//   atomicAdd / atomicExch             atom, no .sem (relaxed)         -> relaxed atomic RMW
//   __threadfence()                    membar.gl (= fence.sc.gpu)      -> seq_cst fence
//   __nanosleep()                      timing only                     -> sched_yield()
//
//   g = gen                         // relaxed
//   F1                              // this block's writes (ordered by bar.sync) before its arrival
//   if (count++ == blocks - 1) {    // relaxed RMW
//     count = 0                     // relaxed RMW
//     F2                            // the last arrival: every arrival before the new generation
//     gen++                         // relaxed RMW
//   } else {
//     while (gen == g) yield        // relaxed loads
//   }
//   F3                              // the new generation before this block's reads after bar.sync
//
// ThreadSanitizer does not model fences (GCC warns that atomic_thread_fence is unsupported; LLVM's
// runtime treats one as a plain hardware fence), so under TSan each fence is folded into the
// atomics it orders, which gives the same happens-before edges: F1 makes the arrival a release; F2
// makes the reset an acquire (it reads the last arrival, the end of every arrival's release
// sequence) and the bump a release; F3 makes the arrival and the waiting loads acquires. A test
// build may leave one fence out (-DDET_GRID_BARRIER_TEST_DROP=1, 2 or 3; or -1 and the variable
// det_grid_barrier_drop chooses at run time): under TSan its orders go too, and the missing edge
// shows as a data race on the blocks' data.
#pragma once

#include <sched.h>

#if defined(__SANITIZE_THREAD__)
#define DET_GRID_BARRIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DET_GRID_BARRIER_TSAN 1
#endif
#endif

#ifndef DET_GRID_BARRIER_TEST_DROP
#define DET_GRID_BARRIER_TEST_DROP 0  // the real barrier: every fence kept
#endif
#if DET_GRID_BARRIER_TEST_DROP < 0
extern int det_grid_barrier_drop;  // a test build chooses the dropped fence at run time
#endif

// Drop: the fence left out (0: none). Every memory order is a constant: a builtin given a run-time
// order is compiled as seq_cst, which would hide a dropped order.
template <int Drop, class GiveUp>
inline bool det_grid_barrier_impl(unsigned int* bar, unsigned int blocks, GiveUp give_up) {
  constexpr bool f1 = Drop != 1, f2 = Drop != 2, f3 = Drop != 3;
#if defined(DET_GRID_BARRIER_TSAN)
  constexpr bool fences = false;
  constexpr int arrive_order = f1 ? (f3 ? __ATOMIC_ACQ_REL : __ATOMIC_RELEASE)
                                  : (f3 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
  constexpr int reset_order = f2 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED;
  constexpr int bump_order = f2 ? __ATOMIC_RELEASE : __ATOMIC_RELAXED;
  constexpr int wait_order = f3 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED;
#else
  constexpr bool fences = true;
  constexpr int arrive_order = __ATOMIC_RELAXED, reset_order = __ATOMIC_RELAXED, bump_order = __ATOMIC_RELAXED,
                wait_order = __ATOMIC_RELAXED;
#endif
  unsigned int* gen = bar + 1;
  const unsigned int g = __atomic_load_n(gen, __ATOMIC_RELAXED);
  if constexpr (fences && f1) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_fetch_add(bar, 1u, arrive_order) == blocks - 1) {
    __atomic_exchange_n(bar, 0u, reset_order);
    if constexpr (fences && f2) __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_fetch_add(gen, 1u, bump_order);
  } else {
    while (__atomic_load_n(gen, wait_order) == g) {
      if (give_up()) return false;
      sched_yield();
    }
  }
  if constexpr (fences && f3) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return true;
}

// The monotonic grid barrier (det_simt.h's det_sync_grid_counter, geometry barrier 1): one 64-bit
// arrival count, never reset; a block adds its arrival and waits until the count reaches
// `arrivals` (blocks x the barriers this block has passed, this one included):
//   F1                                  // this block's writes before its arrival
//   count++                             // relaxed RMW (a reduction on the GPU)
//   while (count < arrivals) yield      // relaxed loads
//   F3                                  // every arrival before this block's reads
// Under TSan, as above: F1 makes the arrival a release, F3 the arrival and the waiting loads
// acquires. The same Drop values (1 and 3; there is no reset, so no F2) leave a fence out.
template <int Drop, class GiveUp>
inline bool det_grid_counter_impl(unsigned long long* count, unsigned long long arrivals, GiveUp give_up) {
  constexpr bool f1 = Drop != 1, f3 = Drop != 3;
#if defined(DET_GRID_BARRIER_TSAN)
  constexpr bool fences = false;
  constexpr int arrive_order = f1 ? (f3 ? __ATOMIC_ACQ_REL : __ATOMIC_RELEASE)
                                  : (f3 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
  constexpr int wait_order = f3 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED;
#else
  constexpr bool fences = true;
  constexpr int arrive_order = __ATOMIC_RELAXED, wait_order = __ATOMIC_RELAXED;
#endif
  if constexpr (fences && f1) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_fetch_add(count, 1ull, arrive_order);
  while (__atomic_load_n(count, wait_order) < arrivals) {
    if (give_up()) return false;
    sched_yield();
  }
  if constexpr (fences && f3) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return true;
}

// The arrival count (det_simt.h's det_warp_arrive: split attention's units of one (row, query
// pair), the last of which folds their partials; docs/SPEC.md §14.2): lane 0 of a warp whose lanes
// have written their part adds its arrival to a 32-bit count and learns how many came before it:
//   F4                                  // the warp's writes before its arrival (release)
//   old = count++                       // relaxed RMW, its result used
//   F5                                  // the earlier arrivals' writes before this warp's reads (acquire)
// Under TSan, as above: F4 makes the add a release, F5 an acquire. A test build drops F4 or F5
// with Drop 4 or 5 (the barrier's own fences are 1 to 3).
template <int Drop>
inline unsigned int det_arrival_impl(unsigned int* count) {
  constexpr bool f4 = Drop != 4, f5 = Drop != 5;
#if defined(DET_GRID_BARRIER_TSAN)
  constexpr bool fences = false;
  constexpr int order = f4 ? (f5 ? __ATOMIC_ACQ_REL : __ATOMIC_RELEASE) : (f5 ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
#else
  constexpr bool fences = true;
  constexpr int order = __ATOMIC_RELAXED;
#endif
  if constexpr (fences && f4) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  const unsigned int old = __atomic_fetch_add(count, 1u, order);
  if constexpr (fences && f5) __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return old;
}

// Thread 0 of a block, between two block barriers: waits until all `blocks` blocks have arrived.
// bar[0] counts arrivals, bar[1] is the generation (both zero before the first use). give_up() is
// polled while waiting; when it returns true the wait is abandoned and false returned (a deadlock
// elsewhere in the launch). Returns true once every block has arrived.
template <class GiveUp>
inline bool det_grid_barrier(unsigned int* bar, unsigned int blocks, GiveUp give_up) {
#if DET_GRID_BARRIER_TEST_DROP < 0
  switch (det_grid_barrier_drop) {
    case 1: return det_grid_barrier_impl<1>(bar, blocks, give_up);
    case 2: return det_grid_barrier_impl<2>(bar, blocks, give_up);
    case 3: return det_grid_barrier_impl<3>(bar, blocks, give_up);
    default: break;
  }
#endif
  return det_grid_barrier_impl<DET_GRID_BARRIER_TEST_DROP < 0 ? 0 : DET_GRID_BARRIER_TEST_DROP>(bar, blocks, give_up);
}

// The same wait by the monotonic counter (bar[0..1] one 64-bit count, 8-byte aligned, zero before
// the first use): returns once the count has reached `arrivals`.
template <class GiveUp>
inline bool det_grid_counter(unsigned int* bar, unsigned long long arrivals, GiveUp give_up) {
  unsigned long long* count = reinterpret_cast<unsigned long long*>(bar);
#if DET_GRID_BARRIER_TEST_DROP < 0
  switch (det_grid_barrier_drop) {
    case 1: return det_grid_counter_impl<1>(count, arrivals, give_up);
    case 3: return det_grid_counter_impl<3>(count, arrivals, give_up);
    default: break;
  }
#endif
  return det_grid_counter_impl<DET_GRID_BARRIER_TEST_DROP < 0 ? 0 : DET_GRID_BARRIER_TEST_DROP>(count, arrivals,
                                                                                              give_up);
}

// The arrival count's add (det_arrival_impl): returns the arrivals before this one.
inline unsigned int det_arrival(unsigned int* count) {
#if DET_GRID_BARRIER_TEST_DROP < 0
  switch (det_grid_barrier_drop) {
    case 4: return det_arrival_impl<4>(count);
    case 5: return det_arrival_impl<5>(count);
    default: break;
  }
#endif
  return det_arrival_impl<DET_GRID_BARRIER_TEST_DROP < 0 ? 0 : DET_GRID_BARRIER_TEST_DROP>(count);
}
