// The one place a backend is chosen: CPU, CUDA, or CUDA when a GPU is present
// and the CPU otherwise (the fallback lives here, not in the layers above).
#pragma once
#include <memory>
#include <string>

#include "backend.h"

namespace pooch {

enum class DeviceKind { automatic, cpu, cuda };

struct BackendParams {
  size_t device_budget = 0;   // bytes the arena may take; 0: all the device offers
  int threads = 0;            // CPU threads for kernels; 0: all cores
  double link_bandwidth = 0;  // CPU only: an emulated device link (CpuBackendParams)
  double link_latency = 0;
};

// Called with one line when `automatic` falls back to the CPU, saying why.
using BackendNote = void (*)(void* user, const char* line);

// Throws Error(POOCH_ERR_NO_DEVICE) with the reason when `cuda` is asked for
// and no usable GPU (or no CUDA build) is there.
std::unique_ptr<Backend> make_backend(DeviceKind kind, const BackendParams& p,
                                      BackendNote note = nullptr, void* note_user = nullptr);

// "auto", "cpu", "cuda" (any case); Error(POOCH_ERR_INVALID_ARG) naming the word otherwise.
DeviceKind parse_device_kind(const std::string& name);

}  // namespace pooch
