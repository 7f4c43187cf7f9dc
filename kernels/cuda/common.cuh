// Helpers shared by the CUDA kernel files (device code; nvcc only).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include "cuda_kernels.h"

namespace pooch::kern::cuda {

inline cudaStream_t stream_of(const KernelArgs& a) {
  return static_cast<cudaStream_t>(a.stream);
}

// Records the first failure of the running launch (see LaunchEnv).
inline void report(const char* fmt, ...) {
  LaunchEnv* e = current_launch_env();
  if (e == nullptr || e->failed) return;
  e->failed = true;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(e->error, sizeof e->error, fmt, ap);
  va_end(ap);
}

// True on success; otherwise records "call: <name> (<description>)".
inline bool cuda_ok(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return true;
  report("%s: %s (%s)", call, cudaGetErrorName(err), cudaGetErrorString(err));
  return false;
}

// Checks the launch of the kernel just queued (bad configuration, no image).
inline bool launched(const char* kernel) {
  return cuda_ok(cudaGetLastError(), kernel);
}

// The CUDA kernels take f32 float operands only (the checker's f64 runs are
// for the reference kernels); anything else is refused, not misread.
inline bool f32_only(const KernelArgs& a, const char* op) {
  for (int i = 0; i < a.n_in; ++i)
    if (dtype_is_float(a.in[i].dtype) && a.in[i].dtype != DType::f32) {
      report("%s: input %d is %s; the CUDA kernels take f32", op, i, dtype_name(a.in[i].dtype));
      return false;
    }
  for (int i = 0; i < a.n_out; ++i)
    if (dtype_is_float(a.out[i].dtype) && a.out[i].dtype != DType::f32) {
      report("%s: output %d is %s; the CUDA kernels take f32", op, i, dtype_name(a.out[i].dtype));
      return false;
    }
  return true;
}

inline int sm_count() {
  const LaunchEnv* e = current_launch_env();
  return e != nullptr && e->sm_count > 0 ? e->sm_count : 16;
}

// The threads of a block, for kernels with no reason to pick another.
constexpr int kThreads = 256;

// A grid-stride loop: thread i of the grid takes items i, i + the grid's
// threads, ... below n.
#define POOCH_GRID_STRIDE(i, n)                                             \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Bits needed for the values 0..max_value (a radix sort's end bit).
inline int bits_for(int64_t max_value) {
  int b = 1;
  while (b < 63 && (int64_t{1} << b) <= max_value) ++b;
  return b;
}

// The device a launcher runs on: the one in its arguments, else that of the
// running launch.
inline const LaunchEnv* launch_env_of(const KernelArgs& a) {
  return a.device != nullptr ? static_cast<const LaunchEnv*>(a.device) : current_launch_env();
}

// Runs a CUB (or other) size query on device `e`. False when there is no
// device to ask (none given, no driver), so the caller falls back to a bound.
template <class Query>
bool device_query(const LaunchEnv* e, Query&& q) {
  if (e == nullptr) return false;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (cur != e->device && cudaSetDevice(e->device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const cudaError_t err = q();
  if (cur != e->device) (void)cudaSetDevice(cur);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// Blocks for a grid-stride loop over n items: enough to fill the device a
// few times over, never more than the items need.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = int64_t{sm_count()} * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks of a deterministic flat reduction over n items (each block writes a
// partial sum, one block then adds them in index order): a function of n
// alone, never of the device, so the bits are the same on every card.
inline constexpr int64_t kMaxPartials = 1024;
inline int64_t partial_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min(kMaxPartials, ceil_div(n, int64_t{kThreads} * 16)));
}

inline size_t align_up(size_t x, size_t a = 256) {
  return (x + a - 1) / a * a;
}

// Carves consecutive 256-byte aligned pieces out of a workspace (or, with a
// null base, only adds up their sizes: the workspace function and the
// launcher share one layout).
struct Carve {
  std::byte* base;
  size_t used = 0;
  template <class T>
  T* take(size_t count) {
    const size_t off = used;
    used = align_up(used + count * sizeof(T));
    return base ? reinterpret_cast<T*>(base + off) : nullptr;
  }
};

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over a 1-D block whose size is a multiple of 32, in a fixed tree (so
// bitwise the same every run); every thread of the block must call it, and
// every thread gets the result. `scratch` holds 33 doubles of shared memory.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(kFullMask, w, o);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const double r = scratch[32];
  __syncthreads();  // scratch may be reused right away
  return r;
}

// Queues out[c] = Σ_r m[r·C + c] over r in [0, R), summed in double in a
// fixed order (deterministic, no atomics); out is all zeros when R == 0.
// Defined in dense.cu; false (and reported) when the launch failed.
bool column_sums(const float* m, int64_t R, int64_t C, float* out, cudaStream_t s);

}  // namespace pooch::kern::cuda
