// The scalars of one optimizer update, formed on the host in double and
// rounded to float once (as torch does with Python floats), and the update of
// one element, shared by the fast CPU and the CUDA kernels so both apply the
// same numbers in the same float operations. The reference kernels
// (kernels/ref/optim.cpp) keep their own, independent derivation.
#pragma once
#include <cmath>

#include "float_ops.h"
#include "kernel_abi.h"

#if defined(__CUDACC__)
#define POOCH_HOST_DEVICE __host__ __device__
#else
#define POOCH_HOST_DEVICE
#endif

namespace pooch::kern {

// The context's lr_scale is the learning-rate schedule: like a torch
// scheduler rewriting group['lr'], it scales every use of lr.
inline double scheduled_lr(const KernelAttrs& at, const KernelContext* ctx) {
  return at.get("lr", 1e-3) * (ctx ? ctx->lr_scale : 1.0);
}

// torch.nn.utils.clip_grad_norm_'s factor, min(1, max_norm / (‖g‖ + 1e-6)),
// from ‖g‖² (the update's last input): formed in double, rounded once.
// CUDA kernels call it on the device, reading ‖g‖² there.
POOCH_HOST_DEVICE inline float clip_coef(float sumsq, double max_norm) {
  const double c = max_norm / (sqrt(static_cast<double>(sumsq)) + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

struct SgdParams {
  float lr, momentum, wd;
};

inline SgdParams sgd_params(const KernelAttrs& at, const KernelContext* ctx) {
  return {static_cast<float>(scheduled_lr(at, ctx)), static_cast<float>(at.get("momentum", 0.0)),
          static_cast<float>(at.get("weight_decay", 0.0))};
}

struct AdamParams {
  float beta1, one_m_beta1, beta2, one_m_beta2, eps;
  float wd;
  float decay;  // 1 - lr*wd, the decoupled (AdamW) shrink factor
  int decoupled;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
};

inline AdamParams adam_params(const KernelAttrs& at, const KernelContext* ctx) {
  const double lr = scheduled_lr(at, ctx), b1 = at.get("beta1", 0.9), b2 = at.get("beta2", 0.999);
  const double wd = at.get("weight_decay", 0.0);
  // Step 0 would divide by 1 - beta^0 = 0; a context that has not counted any
  // step yet is making the first update (the reference does the same).
  const double t = static_cast<double>(ctx && ctx->step > 0 ? ctx->step : 1);
  AdamParams p;
  p.beta1 = static_cast<float>(b1);
  p.one_m_beta1 = static_cast<float>(1.0 - b1);
  p.beta2 = static_cast<float>(b2);
  p.one_m_beta2 = static_cast<float>(1.0 - b2);
  p.eps = static_cast<float>(at.get("eps", 1e-8));
  p.wd = static_cast<float>(wd);
  p.decay = static_cast<float>(1.0 - lr * wd);
  p.decoupled = at.get("decoupled", 0.0) != 0.0;
  p.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(b1, t))));
  p.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
  return p;
}

// ---- one element ------------------------------------------------------------
// An update runs on the device in one plan and on the host in another (out of
// core, where its weight and state are paged: docs/PLANNER.md, "Updates on
// the host"), and both must give the in-core bits. So every multiply that
// meets an add is written out (float_ops.h): fused (fused_ma: one rounding)
// or a product that only feeds an fma's addend or a division, so that
// neither GCC's nor nvcc's contraction has a choice left. The fusions are
// those GCC made of the plain expressions (torch.optim's sequence) in the AVX
// clones, so the CPU's bits there did not change; the clone without FMA now
// computes the same fused operations in software (the same bits on every x86
// machine), and the CUDA kernels, which nvcc had contracted as it saw fit,
// now match them.

// SGD (torch.optim.SGD): d = g·c + wd·w; with momentum m = momentum·m + d,
// w = w − lr·m; without, w = w − lr·d. `c` is the clipping factor (1: none).
POOCH_ELEMENT void sgd_element(const SgdParams& p, float c, float& w, float g, float* mom) {
  const float d = fused_ma(g, c, mul_rn(p.wd, w));
  if (mom) {
    const float m = fused_ma(p.momentum, *mom, d);
    *mom = m;
    w = fused_ma(-p.lr, m, w);
  } else {
    w = fused_ma(-p.lr, d, w);
  }
}

// Adam / AdamW (torch.optim.Adam, AdamW): m = β1·m + (1−β1)·g,
// v = β2·v + (1−β2)·g·g, w = w·decay + step·m / (√v / √(1−β2^t) + eps) (AdamW:
// decay = 1 − lr·wd; Adam: g = g·c + wd·w, no decay).
POOCH_ELEMENT void adam_element(const AdamParams& p, float c, float& w, float g, float& m,
                                float& v) {
  const float gi = p.decoupled ? mul_rn(g, c) : fused_ma(g, c, mul_rn(p.wd, w));
  const float mi = fused_ma(m, p.beta1, mul_rn(p.one_m_beta1, gi));
  const float vi = fused_ma(v, p.beta2, mul_rn(mul_rn(p.one_m_beta2, gi), gi));
  const float denom = sqrtf(vi) / p.bc2_sqrt + p.eps;
  const float step = mul_rn(p.neg_step_size, mi) / denom;
  m = mi;
  v = vi;
  w = p.decoupled ? fused_ma(w, p.decay, step) : w + step;
}

}  // namespace pooch::kern
