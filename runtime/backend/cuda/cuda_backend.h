// The CUDA backend: one cudaMalloc'd arena (taken whole at arena_reserve, the
// budget enforced as the CPU backend does), a pinned host pool, three
// non-blocking streams (compute, d2h, h2d), events without timing, cuBLAS and
// cuSPARSE handles, and the kernels of kernels/cuda.
//
// Kernels are host launchers (kernels/cuda/cuda_kernels.h): launch() calls one
// on the calling thread with KernelArgs::stream set to the cudaStream_t of the
// stream asked for and the thread's LaunchEnv pointing at this backend's
// handles (bound to that stream, cuBLAS's workspace carved from the arena's
// allocation). Errors follow the CPU backend: argument mistakes throw at once;
// a failure of queued work (a launcher's failed call, a failed copy, a
// kernel's fault) is kept per stream, later kernels and copies on that stream
// are skipped, and the stream's next stream_sync throws it.
//
// The CUDA runtime is linked statically and cuBLAS and cuSPARSE are loaded at
// run time, so nothing here needs a CUDA library to load a program: without
// them (or without a driver) the backend is refused with POOCH_ERR_NO_DEVICE.
//
// This header includes no CUDA header.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "../backend.h"
#include "pooch/pooch.h"

namespace pooch {

struct CudaBackendParams {
  int device = 0;            // CUDA device index
  size_t device_budget = 0;  // device bytes the backend may take (arena plus cuBLAS's
                             // workspace); 0: the free memory at construction minus a margin
  int threads = 0;           // host threads for KernelContext::threads; 0: all cores
  // Warnings (e.g. pinned memory unavailable, pageable memory used instead),
  // one line each, to the session's note (the application's log, through
  // the C API). Null: they go to stderr.
  void (*warn)(void* user, const char* line) = nullptr;
  void* warn_user = nullptr;
};

// Whether a usable CUDA device `device` is present: a driver, the device,
// cuBLAS and cuSPARSE (loaded here with dlopen, once a device is found: see
// kernels/cuda/cuda_libs.h), and device code in this build for its
// architecture. Never throws; when false, *why (if given) says what is
// missing, e.g. "no CUDA driver (cudaErrorInsufficientDriver: ...)" or
// "libcublas.so.13 not found: install the CUDA 13 runtime libraries or use
// --device cpu".
bool cuda_device_available(std::string* why, int device = 0);

// Throws Error(POOCH_ERR_NO_DEVICE) with cuda_device_available's reason when
// the device is not usable, POOCH_ERR_INVALID_ARG for bad parameters, and
// POOCH_ERR_INTERNAL naming the failed call when the runtime or a library
// fails to start.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendParams& p);

}  // namespace pooch
