#include "cuda_libs.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <exception>
#include <mutex>

namespace pooch::kern::cuda {
namespace {

// The symbol name after the headers' macros (cublasSgemm -> "cublasSgemm_v2").
#define POOCH_STR2(x) #x
#define POOCH_STR(x) POOCH_STR2(x)

const char* const kCublasSoname = "libcublas.so." POOCH_STR(CUBLAS_VER_MAJOR);
const char* const kCusparseSoname = "libcusparse.so." POOCH_STR(CUSPARSE_VER_MAJOR);

std::string advice() {
  return "install the CUDA " + std::to_string(CUDART_VERSION / 1000) + " runtime libraries";
}

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown error";
}

// dlopen(name); on failure the reason ("NAME not found: ..." when the file
// itself is missing, else the loader's error, e.g. a library it needs).
void* open_library(const char* name, std::string* why) {
  (void)dlerror();
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) return h;
  const std::string err = dl_error();
  const std::string self = std::string(name) + ":";
  if (err.compare(0, self.size(), self) == 0 &&
      err.find("No such file or directory") != std::string::npos)
    *why = std::string(name) + " not found: " + advice();
  else
    *why = std::string(name) + " could not be loaded (" + err + "): " + advice();
  return nullptr;
}

// *fn = dlsym(lib, symbol); false (and the reason) when it is missing.
template <typename Fn>
bool find_symbol(void* lib, const char* lib_name, const char* symbol, Fn* fn, std::string* why) {
  (void)dlerror();
  void* p = dlsym(lib, symbol);
  if (p == nullptr) {
    *why = std::string(lib_name) + " has no " + symbol + " (" + dl_error() +
           "): it is older than the CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) + " this build needs; " + advice();
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

struct Loaded {
  bool ok = false;
  std::string why;
  CudaLibs libs;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

}  // namespace

const char* cublas_soname() {
  return kCublasSoname;
}

const char* cusparse_soname() {
  return kCusparseSoname;
}

bool load_cuda_libs_from(CudaLibs* out, const char* cublas_so, const char* cusparse_so,
                         std::string* why) {
  std::string reason;
  void* cublas = nullptr;
  void* cusparse = nullptr;
  CudaLibs t;
  bool ok = false;
  try {
    cublas = open_library(cublas_so, &reason);
    if (cublas != nullptr) cusparse = open_library(cusparse_so, &reason);
    ok = cublas != nullptr && cusparse != nullptr;
#define POOCH_FIND_CUBLAS(name) \
  ok = ok && find_symbol(cublas, cublas_so, POOCH_STR(name), &t.name, &reason);
#define POOCH_FIND_CUSPARSE(name) \
  ok = ok && find_symbol(cusparse, cusparse_so, POOCH_STR(name), &t.name, &reason);
    POOCH_CUBLAS_FUNCTIONS(POOCH_FIND_CUBLAS)
    POOCH_CUSPARSE_FUNCTIONS(POOCH_FIND_CUSPARSE)
#undef POOCH_FIND_CUBLAS
#undef POOCH_FIND_CUSPARSE
  } catch (const std::exception& e) {  // std::string out of memory
    ok = false;
    try {
      reason = e.what();
    } catch (...) {
    }
  }
  if (!ok) {
    // Nothing stays mapped after a failure (an unused library unloads).
    if (cusparse != nullptr) dlclose(cusparse);
    if (cublas != nullptr) dlclose(cublas);
    if (why != nullptr) *why = std::move(reason);
    return false;
  }
  // On success both stay loaded for the process's lifetime: their functions
  // are in the table.
  *out = t;
  return true;
}

bool load_cuda_libs(std::string* why) {
  static std::once_flag once;
  Loaded& l = loaded();
  std::call_once(once, [&l] {
    l.ok = load_cuda_libs_from(&l.libs, kCublasSoname, kCusparseSoname, &l.why);
  });
  if (!l.ok && why != nullptr) {
    try {
      *why = l.why;
    } catch (...) {
    }
  }
  return l.ok;
}

const CudaLibs& cuda_libs() {
  return loaded().libs;
}

}  // namespace pooch::kern::cuda
