#include "ref_kernels.h"

namespace pooch::kern {

const std::vector<KernelVariant>& ref_kernels() {
  static const std::vector<KernelVariant> table = [] {
    std::vector<KernelVariant> all;
    for (auto family : {ref_dense_kernels, ref_sparse_kernels, ref_loss_kernels, ref_optim_kernels,
                        ref_conv_kernels, ref_lm_kernels})
      for (const KernelVariant& k : family()) all.push_back(k);
    return all;
  }();
  return table;
}

}  // namespace pooch::kern
