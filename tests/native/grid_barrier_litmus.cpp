// grid_barrier_litmus.cpp: the grid barrier (megakernel/host/det_grid_barrier.h, the GPU's
// algorithm in C++ atomics: relaxed loads and RMWs, seq_cst fences where the PTX has
// fence.sc.gpu) as a message-passing litmus test, stressed over real OS threads. No model checker
// installs here from Debian or PyPI (GenMC, herd7, CDSChecker, CBMC: none is packaged), so the
// test is a stress run on this host, on aarch64 under qemu-user, and under ThreadSanitizer, which
// checks happens-before rather than timing (tests/test_emulation_modes.py).
//
// T threads ("blocks") pass I barriers. Before barrier k each writes its slot of buffer k % 2
// (plain, non-atomic stores, as the kernel's global memory is); after it each reads every other
// thread's slot and must see the value of round k: a barrier that lets a block through early, or
// lets its reads run ahead of the others' writes, shows as a stale value (and, under TSan, as a data
// race). A barrier that hangs is stopped by an alarm. Buffer k % 2 is next written in round k + 2,
// after barrier k + 1, which every reader of round k must have reached first.
//   grid_barrier_litmus THREADS ROUNDS [SECONDS [counter|arrival]]   prints "litmus ok" or "litmus
//   FAILED <stale reads>"; with `counter`, the monotonic barrier (det_grid_counter) instead of the
//   generation barrier; with `arrival`, the arrival count (det_arrival, split attention's units):
//   in round k each thread writes its slot and arrives, and only the last arrival reads every slot
//   (the fold) and sets the count back to zero, before the generation barrier ends the round
// A test build with -DDET_GRID_BARRIER_TEST_DROP=-1 takes the fence to leave out from the
// environment (DET_GRID_BARRIER_TEST_DROP=1, 2 or 3 the barrier's, 4 or 5 the arrival's): the
// negative control.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include <chrono>
#include <thread>
#include <vector>

#include "megakernel/host/det_grid_barrier.h"

#if DET_GRID_BARRIER_TEST_DROP < 0
int det_grid_barrier_drop = getenv("DET_GRID_BARRIER_TEST_DROP") ? atoi(getenv("DET_GRID_BARRIER_TEST_DROP")) : 0;
#endif

namespace {

alignas(8) unsigned int g_bar[2];
bool g_counter = false;  // the monotonic barrier
bool g_arrival = false;  // the arrival count
unsigned int g_count = 0;  // the arrival count (atomics)
long g_lasts = 0;          // rounds whose last arrival read the slots (written by that arrival only)

// A thread's next barrier; passed: the barriers it has passed (the monotonic one waits for T each).
void barrier(unsigned int T, unsigned long long& passed) {
  ++passed;
  if (g_counter) det_grid_counter(g_bar, passed * T, [] { return false; });
  else det_grid_barrier(g_bar, T, [] { return false; });
}
long g_stale = 0;      // atomic
int g_stop = 0;        // atomic: the last round, once thread 0 has chosen it
int g_rounds_run = 0;  // written by thread 0 at the end

void on_alarm(int) {
  static const char msg[] = "litmus HANG\n";
  (void)!write(1, msg, sizeof msg - 1);
  _exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 4, rounds = argc > 2 ? atoi(argv[2]) : 10000;
  const double seconds = argc > 3 ? atof(argv[3]) : 2.0;
  g_counter = argc > 4 && std::string(argv[4]) == "counter";
  g_arrival = argc > 4 && std::string(argv[4]) == "arrival";
  if (T < 2 || rounds < 2) return 1;
  signal(SIGALRM, on_alarm);
  alarm(60 + (unsigned)seconds);
  const auto start = std::chrono::steady_clock::now();
  std::vector<unsigned int> data(2 * (size_t)T, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < T; ++t)
    threads.emplace_back([&data, &start, t, T, rounds, seconds]() {
      long stale = 0;
      unsigned long long passed = 0;
      for (int k = 0;; ++k) {
        unsigned int* buf = data.data() + (size_t)(k & 1) * T;
        buf[t] = (unsigned)k * (unsigned)T + (unsigned)t + 1u;
        if (g_arrival) {  // only the last arrival reads, then resets the count for the next round
          if (det_arrival(&g_count) == (unsigned)T - 1) {
            for (int u = 0; u < T; ++u) stale += buf[u] != (unsigned)k * (unsigned)T + (unsigned)u + 1u;
            g_count = 0;  // plain, as the kernel's: the next arrivals come after the barrier
            ++g_lasts;
          }
          barrier((unsigned)T, passed);
        } else {
          barrier((unsigned)T, passed);
          for (int u = 0; u < T; ++u) stale += buf[u] != (unsigned)k * (unsigned)T + (unsigned)u + 1u;
        }
        // A second barrier every third round varies the spacing between the writes and the reads.
        if (k % 3 == 2) barrier((unsigned)T, passed);
        // Thread 0 ends the run after the next round (at the round count or the time limit); the
        // next barrier carries its decision to every thread before they check it again.
        const int stop = __atomic_load_n(&g_stop, __ATOMIC_RELAXED);
        if (stop && k >= stop) {
          if (t == 0) g_rounds_run = k + 1;
          break;
        }
        if (t == 0 && !stop &&
            (k + 2 >= rounds ||
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds))
          __atomic_store_n(&g_stop, k + 1, __ATOMIC_RELAXED);
      }
      __atomic_fetch_add(&g_stale, stale, __ATOMIC_RELAXED);
    });
  for (auto& t : threads) t.join();
  const int n = g_rounds_run;
  const unsigned int passes = (unsigned)n + (unsigned)(n / 3);
  unsigned long long count = 0;
  memcpy(&count, g_bar, sizeof count);
  if (g_counter ? g_stale || count != (unsigned long long)passes * (unsigned)T
                : g_stale || g_bar[0] != 0 || g_bar[1] != passes || (g_arrival && (g_count || g_lasts != n))) {
    printf("litmus FAILED %ld stale reads, count %u, generation %u, 64-bit count %llu (want %u passes), "
           "arrival count %u, last arrivals %ld (want %d)\n", g_stale, g_bar[0], g_bar[1], count, passes, g_count,
           g_lasts, n);
    return 1;
  }
  printf("litmus ok %d threads %d rounds\n", T, n);
  return 0;
}
