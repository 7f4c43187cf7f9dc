// Reference loss kernels (docs/OPS.md, "Losses"). Every element is computed in
// double whatever the storage type, so the f32 reference is as close to the
// exact value as one final rounding allows, and the f64 run used for finite
// differences is smooth to double precision.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ref_kernels.h"

namespace pooch::kern {
namespace {

// Only e^-|x| <= 1 is ever formed, and the part that grows with |x|,
// max(x,0) - x*t, needs no exponential: accurate for logits of any magnitude.
double bce_term(double x, double t) {
  return std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::fabs(x)));
}

// sigma(x) from the side where the exponential cannot overflow.
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}

// max(1 - s*x, 0) with the operands in the order that keeps a NaN, as
// torch's clamp does.
double hinge_margin(double x, double t) {
  double s = 2.0 * t - 1.0;
  return std::max(1.0 - s * x, 0.0);
}

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
  const int64_t b = xv.ndim == 2 ? xv.shape[0] : 0;
  const int64_t l = xv.ndim == 2 ? xv.shape[1] : 0;
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
  const int64_t b = xv.ndim == 2 ? xv.shape[0] : 0;
  const int64_t l = xv.ndim == 2 ? xv.shape[1] : 0;
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

}  // namespace

std::vector<KernelVariant> ref_loss_kernels() {
  return {
      {"bce_logits", "ref", fwd<Loss::bce>, nullptr, true},
      {"bce_logits_grad", "ref", grad<Loss::bce>, nullptr, true},
      {"squared_hinge", "ref", fwd<Loss::hinge>, nullptr, true},
      {"squared_hinge_grad", "ref", grad<Loss::hinge>, nullptr, true},
      {"softmax_xent", "ref", fwd<Loss::xent>, nullptr, true},
      {"softmax_xent_grad", "ref", grad<Loss::xent>, nullptr, true},
      {"bce_logits_csr", "ref", csr_fwd<Loss::bce>, csr_workspace, true},
      {"bce_logits_csr_grad", "ref", csr_grad<Loss::bce>, csr_workspace, true},
      {"squared_hinge_csr", "ref", csr_fwd<Loss::hinge>, csr_workspace, true},
      {"squared_hinge_csr_grad", "ref", csr_grad<Loss::hinge>, csr_workspace, true},
      {"softmax_xent_csr", "ref", csr_fwd<Loss::xent>, csr_workspace, true},
      {"softmax_xent_csr_grad", "ref", csr_grad<Loss::xent>, csr_workspace, true},
  };
}

}  // namespace pooch::kern
