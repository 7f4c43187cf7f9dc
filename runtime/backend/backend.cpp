#include "backend.h"

#include <exception>

namespace pooch {

void Backend::sync_all() {
  std::exception_ptr first;
  for (int i = 0; i < kNumStreams; ++i) {
    try {
      stream_sync(static_cast<Stream>(i));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

const kern::KernelVariant* Backend::find_kernel(std::string_view op, std::string_view variant,
                                                bool deterministic_only) const {
  for (const kern::KernelVariant& k : kernels()) {
    if (k.op == nullptr || op != k.op) continue;
    if (!variant.empty() && (k.variant == nullptr || variant != k.variant)) continue;
    if (deterministic_only && !k.deterministic) continue;
    return &k;
  }
  return nullptr;
}

}  // namespace pooch
