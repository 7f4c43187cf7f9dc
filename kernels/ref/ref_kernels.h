// Reference kernels: plain loops with double accumulation, written to be
// obviously right rather than fast. Every other kernel is checked against
// these. They accept f32 and f64 float operands (f64: finite differences).
#pragma once
#include <vector>

#include "../common/kernel_abi.h"

namespace pooch::kern {

std::vector<KernelVariant> ref_dense_kernels();
std::vector<KernelVariant> ref_sparse_kernels();
std::vector<KernelVariant> ref_ffi_head_kernels();  // part of ref_sparse_kernels()
std::vector<KernelVariant> ref_loss_kernels();
std::vector<KernelVariant> ref_optim_kernels();
std::vector<KernelVariant> ref_conv_kernels();
std::vector<KernelVariant> ref_lm_kernels();

// All of the above, in one table (variant name "ref").
const std::vector<KernelVariant>& ref_kernels();

}  // namespace pooch::kern
