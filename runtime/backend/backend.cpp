#include "backend.h"

namespace pooch {

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
