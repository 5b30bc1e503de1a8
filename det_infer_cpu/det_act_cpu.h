// det_act_cpu.h: the engine's vectorized elementwise steps. Same bits as the scalar contract
// (contract/det_exp.h, det_act.h); the ISA version is chosen at run time, with the scalar loops
// as the fallback (and forced by DET_INFER_GEMV=ref, like the GEMV).
#pragma once

#include <stdint.h>

// out[i] = fl(silu(gate[i]) * up[i])
void det_silu_mul(const float* gate, const float* up, float* out, int64_t n);
// e[i] = exp(fl(s[i] - m))
void det_exp_sub(const float* s, float m, float* e, int64_t n);

#if defined(__x86_64__)
void det_silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);
void det_exp_sub_avx2(const float* s, float m, float* e, int64_t n);
#endif
