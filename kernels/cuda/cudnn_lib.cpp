#include "cudnn_lib.h"

#include <dlfcn.h>

#include <mutex>

namespace pooch::kern::cuda {
namespace {

#define POOCH_STR2(x) #x
#define POOCH_STR(x) POOCH_STR2(x)

const char* const kSoname = "libcudnn.so." POOCH_STR(CUDNN_MAJOR);

struct Loaded {
  bool ok = false;
  std::string why;
  CudnnLib lib;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

bool load(Loaded& l) {
  (void)dlerror();
  void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    l.why = std::string(kSoname) + " could not be loaded (" + (e ? e : "unknown error") +
            "): install cuDNN " POOCH_STR(CUDNN_MAJOR) " for the convolutional ops";
    return false;
  }
  CudnnLib t;
#define POOCH_FIND(name)                                                         \
  t.name = reinterpret_cast<decltype(t.name)>(dlsym(h, POOCH_STR(name)));        \
  if (t.name == nullptr) {                                                       \
    l.why = std::string(kSoname) + " has no " POOCH_STR(name) ": it is older " \
            "than the cuDNN " POOCH_STR(CUDNN_MAJOR) " this build needs"; \
    dlclose(h);                                                                  \
    return false;                                                                \
  }
  POOCH_CUDNN_FUNCTIONS(POOCH_FIND)
#undef POOCH_FIND
  l.lib = t;  // the library stays loaded for the process's lifetime
  return true;
}

}  // namespace

const char* cudnn_soname() {
  return kSoname;
}

bool load_cudnn(std::string* why) {
  static std::once_flag once;
  Loaded& l = loaded();
  std::call_once(once, [&l] {
    try {
      l.ok = load(l);
    } catch (...) {  // std::string out of memory
      l.ok = false;
    }
  });
  if (!l.ok && why != nullptr) {
    try {
      *why = l.why;
    } catch (...) {
    }
  }
  return l.ok;
}

const CudnnLib& cudnn() {
  return loaded().lib;
}

}  // namespace pooch::kern::cuda
