// det_unary.h: the table of elementwise contract functions exposed as one op (docs/SPEC.md §11).
// One enum and one name list, shared by the CPU and CUDA executors and the torch binding.
#pragma once

#include "det_act.h"
#include "det_bf16.h"
#include "det_exp.h"
#include "det_log.h"
#include "det_rsqrt.h"

enum det_unary_fn {
  DET_UNARY_EXP = 0,
  DET_UNARY_TANH = 1,
  DET_UNARY_SILU = 2,
  DET_UNARY_GELU_TANH = 3,
  DET_UNARY_RSQRT = 4,
  DET_UNARY_BF16_ROUND = 5,  // fp32 -> nearest bf16 -> fp32
  DET_UNARY_LOG = 6,
  DET_UNARY_COUNT = 7,
};

static const char* const det_unary_fn_names[] = {"exp", "tanh", "silu", "gelu_tanh", "rsqrt",
                                                 "bf16_round", "log"};
static_assert(sizeof(det_unary_fn_names) / sizeof(det_unary_fn_names[0]) == DET_UNARY_COUNT,
              "one name per det_unary_fn");

DET_HD float det_unary_apply_f32(int fn, float x) {
  switch (fn) {
    case DET_UNARY_EXP: return det_exp_f32(x);
    case DET_UNARY_TANH: return det_tanh_f32(x);
    case DET_UNARY_SILU: return det_silu_f32(x);
    case DET_UNARY_GELU_TANH: return det_gelu_tanh_f32(x);
    case DET_UNARY_RSQRT: return det_rsqrt_f32(x);
    case DET_UNARY_BF16_ROUND: return det_bf16_to_f32(det_f32_to_bf16(x));
    case DET_UNARY_LOG: return det_log_f32(x);
    default: return det_nan_f32();  // unreachable: callers validate fn first
  }
}
