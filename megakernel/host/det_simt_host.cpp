// det_simt_host.cpp: the host side of the SIMT layer (megakernel/det_simt.h). Every CUDA thread is
// a fiber with its own stack; a fiber runs until it synchronizes, then the scheduler picks another
// runnable one. Barriers (block, warp, grid) and warp exchanges are rendezvous: the last fiber to
// arrive releases the others. Because fibers switch only there, a missing barrier in the kernel
// shows up as a read of data not yet written under some schedule, and seeded random schedules look
// for one.
//
// By default every fiber runs on the calling OS thread, async copies land at once and shared
// memory is zeroed (with 16 bytes of slack). DET_SIMT_MODES (a comma-separated list, read at each
// launch) makes the emulation hide less (docs/SPEC.md §14.4):
//   async    cp.async is deferred: at issue the destination is filled with NaN words (and, under
//            AddressSanitizer, poisoned: a read of it is a report); the bytes land only at the
//            cp.async.wait_group that covers their group, in an order drawn from the schedule seed.
//   smem     shared memory is exactly det_mk_smem_bytes long (an overrun under AddressSanitizer is a
//            report) and filled with a pattern of NaN words with seeded garbage payloads, different
//            per block and seed, instead of zeros.
//   threads  each block runs on its own OS thread (its warps' fibers inside), and the grid barrier
//            is the GPU's algorithm on the kernel's barrier words with real atomics and fences
//            (det_grid_barrier.h); under ThreadSanitizer the fiber switches are annotated, so a
//            missing edge between blocks is a reported data race.
//   strict   all three.
// With a correct kernel every mode gives the same bits as the default.
#include "det_simt_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "../det_simt.h"
#include "det_grid_barrier.h"

// AddressSanitizer must be told about every stack switch, or it reports the fibers' stacks as
// wild accesses (tests/test_emulation_sanitized.py builds this file with -fsanitize=address).
#if defined(__SANITIZE_ADDRESS__)
#define DET_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DET_SIMT_ASAN 1
#endif
#endif
#if defined(DET_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
// ThreadSanitizer is told about every fiber and every switch; a switch synchronizes, so within a
// block the fibers are ordered by the schedule and TSan checks what crosses between blocks.
#if defined(DET_GRID_BARRIER_TSAN)
#include <sanitizer/tsan_interface.h>
#define DET_SIMT_TSAN 1
#endif

// ---- context switch -----------------------------------------------------------------------------
// x86-64: save the callee-saved registers, MXCSR and the x87 control word on the current stack,
// store the stack pointer, load the other one and restore. Elsewhere: ucontext (slower, same
// semantics).
#if defined(__x86_64__)
extern "C" void det_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl det_simt_switch
  .type det_simt_switch, @function
det_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size det_simt_switch, .-det_simt_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#else
#include <ucontext.h>
#endif

#if DET_GRID_BARRIER_TEST_DROP < 0
// A test build's negative control: the grid barrier's fence to leave out (1, 2 or 3; 0: none).
int det_grid_barrier_drop = getenv("DET_GRID_BARRIER_TEST_DROP") ? atoi(getenv("DET_GRID_BARRIER_TEST_DROP")) : 0;
#endif

namespace det_simt_host {

// Launches running with deferred async copies, in this process (det_simt.h's shims call the
// functions below while it is nonzero; each of those checks its own launch's mode).
int deferred_async = 0;
// Launches counting a work profile, in this process.
int work_counting = 0;

namespace {

constexpr size_t kStackBytes = 128 * 1024;  // the deepest kernel frame uses a few KiB
constexpr int kMaxWords = 128;  // largest warp exchange (the kernel needs 16: one per batch row)
constexpr int kAsync = 1, kSmem = 2, kThreads = 4;

struct Copy {  // one deferred cp.async
  void* dst;
  const void* src;
  int bytes;
  int64_t group;
};

struct Fiber {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  unsigned char* stack_lo = nullptr;  // lowest usable byte of the fiber's stack
  void* asan_fake_stack = nullptr;
  void* tsan_fiber = nullptr;
  int tid = 0, bid = 0;
  int xphase = 0;  // which of the warp's two exchange buffers this lane uses next
  int64_t phase = 0;  // grid synchronizations this thread has passed (the work profile's phase)
  bool done = false;
  std::vector<Copy> copies;  // async mode: issued, not landed, in issue order
  int64_t committed = 0;     // groups committed so far (the open group's index)
};

struct Rendezvous {
  int expected = 0, arrived = 0;
  std::vector<Fiber*> waiting;
};

struct WarpExchange {
  uint32_t words[2][DET_WARP][kMaxWords];
};

struct Launch {
  int grid = 0, block = 0, modes = 0;
  uint64_t seed = 0;
  void (*kernel)(void*) = nullptr;
  void* arg = nullptr;
  std::vector<Fiber> fibers;
  std::vector<std::vector<unsigned char>> smem_zeroed;  // default: per block, zeroed, 16 bytes of slack
  std::vector<unsigned char*> smem;                     // per block
  std::vector<Rendezvous> block_bar, warp_bar;
  Rendezvous grid_bar;                                  // one OS thread: the grid is a rendezvous
  std::vector<WarpExchange> xch;                        // per warp
  unsigned char* stacks = nullptr;
  size_t stacks_bytes = 0;
  alignas(8) unsigned int own_bar[2] = {0, 0};  // threads mode, for a kernel that passes no barrier words
  int stuck = 0, exited = 0;         // threads mode: blocks deadlocked, blocks finished (atomics)
  size_t smem_bytes = 0;
  WorkProfile* work = nullptr;       // counting, or null
};

// One OS thread's scheduler: all the fibers, or (threads mode) one block's.
struct Sched {
  Launch* L = nullptr;
  Fiber* cur = nullptr;
  std::vector<Fiber*> runnable;
  uint64_t rng = 0;
  bool pick_first = false;  // seed 0: a fixed order
#if defined(__x86_64__)
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  const void* sched_stack_lo = nullptr;  // the scheduler's (the OS thread's) stack, for ASan
  size_t sched_stack_size = 0;
  void* sched_fake_stack = nullptr;
  void* tsan_self = nullptr;
};

thread_local Sched* g_sched = nullptr;

uint64_t next_random(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A NaN word (fp32 quiet NaN, negative; its upper half a bf16 NaN) with a seeded garbage payload.
uint32_t poison_word(uint64_t& s) { return 0xffc00000u | (uint32_t)(next_random(s) & 0x3fffffu); }

void fill_poison(unsigned char* p, size_t bytes, uint64_t& s) {
  size_t i = 0;
  for (; i + 4 <= bytes; i += 4) {
    const uint32_t w = poison_word(s);
    memcpy(p + i, &w, 4);
  }
  for (; i < bytes; ++i) p[i] = 0xff;
}

void to_scheduler(Fiber* f) {
  Sched* S = g_sched;
#if defined(DET_SIMT_ASAN)
  // A finished fiber's stack is gone for good: no fake stack to keep.
  __sanitizer_start_switch_fiber(f->done ? nullptr : &f->asan_fake_stack, S->sched_stack_lo, S->sched_stack_size);
#endif
#if defined(DET_SIMT_TSAN)
  __tsan_switch_to_fiber(S->tsan_self, 0);
#endif
#if defined(__x86_64__)
  det_simt_switch(&f->sp, S->sched_sp);
#else
  swapcontext(&f->ctx, &S->sched);
#endif
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f->asan_fake_stack, nullptr, nullptr);
#endif
}

// The scheduler side of a switch into fiber f and back.
void run_fiber(Sched& S, Fiber* f) {
  S.cur = f;
#if defined(DET_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&S.sched_fake_stack, f->stack_lo, kStackBytes);
#endif
#if defined(DET_SIMT_TSAN)
  __tsan_switch_to_fiber(f->tsan_fiber, 0);
#endif
#if defined(__x86_64__)
  det_simt_switch(&S.sched_sp, f->sp);
#else
  swapcontext(&S.sched, &f->ctx);
#endif
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(S.sched_fake_stack, &S.sched_stack_lo, &S.sched_stack_size);
#endif
}

void land(Fiber* f, int64_t below);

void fiber_main() {
  Sched* S = g_sched;
  Fiber* f = S->cur;
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &S->sched_stack_lo, &S->sched_stack_size);
#endif
  S->L->kernel(S->L->arg);
  land(f, INT64_MAX);  // copies never waited for still complete when the kernel ends
  f->done = true;
  to_scheduler(f);
  abort();  // a finished fiber is never resumed
}

// Arrive at a rendezvous; returns once every expected fiber has arrived.
void arrive(Rendezvous& r) {
  Sched* S = g_sched;
  Fiber* self = S->cur;
  if (++r.arrived == r.expected) {
    r.arrived = 0;
    for (Fiber* w : r.waiting) S->runnable.push_back(w);
    r.waiting.clear();
    S->runnable.push_back(self);  // stay runnable, but let the scheduler choose who goes first
  } else {
    r.waiting.push_back(self);
  }
  to_scheduler(self);
}

void setup_fiber(Fiber& f, unsigned char* stack_top) {
#if defined(__x86_64__)
  // The frame det_simt_switch pops: MXCSR/x87 word, six registers, then the return address
  // fiber_main; above it a dummy return slot so fiber_main starts with rsp % 16 == 8 (ABI).
  uintptr_t top = (uintptr_t)stack_top & ~(uintptr_t)15;
  void** sp = (void**)top;
  *--sp = nullptr;                 // fiber_main's return address (never used)
  *--sp = (void*)&fiber_main;      // where the first switch "returns" to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  --sp;
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  memcpy(sp, &mxcsr, 4);
  memcpy((char*)sp + 4, &fpcw, 2);
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack_top - kStackBytes;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, (void (*)())fiber_main, 0);
#endif
#if defined(DET_SIMT_TSAN)
  f.tsan_fiber = __tsan_create_fiber(0);
#endif
}

// Runs this scheduler's fibers until none is runnable (all finished, or a deadlock).
void schedule(Sched& S) {
  g_sched = &S;
#if defined(DET_SIMT_TSAN)
  S.tsan_self = __tsan_get_current_fiber();
#endif
  while (!S.runnable.empty()) {
    size_t pick = 0;
    if (!S.pick_first) pick = next_random(S.rng) % S.runnable.size();
    Fiber* f = S.runnable[pick];
    S.runnable[pick] = S.runnable.back();
    S.runnable.pop_back();
    run_fiber(S, f);
  }
  g_sched = nullptr;
}

// ---- deferred async copies ----------------------------------------------------------------------
// Lands fiber f's copies of groups below `below`, in an order drawn from the schedule seed (copies
// into one destination in flight together: the later landing wins, as on hardware either may).
void land(Fiber* f, int64_t below) {
  size_t n = 0;
  while (n < f->copies.size() && f->copies[n].group < below) ++n;
  if (n == 0) return;
  uint64_t& rng = g_sched->rng;
  for (size_t i = n; i > 1; --i) std::swap(f->copies[i - 1], f->copies[next_random(rng) % i]);
  for (size_t i = 0; i < n; ++i) {
    const Copy& c = f->copies[i];
#if defined(DET_SIMT_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(c.dst, c.bytes);
#endif
    memcpy(c.dst, c.src, c.bytes);
  }
  f->copies.erase(f->copies.begin(), f->copies.begin() + n);
}

// Thread 0's part of the grid barrier in threads mode (the generation barrier, or with arrivals > 0
// the monotonic one); false when the launch can never finish.
bool grid_barrier(Launch& L, unsigned int* bar, unsigned long long arrivals) {
  time_t first_exit = 0;
  auto give_up = [&]() {
    // Relaxed: giving up must not add a happens-before edge that TSan would then not check.
    if (__atomic_load_n(&L.stuck, __ATOMIC_RELAXED)) return true;
    // A block that finished while this one waits: normal on the last barrier for a moment (the
    // bump is on its way), a deadlock if the generation still has not moved a few seconds later.
    if (!__atomic_load_n(&L.exited, __ATOMIC_RELAXED)) return false;
    if (!first_exit) first_exit = time(nullptr);
    return time(nullptr) - first_exit > 3;
  };
  unsigned int* words = bar ? bar : L.own_bar;
  return arrivals ? det_grid_counter(words, arrivals, give_up) : det_grid_barrier(words, (unsigned)L.grid, give_up);
}

int parse_modes() {
  const char* env = getenv("DET_SIMT_MODES");
  if (!env || !*env) return 0;
  int modes = 0;
  const char* p = env;
  while (*p) {
    const char* e = p;
    while (*e && *e != ',') ++e;
    const size_t n = (size_t)(e - p);
    auto is = [&](const char* w) { return strlen(w) == n && strncmp(p, w, n) == 0; };
    if (is("async")) modes |= kAsync;
    else if (is("smem")) modes |= kSmem;
    else if (is("threads")) modes |= kThreads;
    else if (is("strict")) modes |= kAsync | kSmem | kThreads;
    else if (n && !is("default")) {
      fprintf(stderr, "DET_SIMT_MODES: unknown mode '%.*s' (async, smem, threads, strict)\n", (int)n, p);
      abort();
    }
    p = *e ? e + 1 : e;
  }
  return modes;
}

}  // namespace

int thread_idx() { return g_sched->cur->tid; }
int block_dim() { return g_sched->L->block; }
int block_idx() { return g_sched->cur->bid; }
int grid_dim() { return g_sched->L->grid; }
unsigned char* smem() { return g_sched->L->smem[g_sched->cur->bid]; }
uint64_t globaltimer() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sync_block() { arrive(g_sched->L->block_bar[g_sched->cur->bid]); }

namespace {
// This thread's counters in the current launch's work profile, or null. A block's counters are
// written only by its own fibers, which in threads mode share one OS thread: no races.
int64_t* work_slot() {
  if (!g_sched) return nullptr;
  Launch* L = g_sched->L;
  const Fiber* f = g_sched->cur;
  if (!L->work || f->phase >= L->work->phases_cap) return nullptr;
  const int64_t warps = (int64_t)L->grid * L->block / DET_WARP, warp = ((int64_t)f->bid * L->block + f->tid) / DET_WARP;
  return L->work->counts + (f->phase * warps + warp) * kWorkKinds;
}
}  // namespace

void work_load(const void* p, int bytes) {
  int64_t* w = work_slot();
  if (!w) return;
  const unsigned char* s = g_sched->L->smem[g_sched->cur->bid];
  const bool shared = (const unsigned char*)p >= s && (const unsigned char*)p < s + g_sched->L->smem_bytes + 16;
  w[shared ? kSharedBytes : kGlobalBytes] += bytes;
  w[kLoads] += 1;
}

void work_fma(int n) {
  if (int64_t* w = work_slot()) w[kFmas] += n;
}

void sync_warp() {
  Launch* L = g_sched->L;
  arrive(L->warp_bar[(g_sched->cur->bid * L->block + g_sched->cur->tid) / DET_WARP]);
}

unsigned int arrival(unsigned int* count) { return det_arrival(count); }

void sync_grid(unsigned int* bar, unsigned long long arrivals) {
  Launch* L = g_sched->L;
  ++g_sched->cur->phase;  // the work after this barrier is the next phase's (counted by this thread)
  if (!(L->modes & kThreads)) return arrive(L->grid_bar);
  // As on the GPU: the block meets, thread 0 meets the other blocks, the block meets again.
  sync_block();
  if (g_sched->cur->tid == 0 && !grid_barrier(*L, bar, arrivals)) {
    Fiber* self = g_sched->cur;
    to_scheduler(self);  // parked: never runnable again, so this block ends unfinished
  }
  sync_block();
}

// Two buffers alternate: a lane can be at most one exchange ahead of the slowest lane of its warp
// (the next exchange's rendezvous waits for it), so the buffer it writes is never one still read.
// Every lane of the warp offers n words; returns the buffer holding all lanes' offers, once all
// have arrived.
using LaneWords = uint32_t[kMaxWords];
static LaneWords* offer(const uint32_t* words, int n) {
  Launch* L = g_sched->L;
  Fiber* f = g_sched->cur;
  if (n > kMaxWords) abort();
  const int warp = (f->bid * L->block + f->tid) / DET_WARP;
  WarpExchange& x = L->xch[warp];
  const int ph = f->xphase;
  f->xphase ^= 1;
  memcpy(x.words[ph][f->tid % DET_WARP], words, n * sizeof(uint32_t));
  arrive(L->warp_bar[warp]);
  return x.words[ph];
}

void exchange(uint32_t* words, int n, int src, int mode) {
  const int lane = g_sched->cur->tid % DET_WARP;
  LaneWords* all = offer(words, n);
  int from = mode == DET_SHFL_DOWN ? lane + src : mode == DET_SHFL_XOR ? lane ^ src : src;
  if (from < 0 || from >= DET_WARP) from = lane;
  memcpy(words, all[from], n * sizeof(uint32_t));
}

uint32_t ballot(bool p) {
  const uint32_t w = p ? 1u : 0u;
  LaneWords* all = offer(&w, 1);
  uint32_t bits = 0;
  for (int l = 0; l < DET_WARP; ++l) bits |= all[l][0] << l;
  return bits;
}

void cp_async(void* dst, const void* src, int bytes) {
  if (!(g_sched->L->modes & kAsync)) return (void)memcpy(dst, src, bytes);  // another launch's mode
  Fiber* f = g_sched->cur;
  f->copies.push_back({dst, src, bytes, f->committed});
  fill_poison((unsigned char*)dst, (size_t)bytes, g_sched->rng);
#if defined(DET_SIMT_ASAN)
  // Whole 8-byte granules only (a 4-byte copy shares its granule with bytes the kernel may read).
  if ((uintptr_t)dst % 8 == 0 && bytes % 8 == 0) ASAN_POISON_MEMORY_REGION(dst, bytes);
#endif
}

void cp_async_commit() { ++g_sched->cur->committed; }

void cp_async_wait(int n) {
  Fiber* f = g_sched->cur;
  land(f, f->committed - n);  // nothing to land outside async mode
}

namespace {

int launch_impl(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg,
                WorkProfile* work) {
  if (grid < 1 || block < DET_WARP || block % DET_WARP || g_sched) return -1;
  Launch L;
  L.work = work;
  L.smem_bytes = smem_bytes;
  L.grid = grid;
  L.block = block;
  L.kernel = kernel;
  L.arg = arg;
  L.seed = seed;
  L.modes = parse_modes();
  const int n = grid * block;
  L.fibers.resize(n);
  std::vector<void*> smem_exact;  // smem mode: one allocation per block, exactly sized
  if (L.modes & kSmem) {
    uint64_t s = seed ^ 0x5eed5a1f0f5eedull;
    for (int b = 0; b < grid; ++b) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, smem_bytes ? smem_bytes : 1)) {
        for (void* q : smem_exact) free(q);
        return -1;
      }
      fill_poison((unsigned char*)p, smem_bytes, s);
      smem_exact.push_back(p);
      L.smem.push_back((unsigned char*)p);
    }
  } else {
    L.smem_zeroed.assign(grid, std::vector<unsigned char>(smem_bytes + 16, 0));
    for (auto& v : L.smem_zeroed) L.smem.push_back(v.data());
  }
  L.block_bar.resize(grid);
  for (auto& r : L.block_bar) r.expected = block;
  L.warp_bar.resize(n / DET_WARP);
  for (auto& r : L.warp_bar) r.expected = DET_WARP;
  L.grid_bar.expected = n;
  L.xch.resize(n / DET_WARP);

  // One mapping for every stack, each with a guard page below it: an overflow faults instead of
  // writing into a neighbour.
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), slot = kStackBytes + page;
  L.stacks_bytes = slot * n;
  void* mem = mmap(nullptr, L.stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    for (void* q : smem_exact) free(q);
    return -1;
  }
  L.stacks = (unsigned char*)mem;
  for (int i = 0; i < n; ++i) {
    mprotect(L.stacks + i * slot, page, PROT_NONE);
    Fiber& f = L.fibers[i];
    f.stack_lo = L.stacks + i * slot + page;
    f.bid = i / block;
    f.tid = i % block;
    setup_fiber(f, L.stacks + (i + 1) * slot);
  }

  if (L.modes & kAsync) __atomic_fetch_add(&deferred_async, 1, __ATOMIC_RELAXED);
  if (!(L.modes & kThreads)) {
    Sched S;
    S.L = &L;
    S.rng = seed;
    S.pick_first = seed == 0;
    for (Fiber& f : L.fibers) S.runnable.push_back(&f);
    schedule(S);
  } else {
    // One OS thread per block, its own scheduler and schedule stream.
    std::vector<Sched> scheds(grid);
    std::vector<std::thread> threads;
    for (int b = 0; b < grid; ++b) {
      Sched& S = scheds[b];
      S.L = &L;
      S.rng = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(b + 1));
      S.pick_first = seed == 0;
      for (int t = 0; t < block; ++t) S.runnable.push_back(&L.fibers[b * block + t]);
    }
    for (int b = 0; b < grid; ++b) {
      try {
        threads.emplace_back([&L, &scheds, b, block]() {
          schedule(scheds[b]);
          bool finished = true;
          for (int t = 0; t < block; ++t) finished = finished && L.fibers[b * block + t].done;
          __atomic_fetch_add(finished ? &L.exited : &L.stuck, 1, __ATOMIC_RELAXED);
        });
      } catch (...) {
        __atomic_fetch_add(&L.stuck, 1, __ATOMIC_RELAXED);  // the started blocks give up
        break;
      }
    }
    for (auto& t : threads) t.join();
  }
  if (L.modes & kAsync) __atomic_fetch_sub(&deferred_async, 1, __ATOMIC_RELAXED);

  int finished = 0;
  for (Fiber& f : L.fibers) {
    finished += f.done;
#if defined(DET_SIMT_ASAN)
    for (const Copy& c : f.copies) ASAN_UNPOISON_MEMORY_REGION(c.dst, c.bytes);  // a parked fiber's
#endif
#if defined(DET_SIMT_TSAN)
    __tsan_destroy_fiber(f.tsan_fiber);
#endif
  }
  munmap(L.stacks, L.stacks_bytes);
  for (void* q : smem_exact) free(q);
  return finished == n ? 0 : -1;
}

}  // namespace

int launch(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg) {
  return launch_impl(grid, block, smem_bytes, seed, kernel, arg, nullptr);
}

int launch_counted(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg,
                   WorkProfile* work) {
  if (!work || !work->counts || work->phases_cap < 1) return -1;
  __atomic_fetch_add(&work_counting, 1, __ATOMIC_RELAXED);
  const int rc = launch_impl(grid, block, smem_bytes, seed, kernel, arg, work);
  __atomic_fetch_sub(&work_counting, 1, __ATOMIC_RELAXED);
  return rc;
}

}  // namespace det_simt_host
