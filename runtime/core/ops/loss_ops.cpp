// Placeholder until the loss family lands.
#include "../op_registry.h"
namespace pooch {
void register_loss_ops(OpRegistry&) {}
}  // namespace pooch
