// Fast CPU kernels: OpenMP threads over rows, OpenBLAS for GEMM, loops the
// compiler vectorises. f32 only. Within one op, the fastest variant comes
// first; the checker runs every variant against kernels/ref.
#pragma once
#include <vector>

#include "../common/kernel_abi.h"

namespace pooch::kern {

// The threads a kernel may use: its context's count, or 1 without one.
inline int threads_of(const KernelArgs& a) {
  return a.ctx && a.ctx->threads > 0 ? a.ctx->threads : 1;
}

std::vector<KernelVariant> cpu_dense_kernels();
std::vector<KernelVariant> cpu_sparse_kernels();
std::vector<KernelVariant> cpu_ffi_head_kernels();  // part of cpu_sparse_kernels()
std::vector<KernelVariant> cpu_loss_kernels();
std::vector<KernelVariant> cpu_optim_kernels();
std::vector<KernelVariant> cpu_conv_kernels();  // oneDNN
std::vector<KernelVariant> cpu_batchnorm_kernels();
std::vector<KernelVariant> cpu_lm_kernels();

const std::vector<KernelVariant>& cpu_kernels();

}  // namespace pooch::kern
