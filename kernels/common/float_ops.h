// Float operations whose rounding is written out, for arithmetic that the
// CPU and the CUDA kernels must do alike: an op that runs on the host in one
// out-of-core plan and on the GPU in another (an optimizer update, a sparse
// input layer) must give the in-core bits. A multiply next to an add is
// otherwise fused or not as each compiler sees fit (GCC contracts in C++ in
// its AVX code; nvcc contracts by default).
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define POOCH_ELEMENT __host__ __device__ __forceinline__
#else
#define POOCH_ELEMENT inline __attribute__((always_inline))
#endif

namespace pooch::kern {

// a·b + c, rounded once (the CPU without FMA computes it in software).
POOCH_ELEMENT float fused_ma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// a·b, rounded: a product nvcc may not fuse into a later add. (On the CPU the
// callers use it only where nothing can fuse it: as an fma's addend or a
// dividend.)
POOCH_ELEMENT float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace pooch::kern
