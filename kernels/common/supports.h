// Building blocks for KernelVariant::supports (kernel_abi.h): predicates over
// the operands of one call, asked at plan time with null data pointers.
// Shape inference has already accepted the operands, so these only state
// what a kernel adds to the op's own rules: the float dtypes it computes in,
// the index dtypes it reads, and the sizes its integer types and grids reach.
#pragma once
#include <cstdint>

#include "kernel_abi.h"

namespace pooch::kern {

inline constexpr int64_t kInt32Max = 2147483647;

// Every float operand (inputs and outputs) has dtype `dt`.
inline bool floats_are(const KernelArgs& a, DType dt) {
  for (int i = 0; i < a.n_in; ++i)
    if (dtype_is_float(a.in[i].dtype) && a.in[i].dtype != dt) return false;
  for (int i = 0; i < a.n_out; ++i)
    if (dtype_is_float(a.out[i].dtype) && a.out[i].dtype != dt) return false;
  return true;
}

// The fast kernels (CPU and CUDA) compute in f32 only.
inline bool f32_operands(const KernelArgs& a) {
  return floats_are(a, DType::f32);
}

// The reference kernels compute in f32 or f64, one of the two for every
// float operand of a call.
inline bool ref_float_operands(const KernelArgs& a) {
  return floats_are(a, DType::f32) || floats_are(a, DType::f64);
}

// The index dtypes the FFI kernels read.
inline bool is_index_dtype(DType dt) {
  return dt == DType::u16 || dt == DType::i32;
}

inline bool fits_int32(int64_t v) {
  return v >= 0 && v <= kInt32Max;
}

}  // namespace pooch::kern
