// CUDA kernels: one op family per file (dense.cu, sparse.cu, loss.cu,
// optim.cu), f32 only. Every KernelFn here is a *host launcher*: it runs on the
// calling host thread, reads the shapes, the attributes and the KernelContext
// (a host pointer) there, and queues its device work on the stream in
// KernelArgs::stream (a cudaStream_t). Tensor data pointers are device
// pointers and are never dereferenced on the host, so a launcher never waits
// for the device.
//
// A launcher cannot throw (kernel ABI). What it needs beyond KernelArgs, and
// how it reports a failure, goes through the LaunchEnv below: the backend
// points the calling thread at its environment for the duration of each call
// (ScopedLaunchEnv), with the cuBLAS and cuSPARSE handles already bound to
// KernelArgs::stream; the launcher records its first failing call there, and
// the backend turns that into a pooch::Error at the stream's next sync.
//
// This header includes no CUDA header, so host code compiled without the CUDA
// include paths (the checker, the runtime) may include it.
#pragma once
#include <cstddef>
#include <vector>

#include "../common/kernel_abi.h"

namespace pooch::kern {

std::vector<KernelVariant> cuda_dense_kernels();
std::vector<KernelVariant> cuda_sparse_kernels();
std::vector<KernelVariant> cuda_ffi_head_kernels();  // part of cuda_sparse_kernels()
std::vector<KernelVariant> cuda_loss_kernels();
std::vector<KernelVariant> cuda_optim_kernels();
std::vector<KernelVariant> cuda_lm_kernels();

// All of the above in one table, fastest first within each op.
const std::vector<KernelVariant>& cuda_kernels();

namespace cuda {

// What a CUDA kernel knows of its device. A CUDA backend owns one and hands
// it out as KernelArgs::device (Backend::kernel_device()): workspace and
// supports functions run while planning, outside any launch, and those that
// ask a library for its scratch size (cuSPARSE SpMM, CUB sorts) use that
// device and, for cuSPARSE, its handle. Without one (device null) they return
// a conservative bound instead; a launch re-checks the exact size and never
// writes past the workspace it was given.
struct LaunchEnv {
  void* cublas = nullptr;    // cublasHandle_t, bound to the launch's stream, with its workspace set
  void* cusparse = nullptr;  // cusparseHandle_t, bound to the launch's stream
  int device = 0;            // the device the backend runs on (current on the calling thread)
  int sm_count = 1;          // its multiprocessors, for sizing grids
  // The first failure inside a launcher since the backend last cleared it:
  // the call that failed and its error string, e.g.
  // "cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED".
  bool failed = false;
  char error[400] = {};
};

// The environment of the launch running on this thread; null outside one (a
// launcher called then has no library handles: it records nothing and the
// library-based kernels do nothing).
LaunchEnv* current_launch_env();

class ScopedLaunchEnv {
 public:
  explicit ScopedLaunchEnv(LaunchEnv* env);
  ~ScopedLaunchEnv();
  ScopedLaunchEnv(const ScopedLaunchEnv&) = delete;
  ScopedLaunchEnv& operator=(const ScopedLaunchEnv&) = delete;

 private:
  LaunchEnv* prev_;
};

// Whether this build's device code runs on the current device: the
// cudaError_t (as an int; 0 = cudaSuccess) of asking the runtime for one of
// its kernels. cudaErrorNoKernelImageForDevice means the GPU's architecture
// is not among those compiled in.
int kernel_image_status();

}  // namespace cuda
}  // namespace pooch::kern
