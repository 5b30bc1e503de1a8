// det_math_cuda.h: the GPU executor's array entry points for the contract functions (the same
// headers as the CPU engine, compiled for the device). Torch-free; stream passed as a void*.
#pragma once

#include <stdint.h>

// y[i] = f(x[i]) for the det_unary_fn f on device arrays. Returns 0, -1 for an unknown fn, or
// the CUDA error code of the launch.
int det_cuda_unary_f32(int fn, const float* x, float* y, int64_t n, void* stream);

// s[i], c[i] = sin, cos of theta[i] on device arrays. Returns 0 or the CUDA error code.
int det_cuda_sincos_f64(const double* theta, float* s, float* c, int64_t n, void* stream);
