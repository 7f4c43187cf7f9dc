// A text key for one kernel call (op, operand dtypes and shapes, attributes),
// formatted on the stack, so that looking up what was prepared for the call
// at plan time (oneDNN primitives, cuDNN descriptors and algorithms)
// allocates nothing at launch. Lookups use std::string_view.
#pragma once
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string_view>

#include "kernel_abi.h"

namespace pooch::kern {

struct CallKey {
  char s[640];
  int n = 0;

  template <class... V>
  void add(const char* fmt, V... v) {
    if (n >= static_cast<int>(sizeof(s)) - 1) return;
    const int w = std::snprintf(s + n, sizeof(s) - static_cast<size_t>(n), fmt, v...);
    n = std::min<int>(static_cast<int>(sizeof(s)) - 1, n + (w > 0 ? w : 0));
  }
  std::string_view view() const { return {s, static_cast<size_t>(n)}; }
};

inline void describe_operand(CallKey& k, const TensorView& t) {
  k.add("|%d/%d:", static_cast<int>(t.dtype), static_cast<int>(t.layout));
  for (int i = 0; i < t.ndim; ++i) k.add("%lld,", static_cast<long long>(t.shape[i]));
}

inline CallKey call_key(const char* op, const KernelArgs& a) {
  CallKey k;
  k.add("%s", op);
  for (int i = 0; i < a.n_in; ++i) describe_operand(k, a.in[i]);
  k.add("|>");
  for (int i = 0; i < a.n_out; ++i) describe_operand(k, a.out[i]);
  for (int i = 0; i < a.attrs.n; ++i) k.add("|%s=%.17g", a.attrs.names[i], a.attrs.values[i]);
  return k;
}

// Transparent hashing for maps keyed by std::string and found by string_view.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct KeyEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

}  // namespace pooch::kern
