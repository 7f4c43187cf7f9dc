// The scalars of one optimizer update, formed on the host in double and
// rounded to float once (as torch does with Python floats), shared by the
// fast CPU and the CUDA kernels so both apply the same numbers. The reference
// kernels (kernels/ref/optim.cpp) keep their own, independent derivation.
#pragma once
#include <cmath>

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

}  // namespace pooch::kern
