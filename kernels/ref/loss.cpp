// Reference loss kernels (docs/OPS.md, "Losses"). Every element is computed in
// double whatever the storage type, so the f32 reference is as close to the
// exact value as one final rounding allows, and the f64 run used for finite
// differences is smooth to double precision.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common/supports.h"
#include "loss_math.h"
#include "ref_kernels.h"

namespace pooch::kern {
namespace {

using refmath::bce_term;
using refmath::hinge_margin;
using refmath::sigmoid;

// log sum_l e^{x_l}, shifted by the row maximum so no exponential exceeds 1.
// Without a finite maximum (a +inf or an all -inf row) no shift helps; the
// plain sum then yields the inf or NaN that PyTorch's log_softmax gives. A NaN
// is skipped by max but still reaches the sum, so it propagates too.
template <class T>
double row_log_sum_exp(const T* x, int64_t l) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < l; ++j) m = std::max(m, static_cast<double>(x[j]));
  const double shift = std::isfinite(m) ? m : 0.0;
  double s = 0;
  for (int64_t j = 0; j < l; ++j) s += std::exp(static_cast<double>(x[j]) - shift);
  return shift + std::log(s);
}

// x[..., L] as [rows, L]: every dimension but the last counts rows. (Not
// TensorView::rows(), which has no rows for L = 0.)
struct RowsCols {
  int64_t b, l;
};
RowsCols rows_cols(const TensorView& x) {
  if (x.ndim < 2) return {0, 0};
  int64_t b = 1;
  for (int i = 0; i + 1 < x.ndim; ++i) b *= x.shape[i];
  return {b, x.shape[x.ndim - 1]};
}

enum class Loss { bce, hinge, xent };

// One row's loss: the dense formula, with the targets read from `t` (the
// dense input, or a row of the label-CSR form expanded into the workspace).
template <Loss K, class T, class TT>
double row_loss(const T* xr, const TT* tr, int64_t l) {
  double row = 0;
  if constexpr (K == Loss::xent) {
    // -sum t*log softmax(x) = sum t*(lse - x): no log of a tiny probability.
    double lse = l > 0 ? row_log_sum_exp(xr, l) : 0.0;
    for (int64_t j = 0; j < l; ++j)
      row += static_cast<double>(tr[j]) * (lse - static_cast<double>(xr[j]));
  } else {
    for (int64_t j = 0; j < l; ++j) {
      double xj = xr[j], tj = tr[j];
      if constexpr (K == Loss::bce) {
        row += bce_term(xj, tj);
      } else {
        double m = hinge_margin(xj, tj);
        row += m * m;
      }
    }
  }
  return row;
}

// One row's gradient, dx = k * dloss/dx.
template <Loss K, class T, class TT>
void row_grad(const T* xr, const TT* tr, T* dr, int64_t l, double k) {
  if constexpr (K == Loss::xent) {
    if (l == 0) return;
    double lse = row_log_sum_exp(xr, l);
    double tsum = 0;
    for (int64_t j = 0; j < l; ++j) tsum += static_cast<double>(tr[j]);
    for (int64_t j = 0; j < l; ++j) {
      double p = std::exp(static_cast<double>(xr[j]) - lse);
      dr[j] = static_cast<T>(k * (p * tsum - static_cast<double>(tr[j])));
    }
  } else {
    for (int64_t j = 0; j < l; ++j) {
      double xj = xr[j], tj = tr[j];
      double g;
      if constexpr (K == Loss::bce) {
        g = sigmoid(xj) - tj;
      } else {
        g = -2.0 * (2.0 * tj - 1.0) * hinge_margin(xj, tj);
      }
      dr[j] = static_cast<T>(k * g);
    }
  }
}

template <class T, Loss K>
void loss_fwd(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const auto [b, l] = rows_cols(xv);
  const T* x = xv.as<const T>();
  const T* t = a.in[1].as<const T>();
  double total = 0;
  for (int64_t r = 0; r < b; ++r) total += row_loss<K>(x + r * l, t + r * l, l);
  // The mean over an empty batch is defined as 0, not 0/0.
  *a.out[0].as<T>() = static_cast<T>(b > 0 ? total / static_cast<double>(b) : 0.0);
}

template <class T, Loss K>
void loss_grad(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const auto [b, l] = rows_cols(xv);
  if (b == 0) return;
  const T* x = xv.as<const T>();
  const T* t = a.in[1].as<const T>();
  T* dx = a.out[0].as<T>();
  const double k = a.attrs.get("scale", 1.0) / static_cast<double>(b);
  for (int64_t r = 0; r < b; ++r) row_grad<K>(x + r * l, t + r * l, dx + r * l, l, k);
}

// ---- label-CSR targets --------------------------------------------------------
//
// Obviously right rather than fast: each row's targets are expanded into a
// dense row of 0/1 in the workspace and the dense formula runs on it, so the
// result is the dense op's with t[b,l] = 1 exactly for the listed labels.

size_t csr_workspace(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  return xv.ndim == 2 ? static_cast<size_t>(xv.shape[1]) * sizeof(double) : 0;
}

// Row r's targets as 0/1 in t[0..l).
void expand_row(const int32_t* lptr, const int32_t* lidx, int64_t r, int64_t l, double* t) {
  std::fill(t, t + l, 0.0);
  for (int64_t j = lptr[r]; j < lptr[r + 1]; ++j) t[lidx[j]] = 1.0;
}

template <class T, Loss K>
void csr_loss_fwd(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const int64_t b = xv.ndim == 2 ? xv.shape[0] : 0;
  const int64_t l = xv.ndim == 2 ? xv.shape[1] : 0;
  const T* x = xv.as<const T>();
  const int32_t* lptr = a.in[1].as<const int32_t>();
  const int32_t* lidx = a.in[2].as<const int32_t>();
  double* t = static_cast<double*>(a.workspace);
  double total = 0;
  for (int64_t r = 0; r < b; ++r) {
    expand_row(lptr, lidx, r, l, t);
    total += row_loss<K>(x + r * l, t, l);
  }
  *a.out[0].as<T>() = static_cast<T>(b > 0 ? total / static_cast<double>(b) : 0.0);
}

template <class T, Loss K>
void csr_loss_grad(const KernelArgs& a) {
  const TensorView& xv = a.in[0];
  const int64_t b = xv.ndim == 2 ? xv.shape[0] : 0;
  const int64_t l = xv.ndim == 2 ? xv.shape[1] : 0;
  if (b == 0) return;
  const T* x = xv.as<const T>();
  const int32_t* lptr = a.in[1].as<const int32_t>();
  const int32_t* lidx = a.in[2].as<const int32_t>();
  double* t = static_cast<double*>(a.workspace);
  T* dx = a.out[0].as<T>();
  const double k = a.attrs.get("scale", 1.0) / static_cast<double>(b);
  for (int64_t r = 0; r < b; ++r) {
    expand_row(lptr, lidx, r, l, t);
    row_grad<K>(x + r * l, t, dx + r * l, l, k);
  }
}

template <Loss K>
void csr_fwd(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    csr_loss_fwd<double, K>(a);
  else
    csr_loss_fwd<float, K>(a);
}

template <Loss K>
void csr_grad(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    csr_loss_grad<double, K>(a);
  else
    csr_loss_grad<float, K>(a);
}

template <Loss K>
void fwd(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    loss_fwd<double, K>(a);
  else
    loss_fwd<float, K>(a);
}

template <Loss K>
void grad(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    loss_grad<double, K>(a);
  else
    loss_grad<float, K>(a);
}

// ---- mean squared error with row weights ----------------------------------------
//
// loss = Σ_r w_r Σ_c (p − t)² / (C · max(Σ_r w_r, 1)). A row of weight 0 is
// skipped outright (a padding row may hold anything, NaN included) and gets
// a zero gradient.

template <class T>
void mse_fwd(const KernelArgs& a) {
  const auto [b, c] = rows_cols(a.in[0]);
  const T* p = a.in[0].as<const T>();
  const T* t = a.in[1].as<const T>();
  const T* w = a.in[2].as<const T>();
  double num = 0, wsum = 0;
  for (int64_t r = 0; r < b; ++r) {
    const double wr = w[r];
    if (wr == 0) continue;
    wsum += wr;
    double row = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double d = static_cast<double>(p[r * c + j]) - static_cast<double>(t[r * c + j]);
      row += d * d;
    }
    num += wr * row;
  }
  // No rows, no columns or no weight: the loss is 0, not 0/0.
  const double den = static_cast<double>(c) * std::max(wsum, 1.0);
  *a.out[0].as<T>() = static_cast<T>(b > 0 && c > 0 ? num / den : 0.0);
}

template <class T>
void mse_grad(const KernelArgs& a) {
  const auto [b, c] = rows_cols(a.in[0]);
  if (b == 0 || c == 0) return;
  const T* p = a.in[0].as<const T>();
  const T* t = a.in[1].as<const T>();
  const T* w = a.in[2].as<const T>();
  T* dx = a.out[0].as<T>();
  double wsum = 0;
  for (int64_t r = 0; r < b; ++r)
    if (w[r] != 0) wsum += static_cast<double>(w[r]);
  const double k = 2.0 * a.attrs.get("scale", 1.0) / (static_cast<double>(c) * std::max(wsum, 1.0));
  for (int64_t r = 0; r < b; ++r) {
    const double wr = w[r];
    for (int64_t j = 0; j < c; ++j) {
      const int64_t i = r * c + j;
      dx[i] = static_cast<T>(
          wr == 0 ? 0.0 : k * wr * (static_cast<double>(p[i]) - static_cast<double>(t[i])));
    }
  }
}

// ---- softmax cross-entropy with one class id per row ------------------------------
//
// loss = mean over the rows whose id c is in [0, C) of lse(x_r) − x_r[c];
// every other id (−1 for padding; anything else the session refuses) marks
// the row as ignored: it is not read, and its gradient is 0. No row counted:
// the loss is 0.

bool counted(int32_t c, int64_t l) {
  return c >= 0 && c < l;
}

template <class T>
void xent_index_fwd(const KernelArgs& a) {
  const auto [b, l] = rows_cols(a.in[0]);
  const T* x = a.in[0].as<const T>();
  const int32_t* t = a.in[1].as<const int32_t>();
  double total = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r) {
    if (!counted(t[r], l)) continue;
    ++n;
    total += row_log_sum_exp(x + r * l, l) - static_cast<double>(x[r * l + t[r]]);
  }
  *a.out[0].as<T>() = static_cast<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

template <class T>
void xent_index_grad(const KernelArgs& a) {
  const auto [b, l] = rows_cols(a.in[0]);
  if (b == 0 || l == 0) return;
  const T* x = a.in[0].as<const T>();
  const int32_t* t = a.in[1].as<const int32_t>();
  T* dx = a.out[0].as<T>();
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r) n += counted(t[r], l) ? 1 : 0;
  const double k = a.attrs.get("scale", 1.0) / static_cast<double>(std::max<int64_t>(n, 1));
  for (int64_t r = 0; r < b; ++r) {
    const T* xr = x + r * l;
    T* dr = dx + r * l;
    if (!counted(t[r], l)) {
      std::fill(dr, dr + l, T{0});
      continue;
    }
    const double lse = row_log_sum_exp(xr, l);
    for (int64_t j = 0; j < l; ++j) {
      const double pj = std::exp(static_cast<double>(xr[j]) - lse);
      dr[j] = static_cast<T>(k * (pj - (j == t[r] ? 1.0 : 0.0)));
    }
  }
}

template <void (*F32)(const KernelArgs&), void (*F64)(const KernelArgs&)>
void by_dtype(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    F64(a);
  else
    F32(a);
}

}  // namespace

std::vector<KernelVariant> ref_loss_kernels() {
  return {
      {"bce_logits", "ref", fwd<Loss::bce>, nullptr, true, ref_float_operands},
      {"bce_logits_grad", "ref", grad<Loss::bce>, nullptr, true, ref_float_operands},
      {"squared_hinge", "ref", fwd<Loss::hinge>, nullptr, true, ref_float_operands},
      {"squared_hinge_grad", "ref", grad<Loss::hinge>, nullptr, true, ref_float_operands},
      {"softmax_xent", "ref", fwd<Loss::xent>, nullptr, true, ref_float_operands},
      {"softmax_xent_grad", "ref", grad<Loss::xent>, nullptr, true, ref_float_operands},
      {"bce_logits_csr", "ref", csr_fwd<Loss::bce>, csr_workspace, true, ref_float_operands},
      {"bce_logits_csr_grad", "ref", csr_grad<Loss::bce>, csr_workspace, true, ref_float_operands},
      {"squared_hinge_csr", "ref", csr_fwd<Loss::hinge>, csr_workspace, true, ref_float_operands},
      {"squared_hinge_csr_grad", "ref", csr_grad<Loss::hinge>, csr_workspace, true,
       ref_float_operands},
      {"softmax_xent_csr", "ref", csr_fwd<Loss::xent>, csr_workspace, true, ref_float_operands},
      {"softmax_xent_csr_grad", "ref", csr_grad<Loss::xent>, csr_workspace, true,
       ref_float_operands},
      {"mse", "ref", by_dtype<mse_fwd<float>, mse_fwd<double>>, nullptr, true, ref_float_operands},
      {"mse_grad", "ref", by_dtype<mse_grad<float>, mse_grad<double>>, nullptr, true,
       ref_float_operands},
      {"softmax_xent_index", "ref", by_dtype<xent_index_fwd<float>, xent_index_fwd<double>>,
       nullptr, true, ref_float_operands},
      {"softmax_xent_index_grad", "ref", by_dtype<xent_index_grad<float>, xent_index_grad<double>>,
       nullptr, true, ref_float_operands},
  };
}

}  // namespace pooch::kern
