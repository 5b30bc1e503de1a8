// det_math_cuda.cu: elementwise kernels over the contract functions. Grid-stride loops: the
// launch geometry only decides which thread computes an element, never how.
// Built with --fmad=false -ftz=false -prec-div=true -prec-sqrt=true (build.toml); the contract
// also spells every operation with an _rn intrinsic, so these flags are a second line of defence.
#include <cuda_runtime.h>

#include "../contract/det_trig.h"
#include "../contract/det_unary.h"
#include "det_math_cuda.h"

// ---- kernels --------------------------------------------------------------------------------
__global__ void det_unary_f32_kernel(int fn, const float* __restrict__ x, float* __restrict__ y,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = det_unary_apply_f32(fn, x[i]);
}

__global__ void det_sincos_f64_kernel(const double* __restrict__ theta, float* __restrict__ s,
                                      float* __restrict__ c, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    det_sincos_f32 sc = det_sincos_f64(theta[i]);
    s[i] = sc.s;
    c[i] = sc.c;
  }
}

// ---- launchers ------------------------------------------------------------------------------
static const int kThreads = 256;
static const int64_t kMaxBlocks = 4096;

static unsigned int det_blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned int)(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

int det_cuda_unary_f32(int fn, const float* x, float* y, int64_t n, void* stream) {
  if (fn < 0 || fn >= DET_UNARY_COUNT) return -1;
  if (n == 0) return 0;
  det_unary_f32_kernel<<<det_blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(fn, x, y, n);
  return (int)cudaGetLastError();
}

int det_cuda_sincos_f64(const double* theta, float* s, float* c, int64_t n, void* stream) {
  if (n == 0) return 0;
  det_sincos_f64_kernel<<<det_blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(theta, s, c, n);
  return (int)cudaGetLastError();
}
