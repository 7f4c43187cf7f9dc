#include "cpu_kernels.h"

namespace pooch::kern {

const std::vector<KernelVariant>& cpu_kernels() {
  static const std::vector<KernelVariant> table = [] {
    std::vector<KernelVariant> all;
    for (auto family : {cpu_dense_kernels, cpu_sparse_kernels, cpu_loss_kernels, cpu_optim_kernels,
                        cpu_conv_kernels, cpu_batchnorm_kernels, cpu_lm_kernels})
      for (const KernelVariant& k : family()) all.push_back(k);
    return all;
  }();
  return table;
}

}  // namespace pooch::kern
