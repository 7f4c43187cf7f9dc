// Placeholder until the optimizer family lands.
#include "../op_registry.h"
namespace pooch {
void register_optimizer_ops(OpRegistry&) {}
}  // namespace pooch
