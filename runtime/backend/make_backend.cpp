#include "make_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "../core/error.h"
#ifdef POOCH_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace pooch {

std::unique_ptr<Backend> make_backend(DeviceKind kind, const BackendParams& p, BackendNote note,
                                      void* note_user) {
  if (kind != DeviceKind::cpu) {
    std::string why;
#ifdef POOCH_HAVE_CUDA
    if (cuda_device_available(&why)) {
      CudaBackendParams cp;
      cp.device_budget = p.device_budget;
      cp.threads = p.threads;
      cp.warn = note;
      cp.warn_user = note_user;
      return make_cuda_backend(cp);
    }
#else
    why = "this build of pooch has no CUDA backend (nvcc was not found when it was built)";
#endif
    if (kind == DeviceKind::cuda)
      throw Error(POOCH_ERR_NO_DEVICE, fmt::format("the CUDA device is not usable: {}", why));
    if (note) note(note_user, fmt::format("device auto: using the CPU backend ({})", why).c_str());
  }
  CpuBackendParams cp;
  cp.device_budget = p.device_budget;
  cp.threads = p.threads;
  cp.link_bandwidth = p.link_bandwidth;
  cp.link_latency = p.link_latency;
  return make_cpu_backend(cp);
}

DeviceKind parse_device_kind(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "auto") return DeviceKind::automatic;
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "cuda") return DeviceKind::cuda;
  throw Error(POOCH_ERR_INVALID_ARG,
              fmt::format("unknown device '{}' (expected auto, cpu or cuda)", name));
}

}  // namespace pooch
