// Element types. This header is the bottom of the dependency graph: kernels,
// core and the public API all agree on these numeric values.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pooch {

enum class DType : uint8_t {
  f32 = 0,
  f16 = 1,
  bf16 = 2,
  i32 = 3,
  u16 = 4,
  u8 = 5,
  f64 = 6,  // internal: the kernel checker runs reference kernels in double
};

inline constexpr int kNumDTypes = 7;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u16: return 2;
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

}  // namespace pooch
