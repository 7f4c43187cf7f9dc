#include "backend.h"

#include <fmt/format.h>

#include <exception>

#include "../core/error.h"

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

void Backend::launch_host(Stream, const kern::KernelVariant& k, const kern::KernelArgs&) {
  throw Error(POOCH_ERR_UNSUPPORTED,
              fmt::format("the {} backend runs no kernels on the host (asked for '{}')", name(),
                          k.op ? k.op : "?"));
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
