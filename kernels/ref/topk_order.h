// The order topk's contract ranks labels by, shared by the reference topk
// (sparse.cpp) and the fused output layer's running top-k (ffi_head.cpp).
#pragma once
#include <cmath>
#include <cstdint>

namespace pooch::kern::refmath {

// A strict total order on (value, position): larger values first, NaN after
// every number, equal values by lower position.
template <class T>
bool ranks_above(T u, int64_t iu, T v, int64_t iv) {
  const bool nu = std::isnan(u), nv = std::isnan(v);
  if (nu != nv) return nv;
  if (!nu && u != v) return u > v;
  return iu < iv;
}

}  // namespace pooch::kern::refmath
