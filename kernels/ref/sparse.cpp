// Placeholder until the sparse family lands: an empty table.
#include "ref_kernels.h"
namespace pooch::kern {
std::vector<KernelVariant> ref_sparse_kernels() { return {}; }
}  // namespace pooch::kern
