// Placeholder until the optim family lands: an empty table.
#include "ref_kernels.h"
namespace pooch::kern {
std::vector<KernelVariant> ref_optim_kernels() { return {}; }
}  // namespace pooch::kern
