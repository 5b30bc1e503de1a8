// det_attn_chunk_avx512.h: what the two AVX-512 schedules of one chunk's attention partials share
// (docs/SPEC.md §13.4 steps 1-4): det_attn_chunk_avx512.cpp holds a key per lane (a decode's few
// query heads), det_attn_lanes_avx512.cpp a query per lane (a prompt's rows and heads).
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "../det_kernels_cpu.h"
#include "det_attn_ahead.h"

#define DET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512dq")))

// x86/det_attn_lanes_avx512.cpp: det_attn_chunk_avx512's work for nq >= DET_ATTN_LANES_MIN queries,
// sixteen queries to a vector; the same bits.
#define DET_ATTN_LANES_MIN 16
void det_attn_chunk_lanes_avx512(det_attn_rows rows, int64_t D, float scale, const det_attn_query* qs, int64_t nq,
                                 det_attn_ahead& ahead);
