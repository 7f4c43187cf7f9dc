// Placeholder until the optim family lands: an empty table.
#include "cpu_kernels.h"
namespace pooch::kern {
std::vector<KernelVariant> cpu_optim_kernels() { return {}; }
}  // namespace pooch::kern
