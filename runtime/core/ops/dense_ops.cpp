// Placeholder until the dense family lands.
#include "../op_registry.h"
namespace pooch {
void register_dense_ops(OpRegistry&) {}
}  // namespace pooch
