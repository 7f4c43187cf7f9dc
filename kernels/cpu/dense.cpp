// Placeholder until the dense family lands: an empty table.
#include "cpu_kernels.h"
namespace pooch::kern {
std::vector<KernelVariant> cpu_dense_kernels() { return {}; }
}  // namespace pooch::kern
