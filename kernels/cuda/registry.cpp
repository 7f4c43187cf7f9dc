#include "cuda_kernels.h"

#include <atomic>

namespace pooch::kern {

const std::vector<KernelVariant>& cuda_kernels() {
  static const std::vector<KernelVariant> table = [] {
    std::vector<KernelVariant> all;
    for (auto family :
         {cuda_dense_kernels, cuda_sparse_kernels, cuda_loss_kernels, cuda_optim_kernels})
      for (const KernelVariant& k : family()) all.push_back(k);
    return all;
  }();
  return table;
}

namespace cuda {
namespace {
thread_local LaunchEnv* t_env = nullptr;
std::atomic<LaunchEnv*> g_query_env{nullptr};
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

void set_query_env(LaunchEnv* env) {
  g_query_env.store(env, std::memory_order_release);
}

void release_query_env(LaunchEnv* env) {
  g_query_env.compare_exchange_strong(env, nullptr, std::memory_order_acq_rel);
}

LaunchEnv* query_env() {
  return g_query_env.load(std::memory_order_acquire);
}

}  // namespace cuda
}  // namespace pooch::kern
