// Reference kernels of the fused fixed fan-in output layer (ffi_loss,
// ffi_loss_grad, ffi_topk; runtime/core/ops/ffi_head_ops.cpp): one logit at a
// time in double, never a row of logits, so their scratch does not grow with
// the label count either. Each is the composition of the unfused reference
// kernels it replaces (ffi_linear, then the *_csr loss or topk), written out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common/supports.h"
#include "loss_math.h"
#include "ref_kernels.h"
#include "topk_order.h"

namespace pooch::kern {
namespace {

enum class Loss { bce = 0, hinge = 1, xent = 2 };

template <class T, class I>
struct Layer {
  const T* h;
  const I* index;
  const T* w;
  const T* bias;
  int64_t batch, hidden, labels, fan_in;

  explicit Layer(const KernelArgs& a)
      : h(a.in[0].as<T>()),
        index(a.in[1].as<I>()),
        w(a.in[2].as<T>()),
        bias(a.in[3].as<T>()),
        batch(a.in[0].shape[0]),
        hidden(a.in[0].shape[1]),
        labels(a.in[1].shape[0]),
        fan_in(a.in[1].shape[1]) {}

  // ffi_linear's value for row r, label l, rounded to T as it stores it.
  double logit(int64_t r, int64_t l) const {
    double acc = 0;
    for (int64_t k = 0; k < fan_in; ++k)
      acc += static_cast<double>(h[r * hidden + int64_t{index[l * fan_in + k]}]) *
             static_cast<double>(w[l * fan_in + k]);
    return static_cast<double>(static_cast<T>(acc + static_cast<double>(bias[l])));
  }
};

// Whether label l is among row r's targets (the rows' labels are distinct).
bool is_target(const int32_t* lptr, const int32_t* lidx, int64_t r, int64_t l) {
  for (int64_t j = lptr[r]; j < lptr[r + 1]; ++j)
    if (lidx[j] == l) return true;
  return false;
}

// Row r's log-sum-exp over all labels, shifted by the row maximum (as the
// unfused reference: a non-finite maximum leaves the sum unshifted).
template <class T, class I>
double row_lse(const Layer<T, I>& y, int64_t r) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t l = 0; l < y.labels; ++l) m = std::max(m, y.logit(r, l));
  const double shift = std::isfinite(m) ? m : 0.0;
  double s = 0;
  for (int64_t l = 0; l < y.labels; ++l) s += std::exp(y.logit(r, l) - shift);
  return shift + std::log(s);
}

// The loss (ffi_loss's output; ffi_loss_grad's last), rounded to T.
template <class T, class I>
T loss_of(const KernelArgs& a) {
  const Layer<T, I> y(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  double total = 0;
  for (int64_t r = 0; r < y.batch; ++r) {
    double row = 0;
    if (kind == Loss::xent) {
      if (y.labels > 0) {
        const double lse = row_lse(y, r);
        for (int64_t j = lptr[r]; j < lptr[r + 1]; ++j) row += lse - y.logit(r, lidx[j]);
      }
    } else {
      for (int64_t l = 0; l < y.labels; ++l) {
        const double x = y.logit(r, l), t = is_target(lptr, lidx, r, l) ? 1.0 : 0.0;
        const double m = refmath::hinge_margin(x, t);
        row += kind == Loss::bce ? refmath::bce_term(x, t) : m * m;
      }
    }
    total += row;
  }
  return static_cast<T>(y.batch > 0 ? total / static_cast<double>(y.batch) : 0.0);
}

template <class T, class I>
void loss_fwd(const KernelArgs& a) {
  *a.out[0].as<T>() = loss_of<T, I>(a);
}

// Scratch: dh accumulated in double [B, H] and each row's log-sum-exp [B].
size_t loss_grad_ws(const KernelArgs& a) {
  return static_cast<size_t>(a.in[0].shape[0]) * (static_cast<size_t>(a.in[0].shape[1]) + 1) *
         sizeof(double);
}

template <class T, class I>
void loss_grad(const KernelArgs& a) {
  const Layer<T, I> y(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  T* dh = a.out[0].as<T>();
  T* dw = a.out[1].as<T>();
  T* db = a.out[2].as<T>();
  double* dh_acc = static_cast<double*>(a.workspace);
  double* lse = dh_acc + y.batch * y.hidden;
  std::fill(dh_acc, dh_acc + y.batch * y.hidden, 0.0);
  const double scale = y.batch > 0 ? a.attrs.get("scale", 1.0) / static_cast<double>(y.batch) : 0;
  for (int64_t r = 0; r < y.batch; ++r) lse[r] = kind == Loss::xent ? row_lse(y, r) : 0.0;
  for (int64_t l = 0; l < y.labels; ++l) {
    double gb = 0;
    for (int64_t k = 0; k < y.fan_in; ++k) {
      const int64_t u = y.index[l * y.fan_in + k];
      double gw = 0;
      for (int64_t r = 0; r < y.batch; ++r) {
        const double x = y.logit(r, l), t = is_target(lptr, lidx, r, l) ? 1.0 : 0.0;
        double g;
        if (kind == Loss::xent)
          g = std::exp(x - lse[r]) * static_cast<double>(lptr[r + 1] - lptr[r]) - t;
        else if (kind == Loss::bce)
          g = refmath::sigmoid(x) - t;
        else
          g = -2.0 * (2.0 * t - 1.0) * refmath::hinge_margin(x, t);
        // The unfused gradient is stored in T before the layer's backward reads it.
        g = static_cast<double>(static_cast<T>(scale * g));
        if (k == 0) gb += g;
        gw += g * static_cast<double>(y.h[r * y.hidden + u]);
        dh_acc[r * y.hidden + u] += g * static_cast<double>(y.w[l * y.fan_in + k]);
      }
      dw[l * y.fan_in + k] = static_cast<T>(gw);
    }
    if (y.fan_in == 0)
      for (int64_t r = 0; r < y.batch; ++r) {
        const double x = y.logit(r, l), t = is_target(lptr, lidx, r, l) ? 1.0 : 0.0;
        const double g = kind == Loss::xent
                             ? std::exp(x - lse[r]) * double(lptr[r + 1] - lptr[r]) - t
                         : kind == Loss::bce ? refmath::sigmoid(x) - t
                                             : -2.0 * (2.0 * t - 1.0) * refmath::hinge_margin(x, t);
        gb += static_cast<double>(static_cast<T>(scale * g));
      }
    db[l] = static_cast<T>(gb);
  }
  for (int64_t i = 0; i < y.batch * y.hidden; ++i) dh[i] = static_cast<T>(dh_acc[i]);
  if (a.n_out > 3) *a.out[3].as<T>() = loss_of<T, I>(a);  // with_loss
}

// Scratch: the running top k of one row (value and position).
size_t topk_ws(const KernelArgs& a) {
  return static_cast<size_t>(a.out[0].shape[1]) * (sizeof(double) + sizeof(int64_t));
}

template <class T, class I>
void topk(const KernelArgs& a) {
  const Layer<T, I> y(a);
  T* values = a.out[0].as<T>();
  int32_t* indices = a.out[1].as<int32_t>();
  const int64_t k = a.out[0].shape[1];
  auto* best_v = static_cast<T*>(a.workspace);
  auto* best_i = reinterpret_cast<int64_t*>(static_cast<char*>(a.workspace) + k * sizeof(double));
  for (int64_t r = 0; r < y.batch; ++r) {
    int64_t n = 0;  // best_v/best_i[0..n) in rank order
    for (int64_t l = 0; l < y.labels; ++l) {
      const T v = static_cast<T>(y.logit(r, l));
      if (n == k && !refmath::ranks_above(v, l, best_v[n - 1], best_i[n - 1])) continue;
      int64_t p = n < k ? n++ : k - 1;  // insertion sort into the list
      while (p > 0 && refmath::ranks_above(v, l, best_v[p - 1], best_i[p - 1])) {
        best_v[p] = best_v[p - 1];
        best_i[p] = best_i[p - 1];
        --p;
      }
      best_v[p] = v;
      best_i[p] = l;
    }
    for (int64_t j = 0; j < k; ++j) {
      values[r * k + j] = best_v[j];
      indices[r * k + j] = static_cast<int32_t>(best_i[j]);
    }
  }
}

template <template <class, class> class Fn>
void dispatch(const KernelArgs& a) {
  const bool f64 = a.in[0].dtype == DType::f64, i32 = a.in[1].dtype == DType::i32;
  if (f64)
    i32 ? Fn<double, int32_t>::run(a) : Fn<double, uint16_t>::run(a);
  else
    i32 ? Fn<float, int32_t>::run(a) : Fn<float, uint16_t>::run(a);
}
template <class T, class I>
struct LossFwd {
  static void run(const KernelArgs& a) { loss_fwd<T, I>(a); }
};
template <class T, class I>
struct LossGrad {
  static void run(const KernelArgs& a) { loss_grad<T, I>(a); }
};
template <class T, class I>
struct TopK {
  static void run(const KernelArgs& a) { topk<T, I>(a); }
};

void ffi_loss_ref(const KernelArgs& a) {
  dispatch<LossFwd>(a);
}
void ffi_loss_grad_ref(const KernelArgs& a) {
  dispatch<LossGrad>(a);
}
void ffi_topk_ref(const KernelArgs& a) {
  dispatch<TopK>(a);
}

bool supports(const KernelArgs& a) {
  return ref_float_operands(a) && is_index_dtype(a.in[1].dtype);
}

}  // namespace

std::vector<KernelVariant> ref_ffi_head_kernels() {
  return {
      {"ffi_loss", "ref", ffi_loss_ref, nullptr, true, supports},
      {"ffi_loss_grad", "ref", ffi_loss_grad_ref, loss_grad_ws, true, supports},
      {"ffi_topk", "ref", ffi_topk_ref, topk_ws, true, supports},
  };
}

}  // namespace pooch::kern
