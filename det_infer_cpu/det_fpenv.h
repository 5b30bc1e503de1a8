// det_fpenv.h: pin the CPU floating-point environment for the duration of a native call
// (docs/SPEC.md §2). Any library loaded into the process (or the caller) may have set
// flush-to-zero, denormals-are-zero or another rounding mode; the contract needs IEEE defaults.
// The guard sets them on construction and restores the caller's state on destruction. The
// environment is per thread: every OpenMP parallel region constructs its own guard.
#pragma once

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// MXCSR 0x1f80: all exceptions masked, round to nearest even, FTZ (bit 15) and DAZ (bit 6) off.
#define DET_MXCSR_IEEE 0x1f80u

struct det_fpenv_guard {
  unsigned int saved;
  det_fpenv_guard() : saved(_mm_getcsr()) { _mm_setcsr(DET_MXCSR_IEEE); }
  ~det_fpenv_guard() { _mm_setcsr(saved); }
  det_fpenv_guard(const det_fpenv_guard&) = delete;
  det_fpenv_guard& operator=(const det_fpenv_guard&) = delete;
};

#elif defined(__aarch64__)

// FPCR: RMode (bits 23:22) = round to nearest, FZ (24), FZ16 (19), FIZ (0) and AH (1) cleared.
#define DET_FPCR_CLEAR ((3ull << 22) | (1ull << 24) | (1ull << 19) | 3ull)

struct det_fpenv_guard {
  uint64_t saved;
  det_fpenv_guard() {
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved));
    uint64_t ieee = saved & ~DET_FPCR_CLEAR;
    __asm__ volatile("msr fpcr, %0" : : "r"(ieee));
  }
  ~det_fpenv_guard() { __asm__ volatile("msr fpcr, %0" : : "r"(saved)); }
  det_fpenv_guard(const det_fpenv_guard&) = delete;
  det_fpenv_guard& operator=(const det_fpenv_guard&) = delete;
};

#else
#error "det_fpenv.h: add this CPU's flush-to-zero and rounding-mode controls"
#endif

// Reads back the state the guard installs; 1 when the current thread runs under IEEE defaults.
inline int det_fpenv_is_ieee(void) {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & 0xffc0u) == (DET_MXCSR_IEEE & 0xffc0u);
#else
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & DET_FPCR_CLEAR) == 0;
#endif
}
