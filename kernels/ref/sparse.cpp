// Reference kernels of the sparse family (docs/OPS.md, "Sparse"): the plainest
// loops that meet the contract, accumulating in double. Float operands are f32
// or f64 (the checker's finite differences run in f64); an op's float operands
// all share one dtype, which the op's shape inference guarantees.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../common/supports.h"
#include "ref_kernels.h"
#include "topk_order.h"

namespace pooch::kern {
namespace {

// Calls fn with a value of the C++ type behind `dt`. Any other dtype cannot
// reach a kernel (shape inference rejects it), and kernels must not throw, so
// it is simply not dispatched.
template <class Fn>
void with_float(DType dt, Fn&& fn) {
  if (dt == DType::f32) fn(float{});
  if (dt == DType::f64) fn(double{});
}

template <class Fn>
void with_index(DType dt, Fn&& fn) {
  if (dt == DType::u16) fn(uint16_t{});
  if (dt == DType::i32) fn(int32_t{});
}

// ---- sparse_linear ---------------------------------------------------------

template <class T>
void sparse_linear(const KernelArgs& a) {
  const int32_t* ptr = a.in[0].as<int32_t>();
  const int32_t* idx = a.in[1].as<int32_t>();
  const T* val = a.in[2].as<T>();
  const T* w = a.in[3].as<T>();
  const T* bias = a.in[4].as<T>();
  T* y = a.out[0].as<T>();
  const int64_t rows = a.out[0].shape[0], cols = a.out[0].shape[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < cols; ++o) {
      double acc = 0;
      for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j)
        acc += static_cast<double>(val[j]) * static_cast<double>(w[int64_t{idx[j]} * cols + o]);
      y[r * cols + o] = static_cast<T>(acc + static_cast<double>(bias[o]));
    }
}

// Two int32 arrays of the CSR capacity: entry order and each entry's row.
size_t sparse_linear_grad_weight_ws(const KernelArgs& a) {
  return 2 * static_cast<size_t>(a.in[1].shape[0]) * sizeof(int32_t);
}

template <class T>
void sparse_linear_grad_weight(const KernelArgs& a) {
  const int32_t* ptr = a.in[0].as<int32_t>();
  const int32_t* idx = a.in[1].as<int32_t>();
  const T* val = a.in[2].as<T>();
  const T* dy = a.in[3].as<T>();
  int32_t* rows = a.out[0].as<int32_t>();
  T* dwr = a.out[1].as<T>();
  T* db = a.out[2].as<T>();
  const int64_t batch = a.in[3].shape[0], cols = a.in[3].shape[1];
  const int64_t cap = a.in[1].shape[0];
  int32_t* order = static_cast<int32_t*>(a.workspace);
  int32_t* row_of = order + cap;

  const int64_t first = ptr[0], last = ptr[batch];
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j) row_of[j] = static_cast<int32_t>(r);
  int64_t m = 0;
  for (int64_t j = first; j < last; ++j) order[m++] = static_cast<int32_t>(j);
  // Ties broken by entry position make the order total, so the (unstable,
  // allocation-free) sort still yields one fixed summation order per feature.
  std::sort(order, order + m,
            [idx](int32_t p, int32_t q) { return idx[p] != idx[q] ? idx[p] < idx[q] : p < q; });

  int64_t n = 0;
  for (int64_t s = 0; s < m;) {
    int64_t e = s;
    while (e < m && idx[order[e]] == idx[order[s]]) ++e;
    rows[1 + n] = idx[order[s]];
    for (int64_t o = 0; o < cols; ++o) {
      double acc = 0;
      for (int64_t t = s; t < e; ++t)
        acc += static_cast<double>(val[order[t]]) *
               static_cast<double>(dy[int64_t{row_of[order[t]]} * cols + o]);
      dwr[n * cols + o] = static_cast<T>(acc);
    }
    ++n;
    s = e;
  }
  rows[0] = static_cast<int32_t>(n);

  for (int64_t o = 0; o < cols; ++o) {
    double acc = 0;
    for (int64_t r = 0; r < batch; ++r) acc += static_cast<double>(dy[r * cols + o]);
    db[o] = static_cast<T>(acc);
  }
}

// ---- ffi_linear and its gradients -------------------------------------------

template <class T, class I>
void ffi_linear(const KernelArgs& a) {
  const T* x = a.in[0].as<T>();
  const I* index = a.in[1].as<I>();
  const T* w = a.in[2].as<T>();
  const T* bias = a.in[3].as<T>();
  T* y = a.out[0].as<T>();
  const int64_t batch = a.in[0].shape[0], hidden = a.in[0].shape[1];
  const int64_t labels = a.in[1].shape[0], fan_in = a.in[1].shape[1];
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < labels; ++l) {
      double acc = 0;
      for (int64_t k = 0; k < fan_in; ++k)
        acc += static_cast<double>(x[b * hidden + int64_t{index[l * fan_in + k]}]) *
               static_cast<double>(w[l * fan_in + k]);
      y[b * labels + l] = static_cast<T>(acc + static_cast<double>(bias[l]));
    }
}

// One double accumulator per hidden unit, so the scatter sums in double too.
size_t ffi_grad_input_ws(const KernelArgs& a) {
  return static_cast<size_t>(a.out[0].shape[1]) * sizeof(double);
}

template <class T, class I>
void ffi_grad_input(const KernelArgs& a) {
  const T* dy = a.in[0].as<T>();
  const I* index = a.in[1].as<I>();
  const T* w = a.in[2].as<T>();
  T* dx = a.out[0].as<T>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t fan_in = a.in[1].shape[1], hidden = a.out[0].shape[1];
  double* acc = static_cast<double*>(a.workspace);
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(acc, acc + hidden, 0.0);
    for (int64_t l = 0; l < labels; ++l) {
      const double g = static_cast<double>(dy[b * labels + l]);
      for (int64_t k = 0; k < fan_in; ++k)
        acc[index[l * fan_in + k]] += g * static_cast<double>(w[l * fan_in + k]);
    }
    for (int64_t h = 0; h < hidden; ++h) dx[b * hidden + h] = static_cast<T>(acc[h]);
  }
}

template <class T, class I>
void ffi_grad_weight(const KernelArgs& a) {
  const T* dy = a.in[0].as<T>();
  const T* x = a.in[1].as<T>();
  const I* index = a.in[2].as<I>();
  T* dw = a.out[0].as<T>();
  T* db = a.out[1].as<T>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t hidden = a.in[1].shape[1], fan_in = a.in[2].shape[1];
  for (int64_t l = 0; l < labels; ++l) {
    for (int64_t k = 0; k < fan_in; ++k) {
      const int64_t h = index[l * fan_in + k];
      double acc = 0;
      for (int64_t b = 0; b < batch; ++b)
        acc += static_cast<double>(dy[b * labels + l]) * static_cast<double>(x[b * hidden + h]);
      dw[l * fan_in + k] = static_cast<T>(acc);
    }
    double acc = 0;
    for (int64_t b = 0; b < batch; ++b) acc += static_cast<double>(dy[b * labels + l]);
    db[l] = static_cast<T>(acc);
  }
}

// ---- topk ------------------------------------------------------------------

using refmath::ranks_above;

// Selection by repeated scans: the r-th pick is the best element ranking below
// pick r-1. Quadratic, but with nothing to get wrong.
template <class T>
void topk(const KernelArgs& a) {
  const T* x = a.in[0].as<T>();
  T* values = a.out[0].as<T>();
  int32_t* indices = a.out[1].as<int32_t>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t k = a.out[0].shape[1];
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = x + b * labels;
    int64_t prev = -1;
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      for (int64_t i = 0; i < labels; ++i) {
        if (prev >= 0 && !ranks_above(row[prev], prev, row[i], i)) continue;
        if (best < 0 || ranks_above(row[i], i, row[best], best)) best = i;
      }
      values[b * k + r] = row[best];
      indices[b * k + r] = static_cast<int32_t>(best);
      prev = best;
    }
  }
}

// ---- dispatch --------------------------------------------------------------

void sparse_linear_ref(const KernelArgs& a) {
  with_float(a.in[2].dtype, [&](auto t) { sparse_linear<decltype(t)>(a); });
}
void sparse_linear_grad_weight_ref(const KernelArgs& a) {
  with_float(a.in[3].dtype, [&](auto t) { sparse_linear_grad_weight<decltype(t)>(a); });
}
void ffi_linear_ref(const KernelArgs& a) {
  with_float(a.in[0].dtype, [&](auto t) {
    with_index(a.in[1].dtype, [&](auto i) { ffi_linear<decltype(t), decltype(i)>(a); });
  });
}
void ffi_grad_input_ref(const KernelArgs& a) {
  with_float(a.in[0].dtype, [&](auto t) {
    with_index(a.in[1].dtype, [&](auto i) { ffi_grad_input<decltype(t), decltype(i)>(a); });
  });
}
void ffi_grad_weight_ref(const KernelArgs& a) {
  with_float(a.in[0].dtype, [&](auto t) {
    with_index(a.in[2].dtype, [&](auto i) { ffi_grad_weight<decltype(t), decltype(i)>(a); });
  });
}
void topk_ref(const KernelArgs& a) {
  with_float(a.in[0].dtype, [&](auto t) { topk<decltype(t)>(a); });
}

// ---- scatter_add_rows ---------------------------------------------------------
//
// out = dense, then out[rows[1+i]] += g[i] for i < n = rows[0]. The producer
// lists n <= R distinct ids in [0, F); a kernel cannot report an error, so a
// count outside [0, R] is clamped and an id outside [0, F) skipped rather
// than written out of bounds. out may be dense itself (in place).

template <class T>
void scatter_add_rows_t(const KernelArgs& a) {
  const TensorView& dv = a.in[0];
  const int64_t f = dv.ndim == 2 ? dv.shape[0] : 0;
  const int64_t o = dv.ndim == 2 ? dv.shape[1] : 0;
  const T* dense = dv.as<const T>();
  T* out = a.out[0].as<T>();
  if (out != dense) std::copy(dense, dense + f * o, out);
  const int64_t cap = a.in[1].numel() - 1;
  if (cap <= 0) return;
  const int32_t* rows = a.in[1].as<const int32_t>();
  const int64_t n = std::clamp<int64_t>(rows[0], 0, cap);
  const T* g = a.in[2].as<const T>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[1 + i];
    if (r < 0 || r >= f) continue;
    for (int64_t j = 0; j < o; ++j)
      out[r * o + j] =
          static_cast<T>(static_cast<double>(out[r * o + j]) + static_cast<double>(g[i * o + j]));
  }
}

void scatter_add_rows_ref(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    scatter_add_rows_t<double>(a);
  else
    scatter_add_rows_t<float>(a);
}

// f32 or f64 throughout; the FFI index u16 or i32 (input 1, or 2 for
// ffi_grad_weight).
bool supports_ffi_index1(const KernelArgs& a) {
  return ref_float_operands(a) && is_index_dtype(a.in[1].dtype);
}
bool supports_ffi_index2(const KernelArgs& a) {
  return ref_float_operands(a) && is_index_dtype(a.in[2].dtype);
}

}  // namespace

std::vector<KernelVariant> ref_sparse_kernels() {
  std::vector<KernelVariant> v = {
      {"sparse_linear", "ref", sparse_linear_ref, nullptr, true, ref_float_operands},
      {"sparse_linear_grad_weight", "ref", sparse_linear_grad_weight_ref,
       sparse_linear_grad_weight_ws, true, ref_float_operands},
      {"ffi_linear", "ref", ffi_linear_ref, nullptr, true, supports_ffi_index1},
      {"ffi_grad_input", "ref", ffi_grad_input_ref, ffi_grad_input_ws, true, supports_ffi_index1},
      {"ffi_grad_weight", "ref", ffi_grad_weight_ref, nullptr, true, supports_ffi_index2},
      {"topk", "ref", topk_ref, nullptr, true, ref_float_operands},
      {"scatter_add_rows", "ref", scatter_add_rows_ref, nullptr, true, ref_float_operands},
  };
  // The fused output layer's kernels (ffi_head.cpp) belong to this family.
  for (const KernelVariant& f : ref_ffi_head_kernels()) v.push_back(f);
  return v;
}

}  // namespace pooch::kern
