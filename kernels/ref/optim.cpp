// Reference optimizer updates (docs/OPS.md, "Optimizer updates"): the
// formulas of torch.optim.SGD and torch.optim.Adam/AdamW, evaluated in double
// and rounded once when stored back. The ops have no outputs; they write w and
// the state tensors in place.
#include <cmath>

#include "../common/supports.h"
#include "ref_kernels.h"

namespace pooch::kern {
namespace {

struct SgdParams {
  double lr, momentum, wd;
  double clip = 1.0;  // the gradient's factor from clipping by global norm
};

// The context's lr_scale is the learning-rate schedule: like a torch
// scheduler rewriting group['lr'], it scales every use of lr.
double scheduled_lr(const KernelAttrs& at, const KernelContext* ctx) {
  return at.get("lr", 1e-3) * (ctx ? ctx->lr_scale : 1.0);
}

SgdParams sgd_params(const KernelAttrs& at, const KernelContext* ctx) {
  return {scheduled_lr(at, ctx), at.get("momentum", 0.0), at.get("weight_decay", 0.0)};
}

// torch.nn.utils.clip_grad_norm_: every gradient times
// min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ over all of them; the update's input
// `at` (when present) holds ‖g‖².
double clip_factor(const KernelArgs& a, int at) {
  if (a.n_in <= at) return 1.0;
  const double norm = std::sqrt(static_cast<double>(a.in[at].as<const float>()[0]));
  const double c = a.attrs.get("max_norm", 1.0) / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

struct AdamParams {
  double lr, beta1, beta2, eps, wd;
  bool decoupled;
  double step_size;  // lr / (1 - beta1^t)
  double bc2_sqrt;   // sqrt(1 - beta2^t)
  double clip = 1.0;
};

AdamParams adam_params(const KernelAttrs& at, const KernelContext* ctx) {
  AdamParams p{scheduled_lr(at, ctx),
               at.get("beta1", 0.9),
               at.get("beta2", 0.999),
               at.get("eps", 1e-8),
               at.get("weight_decay", 0.0),
               at.get("decoupled", 0.0) != 0.0,
               0.0,
               0.0};
  // Step 0 would divide by 1 - beta^0 = 0 and turn every weight into NaN; a
  // context that has not counted any step yet is making the first update.
  const uint64_t step = ctx && ctx->step > 0 ? ctx->step : 1;
  const double t = static_cast<double>(step);
  p.step_size = p.lr / (1.0 - std::pow(p.beta1, t));
  p.bc2_sqrt = std::sqrt(1.0 - std::pow(p.beta2, t));
  return p;
}

// One row (or the whole tensor) of SGD; mom is untouched without momentum, as
// torch keeps no buffer then.
template <class T>
void sgd_span(const SgdParams& p, T* w, const T* g, T* mom, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double wi = w[i];
    double d = static_cast<double>(g[i]) * p.clip + p.wd * wi;
    if (p.momentum != 0.0) {
      double m = p.momentum * static_cast<double>(mom[i]) + d;
      mom[i] = static_cast<T>(m);
      d = m;
    }
    w[i] = static_cast<T>(wi - p.lr * d);
  }
}

// torch's order: decay (coupled into g, or decoupled onto w), moments, then
// w -= step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), eps added after
// the bias correction.
template <class T>
void adam_span(const AdamParams& p, T* w, const T* g, T* m, T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double wi = w[i];
    double gi = static_cast<double>(g[i]) * p.clip;
    if (p.decoupled)
      wi *= 1.0 - p.lr * p.wd;
    else
      gi += p.wd * wi;
    double mi = p.beta1 * static_cast<double>(m[i]) + (1.0 - p.beta1) * gi;
    double vi = p.beta2 * static_cast<double>(v[i]) + (1.0 - p.beta2) * gi * gi;
    double denom = std::sqrt(vi) / p.bc2_sqrt + p.eps;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    w[i] = static_cast<T>(wi - p.step_size * mi / denom);
  }
}

// Row-sparse updates read rows[0] = n and rows[1..n]. The producer guarantees
// 0 <= n <= R and ids in [0, F); a kernel cannot report an error, so anything
// outside those bounds is skipped instead of written out of bounds.
int64_t listed_rows(const TensorView& rows) {
  const int64_t cap = rows.numel() - 1;
  if (cap < 0) return 0;
  const int64_t n = rows.as<const int32_t>()[0];
  return n < 0 ? 0 : (n > cap ? cap : n);
}

template <class T>
void sgd_dense(const KernelArgs& a) {
  SgdParams p = sgd_params(a.attrs, a.ctx);
  p.clip = clip_factor(a, 3);
  sgd_span<T>(p, a.in[0].as<T>(), a.in[1].as<const T>(), a.in[2].as<T>(), a.in[0].numel());
}

template <class T>
void adam_dense(const KernelArgs& a) {
  AdamParams p = adam_params(a.attrs, a.ctx);
  p.clip = clip_factor(a, 4);
  adam_span<T>(p, a.in[0].as<T>(), a.in[1].as<const T>(), a.in[2].as<T>(), a.in[3].as<T>(),
               a.in[0].numel());
}

// out = acc + Σ g², summed in double in element order.
template <class T>
void grad_sumsq(const KernelArgs& a) {
  double s = a.n_in > 1 ? static_cast<double>(a.in[1].as<const float>()[0]) : 0.0;
  const T* g = a.in[0].as<const T>();
  for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i)
    s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  a.out[0].as<float>()[0] = static_cast<float>(s);
}

template <class T>
void sgd_rows(const KernelArgs& a) {
  const SgdParams p = sgd_params(a.attrs, a.ctx);
  const int64_t f = a.in[0].ndim == 2 ? a.in[0].shape[0] : 0;
  const int64_t o = a.in[0].ndim == 2 ? a.in[0].shape[1] : 0;
  const int64_t n = listed_rows(a.in[1]);
  const int32_t* ids = a.in[1].as<const int32_t>() + 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    if (r < 0 || r >= f) continue;
    sgd_span<T>(p, a.in[0].as<T>() + r * o, a.in[2].as<const T>() + i * o, a.in[3].as<T>() + r * o,
                o);
  }
}

template <class T>
void adam_rows(const KernelArgs& a) {
  const AdamParams p = adam_params(a.attrs, a.ctx);
  const int64_t f = a.in[0].ndim == 2 ? a.in[0].shape[0] : 0;
  const int64_t o = a.in[0].ndim == 2 ? a.in[0].shape[1] : 0;
  const int64_t n = listed_rows(a.in[1]);
  const int32_t* ids = a.in[1].as<const int32_t>() + 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    if (r < 0 || r >= f) continue;
    adam_span<T>(p, a.in[0].as<T>() + r * o, a.in[2].as<const T>() + i * o, a.in[3].as<T>() + r * o,
                 a.in[4].as<T>() + r * o, o);
  }
}

// The weight's dtype decides; shape inference made every float operand match it.
template <void (*F32)(const KernelArgs&), void (*F64)(const KernelArgs&)>
void by_dtype(const KernelArgs& a) {
  if (a.in[0].dtype == DType::f64)
    F64(a);
  else
    F32(a);
}

}  // namespace

std::vector<KernelVariant> ref_optim_kernels() {
  return {
      {"grad_sumsq", "ref", by_dtype<grad_sumsq<float>, grad_sumsq<double>>, nullptr, true,
       ref_float_operands},
      {"sgd_update", "ref", by_dtype<sgd_dense<float>, sgd_dense<double>>, nullptr, true,
       ref_float_operands},
      {"adam_update", "ref", by_dtype<adam_dense<float>, adam_dense<double>>, nullptr, true,
       ref_float_operands},
      {"sgd_update_rows", "ref", by_dtype<sgd_rows<float>, sgd_rows<double>>, nullptr, true,
       ref_float_operands},
      {"adam_update_rows", "ref", by_dtype<adam_rows<float>, adam_rows<double>>, nullptr, true,
       ref_float_operands},
  };
}

}  // namespace pooch::kern
