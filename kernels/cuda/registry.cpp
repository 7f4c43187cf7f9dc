#include "cuda_kernels.h"

namespace pooch::kern {

const std::vector<KernelVariant>& cuda_kernels() {
  static const std::vector<KernelVariant> table = [] {
    std::vector<KernelVariant> all;
    for (auto family :
         {cuda_dense_kernels, cuda_sparse_kernels, cuda_loss_kernels, cuda_optim_kernels,
          cuda_conv_kernels, cuda_lm_kernels})
      for (const KernelVariant& k : family()) all.push_back(k);
    return all;
  }();
  return table;
}

namespace cuda {
namespace {
thread_local LaunchEnv* t_env = nullptr;
}  // namespace

LaunchEnv* current_launch_env() {
  return t_env;
}

ScopedLaunchEnv::ScopedLaunchEnv(LaunchEnv* env) : prev_(t_env) {
  t_env = env;
}

ScopedLaunchEnv::~ScopedLaunchEnv() {
  t_env = prev_;
}

}  // namespace cuda
}  // namespace pooch::kern
