// Placeholder until the sparse family lands.
#include "../op_registry.h"
namespace pooch {
void register_sparse_ops(OpRegistry&) {}
}  // namespace pooch
