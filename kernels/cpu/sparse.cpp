// Placeholder until the sparse family lands: an empty table.
#include "cpu_kernels.h"
namespace pooch::kern {
std::vector<KernelVariant> cpu_sparse_kernels() { return {}; }
}  // namespace pooch::kern
