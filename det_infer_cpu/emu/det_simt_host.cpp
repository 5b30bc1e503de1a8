// det_simt_host.cpp: the host side of the SIMT layer (megakernel/det_simt.h). Every CUDA thread is
// a fiber with its own stack, all on one OS thread; a fiber runs until it synchronizes, then the
// scheduler picks another runnable one. Barriers (block, warp, grid) and warp exchanges are
// rendezvous: the last fiber to arrive releases the others. Because fibers switch only there, a
// missing barrier in the kernel shows up as a read of data not yet written under some schedule,
// and seeded random schedules look for one.
#include "det_simt_host.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "../../megakernel/det_simt.h"

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
#include <sanitizer/common_interface_defs.h>
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

namespace det_simt_host {
namespace {

constexpr size_t kStackBytes = 128 * 1024;  // the deepest kernel frame uses a few KiB
constexpr int kMaxWords = 128;  // largest warp exchange (16 rows x 8 residues)

struct Fiber {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  unsigned char* stack_lo = nullptr;  // lowest usable byte of the fiber's stack
  void* asan_fake_stack = nullptr;
  int tid = 0, bid = 0;
  int xphase = 0;  // which of the warp's two exchange buffers this lane uses next
  bool done = false;
};

struct Rendezvous {
  int expected = 0, arrived = 0;
  std::vector<Fiber*> waiting;
};

struct WarpExchange {
  uint32_t words[2][DET_WARP][kMaxWords];
};

struct Launch {
  int grid = 0, block = 0;
  void (*kernel)(void*) = nullptr;
  void* arg = nullptr;
  std::vector<Fiber> fibers;
  std::vector<std::vector<unsigned char>> smem;  // per block
  std::vector<Rendezvous> block_bar, warp_bar;
  Rendezvous grid_bar;
  std::vector<WarpExchange> xch;  // per warp
  std::vector<Fiber*> runnable;
  uint64_t rng = 0;
  Fiber* cur = nullptr;
  unsigned char* stacks = nullptr;
  size_t stacks_bytes = 0;
#if defined(__x86_64__)
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  const void* sched_stack_lo = nullptr;  // the scheduler's (the calling thread's) stack, for ASan
  size_t sched_stack_size = 0;
  void* sched_fake_stack = nullptr;
};

thread_local Launch* g_launch = nullptr;

uint64_t next_random(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void to_scheduler(Fiber* f) {
  Launch* L = g_launch;
#if defined(DET_SIMT_ASAN)
  // A finished fiber's stack is gone for good: no fake stack to keep.
  __sanitizer_start_switch_fiber(f->done ? nullptr : &f->asan_fake_stack, L->sched_stack_lo, L->sched_stack_size);
#endif
#if defined(__x86_64__)
  det_simt_switch(&f->sp, L->sched_sp);
#else
  swapcontext(&f->ctx, &L->sched);
#endif
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f->asan_fake_stack, nullptr, nullptr);
#endif
}

// The scheduler side of a switch into fiber f and back.
void run_fiber(Launch& L, Fiber* f) {
  L.cur = f;
#if defined(DET_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&L.sched_fake_stack, f->stack_lo, kStackBytes);
#endif
#if defined(__x86_64__)
  det_simt_switch(&L.sched_sp, f->sp);
#else
  swapcontext(&L.sched, &f->ctx);
#endif
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(L.sched_fake_stack, &L.sched_stack_lo, &L.sched_stack_size);
#endif
}

void fiber_main() {
  Launch* L = g_launch;
  Fiber* f = L->cur;
#if defined(DET_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &L->sched_stack_lo, &L->sched_stack_size);
#endif
  L->kernel(L->arg);
  f->done = true;
  to_scheduler(f);
  abort();  // a finished fiber is never resumed
}

// Arrive at a rendezvous; returns once every expected fiber has arrived.
void arrive(Rendezvous& r) {
  Launch* L = g_launch;
  Fiber* self = L->cur;
  if (++r.arrived == r.expected) {
    r.arrived = 0;
    for (Fiber* w : r.waiting) L->runnable.push_back(w);
    r.waiting.clear();
    L->runnable.push_back(self);  // stay runnable, but let the scheduler choose who goes first
  } else {
    r.waiting.push_back(self);
  }
  to_scheduler(self);
}

void setup_fiber(Launch& L, Fiber& f, unsigned char* stack_top) {
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
  (void)L;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack_top - kStackBytes;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, (void (*)())fiber_main, 0);
  (void)L;
#endif
}

}  // namespace

int thread_idx() { return g_launch->cur->tid; }
int block_dim() { return g_launch->block; }
int block_idx() { return g_launch->cur->bid; }
int grid_dim() { return g_launch->grid; }
unsigned char* smem() { return g_launch->smem[g_launch->cur->bid].data(); }

void sync_block() { arrive(g_launch->block_bar[g_launch->cur->bid]); }

void sync_warp() {
  Launch* L = g_launch;
  arrive(L->warp_bar[(L->cur->bid * L->block + L->cur->tid) / DET_WARP]);
}

void sync_grid() { arrive(g_launch->grid_bar); }

// Two buffers alternate: a lane can be at most one exchange ahead of the slowest lane of its warp
// (the next exchange's rendezvous waits for it), so the buffer it writes is never one still read.
void exchange(uint32_t* words, int n, int src, bool src_is_delta) {
  Launch* L = g_launch;
  Fiber* f = L->cur;
  if (n > kMaxWords) abort();
  const int warp = (f->bid * L->block + f->tid) / DET_WARP, lane = f->tid % DET_WARP;
  WarpExchange& x = L->xch[warp];
  const int ph = f->xphase;
  f->xphase ^= 1;
  memcpy(x.words[ph][lane], words, n * sizeof(uint32_t));
  arrive(L->warp_bar[warp]);
  int from = src_is_delta ? lane + src : src;
  if (from < 0 || from >= DET_WARP) from = lane;
  memcpy(words, x.words[ph][from], n * sizeof(uint32_t));
}

int launch(int grid, int block, size_t smem_bytes, uint64_t seed, void (*kernel)(void*), void* arg) {
  if (grid < 1 || block < DET_WARP || block % DET_WARP || g_launch) return -1;
  Launch L;
  L.grid = grid;
  L.block = block;
  L.kernel = kernel;
  L.arg = arg;
  L.rng = seed;
  const int n = grid * block;
  L.fibers.resize(n);
  L.smem.assign(grid, std::vector<unsigned char>(smem_bytes + 16, 0));
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
  if (mem == MAP_FAILED) return -1;
  L.stacks = (unsigned char*)mem;
  for (int i = 0; i < n; ++i) {
    mprotect(L.stacks + i * slot, page, PROT_NONE);
    Fiber& f = L.fibers[i];
    f.stack_lo = L.stacks + i * slot + page;
    f.bid = i / block;
    f.tid = i % block;
    setup_fiber(L, f, L.stacks + (i + 1) * slot);
    L.runnable.push_back(&f);
  }

  g_launch = &L;
  int finished = 0;
  while (!L.runnable.empty()) {
    size_t pick = 0;
    if (seed) {
      pick = next_random(L.rng) % L.runnable.size();
    }
    Fiber* f = L.runnable[pick];
    L.runnable[pick] = L.runnable.back();
    L.runnable.pop_back();
    run_fiber(L, f);
    finished += f->done;
  }
  g_launch = nullptr;
  munmap(L.stacks, L.stacks_bytes);
  return finished == n ? 0 : -1;
}

}  // namespace det_simt_host
