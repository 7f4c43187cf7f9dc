// The index arithmetic of `transpose` (docs/OPS.md, "Layout"), shared by the
// reference, CPU and CUDA kernels: output dimension k is input dimension
// p_k, so y[i0,..,i(n-1)] = x at Σ_k i_k·stride(p_k), stride() being the
// input's row-major strides. Host code; the CUDA launcher passes the result
// to its kernel by value.
#pragma once
#include <cstdint>

#include "kernel_abi.h"

namespace pooch::kern {

// The permutation attribute names, p0..p3.
inline const char* perm_attr(int k) {
  static const char* const names[kMaxDims] = {"p0", "p1", "p2", "p3"};
  return names[k];
}

// Always four dimensions: a rank-n permute is padded in front with size-1
// dimensions (stride 0), so loops need no rank cases.
struct Permutation {
  int64_t shape[kMaxDims] = {1, 1, 1, 1};   // the output's shape
  int64_t stride[kMaxDims] = {0, 0, 0, 0};  // input elements per step of each output dimension
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
};

// Shape inference has checked that p0..p(n-1) are a permutation of 0..n-1.
inline Permutation permutation_of(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const int n = x.ndim;
  int64_t in_stride[kMaxDims] = {0, 0, 0, 0};
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) {
    in_stride[i] = s;
    s *= x.shape[i];
  }
  Permutation p;
  const int pad = kMaxDims - n;
  for (int k = 0; k < n; ++k) {
    const auto src = static_cast<int>(a.attrs.geti(perm_attr(k), k));
    p.shape[pad + k] = x.shape[src];
    p.stride[pad + k] = in_stride[src];
  }
  return p;
}

}  // namespace pooch::kern
