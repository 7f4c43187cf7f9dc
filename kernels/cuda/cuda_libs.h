// cuBLAS and cuSPARSE, loaded at run time.
//
// libpooch and the pooch binaries have no load-time dependency on any CUDA
// library: the CUDA runtime is linked statically (it answers
// cudaErrorInsufficientDriver where there is no driver), and cuBLAS and
// cuSPARSE are opened with dlopen only when a CUDA backend is asked for
// (cuda_device_available, once it has found a device). A program that never
// asks for CUDA never maps them, and a machine without them runs the CPU
// backend as usual.
//
// Every cuBLAS and cuSPARSE function pooch calls goes through the table
// below, typed from the official headers: call cuda_libs().cublasSgemm(...)
// where the header's cublasSgemm(...) would be. The headers #define some
// names to their _v2 symbols (cublasSgemm is cublasSgemm_v2); the members
// and the symbols looked up follow the same macros, so the two agree.
//
// Host code only; includes the CUDA headers (unlike cuda_kernels.h).
#pragma once
#include <cublas_v2.h>
#include <cusparse.h>

#include <string>

// The functions in the table: add one here before calling it.
#define POOCH_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate)                 \
  X(cublasDestroy)                \
  X(cublasSetStream)              \
  X(cublasSetPointerMode)         \
  X(cublasSetMathMode)            \
  X(cublasSetWorkspace)           \
  X(cublasSgemm)                  \
  X(cublasGetStatusString)

#define POOCH_CUSPARSE_FUNCTIONS(X) \
  X(cusparseCreate)                 \
  X(cusparseDestroy)                \
  X(cusparseSetStream)              \
  X(cusparseGetErrorString)         \
  X(cusparseCreateCsr)              \
  X(cusparseCreateDnMat)            \
  X(cusparseDestroySpMat)           \
  X(cusparseDestroyDnMat)           \
  X(cusparseSpMM_bufferSize)        \
  X(cusparseSpMM)

namespace pooch::kern::cuda {

struct CudaLibs {
#define POOCH_CUDA_LIBS_MEMBER(name) decltype(&::name) name = nullptr;
  POOCH_CUBLAS_FUNCTIONS(POOCH_CUDA_LIBS_MEMBER)
  POOCH_CUSPARSE_FUNCTIONS(POOCH_CUDA_LIBS_MEMBER)
#undef POOCH_CUDA_LIBS_MEMBER
};

// The sonames this build loads: those of the headers it was compiled with,
// e.g. "libcublas.so.13" and "libcusparse.so.12" for CUDA 13.
const char* cublas_soname();
const char* cusparse_soname();

// Loads cuBLAS and cuSPARSE once per process (later calls return the first
// answer; thread-safe). True when every function of the table was found;
// otherwise false, and *why (if given) names the library, e.g.
// "libcublas.so.13 not found: install the CUDA 13 runtime libraries or use
// --device cpu". Never throws. The libraries stay loaded for the process's
// lifetime once loaded; after a failure nothing stays loaded.
bool load_cuda_libs(std::string* why);

// The table load_cuda_libs filled. Call it only after load_cuda_libs
// returned true (a CUDA backend exists, or a library handle in a LaunchEnv
// is not null); before, every member is null.
const CudaLibs& cuda_libs();

// What load_cuda_libs does, from the given library names (file names that
// dlopen searches for, or paths), into *out, without caching: for tests (a
// name that does not exist checks the refusal).
bool load_cuda_libs_from(CudaLibs* out, const char* cublas_so, const char* cusparse_so,
                         std::string* why);

}  // namespace pooch::kern::cuda
