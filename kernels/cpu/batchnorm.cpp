// Batch normalisation on the CPU (docs/OPS.md, "Convolutional"): x[N,C] or
// x[N,C,H,W], statistics per channel.
//
// OpenMP loops, not oneDNN: oneDNN 2.6's batch normalisation on the plain
// NCHW layout (ncsp_bnorm) ran at about 3 GB/s here, an eighth of the
// element-wise ops' rate, and 15% of a ResNet-50 step. One channel's values
// (N runs of S contiguous floats) are read by one thread, a few times while
// they are still in its cache, and summed in double precision in a fixed
// order, so the bits do not depend on the thread count.
#include <omp.h>

#include <cmath>
#include <cstdint>

#include "../common/supports.h"
#include "cpu_kernels.h"

namespace pooch::kern {
namespace {

// N images of C channels of S values.
struct BnDims {
  int64_t N, C, S;
};

BnDims bn_dims(const TensorView& x) {
  return {x.shape[0], x.shape[1], x.ndim == 4 ? x.shape[2] * x.shape[3] : 1};
}

// Σ x over one channel.
double channel_sum(const float* x, const BnDims& d) {
  double s = 0;
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = x + n * d.C * d.S;
#pragma omp simd reduction(+ : s)
    for (int64_t p = 0; p < d.S; ++p) s += static_cast<double>(v[p]);
  }
  return s;
}

// Σ (x − mean)² over one channel.
double channel_sq_dev(const float* x, const BnDims& d, double mean) {
  double q = 0;
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = x + n * d.C * d.S;
#pragma omp simd reduction(+ : q)
    for (int64_t p = 0; p < d.S; ++p) {
      const double t = static_cast<double>(v[p]) - mean;
      q += t * t;
    }
  }
  return q;
}

// One channel's batch statistics: the mean, the biased variance and Σ(x −
// mean)² (for the running variance's unbiased estimate). No values: all 0
// (as the reference).
struct ChannelStats {
  double mean = 0, var = 0, sq_dev = 0;
};

// Not inlined, like channel_normalise: batchnorm and batchnorm_replay must
// run the same instructions, so that a recompute gives the forward's bits.
[[gnu::noinline]] ChannelStats batch_stats(const float* xc, const BnDims& d) {
  const int64_t count = d.N * d.S;
  if (!count) return {};
  ChannelStats st;
  st.mean = channel_sum(xc, d) / static_cast<double>(count);
  st.sq_dev = channel_sq_dev(xc, d, st.mean);
  st.var = st.sq_dev / static_cast<double>(count);
  return st;
}

// y = (x − mean)·scale + shift over one channel, scale = γ/√(var + eps)
// (x − mean first: where the mean is large against the spread, x·scale and
// mean·scale would cancel). The loop subtracts the mean rounded to float;
// what rounding took off goes into the shift, in double, so a large mean
// loses nothing.
[[gnu::noinline]] void channel_normalise(const float* x, float* y, const BnDims& d, double mean,
                                         double var, float gamma, float beta, double eps) {
  const double scale = gamma / std::sqrt(var + eps);
  const float fmean = static_cast<float>(mean);
  const auto fscale = static_cast<float>(scale);
  const auto shift = static_cast<float>(beta - (mean - fmean) * scale);
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = x + n * d.C * d.S;
    float* w = y + n * d.C * d.S;
#pragma omp simd
    for (int64_t p = 0; p < d.S; ++p) w[p] = (v[p] - fmean) * fscale + shift;
  }
}

void batchnorm(const KernelArgs& a) {
  const BnDims d = bn_dims(a.in[0]);
  const float* x = a.in[0].as<float>();
  const float* gamma = a.in[1].as<float>();
  const float* beta = a.in[2].as<float>();
  float* rmean = a.in[3].as<float>();
  float* rvar = a.in[4].as<float>();
  float* y = a.out[0].as<float>();
  float* mean_out = a.out[1].as<float>();
  float* var_out = a.out[2].as<float>();
  const double eps = a.attrs.get("eps", 1e-5), mom = a.attrs.get("momentum", 0.1);
  const bool training = !a.ctx || a.ctx->training;
  const int64_t count = d.N * d.S;
#pragma omp parallel for num_threads(threads_of(a)) if (count * d.C > 32768) schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const float* xc = x + c * d.S;
    double mean, var;
    if (training) {
      const ChannelStats st = batch_stats(xc, d);
      mean = st.mean;
      var = st.var;
      // The running averages move toward the batch's statistics (those of
      // nothing are 0). The running variance takes the unbiased estimate
      // (PyTorch's rule); one value has none, and the batch variance stands in.
      const double unbiased = count > 1 ? st.sq_dev / static_cast<double>(count - 1) : var;
      rmean[c] = static_cast<float>((1 - mom) * rmean[c] + mom * mean);
      rvar[c] = static_cast<float>((1 - mom) * rvar[c] + mom * unbiased);
    } else {
      mean = rmean[c];
      var = rvar[c];
    }
    mean_out[c] = static_cast<float>(mean);
    var_out[c] = static_cast<float>(var);
    channel_normalise(xc, y + c * d.S, d, mean, var, gamma[c], beta[c], eps);
  }
}

// batchnorm's training output again: the same statistics and normalisation
// code, nothing else written (a recompute, docs/OPS.md).
void batchnorm_replay(const KernelArgs& a) {
  const BnDims d = bn_dims(a.in[0]);
  const float* x = a.in[0].as<float>();
  const float* gamma = a.in[1].as<float>();
  const float* beta = a.in[2].as<float>();
  float* y = a.out[0].as<float>();
  const double eps = a.attrs.get("eps", 1e-5);
#pragma omp parallel for num_threads(threads_of(a)) if (d.N * d.S * d.C > 32768) schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const ChannelStats st = batch_stats(x + c * d.S, d);
    channel_normalise(x + c * d.S, y + c * d.S, d, st.mean, st.var, gamma[c], beta[c], eps);
  }
}

// dβ = Σ dy, dγ = Σ dy·x̂, dx = γ·rstd·(dy − dβ/m − x̂·dγ/m), x̂ = (x − mean)·rstd.
void batchnorm_grad(const KernelArgs& a) {
  const BnDims d = bn_dims(a.in[1]);
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  const float* gamma = a.in[2].as<float>();
  const float* mean = a.in[3].as<float>();
  const float* var = a.in[4].as<float>();
  float* dx = a.out[0].as<float>();
  float* dgamma = a.out[1].as<float>();
  float* dbeta = a.out[2].as<float>();
  const double eps = a.attrs.get("eps", 1e-5);
  const int64_t count = d.N * d.S;
  const double m = static_cast<double>(count);
#pragma omp parallel for num_threads(threads_of(a)) if (count * d.C > 32768) schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const double mu = mean[c];
    const double rstd = 1.0 / std::sqrt(var[c] + eps);
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = dy + (n * d.C + c) * d.S;
      const float* v = x + (n * d.C + c) * d.S;
#pragma omp simd reduction(+ : sdy, sdyx)
      for (int64_t p = 0; p < d.S; ++p) {
        sdy += static_cast<double>(g[p]);
        sdyx += static_cast<double>(g[p]) * (static_cast<double>(v[p]) - mu);
      }
    }
    sdyx *= rstd;
    dbeta[c] = static_cast<float>(sdy);
    dgamma[c] = static_cast<float>(sdyx);
    if (!count) continue;
    // dx = k·dy + kx·(x − mean) + k0: the terms of the formula above grouped
    // by what they multiply.
    const float k = static_cast<float>(gamma[c] * rstd);
    const float kx = static_cast<float>(-gamma[c] * rstd * rstd * sdyx / m);
    const float k0 = static_cast<float>(-gamma[c] * rstd * sdy / m);
    const float fmu = mean[c];
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = dy + (n * d.C + c) * d.S;
      const float* v = x + (n * d.C + c) * d.S;
      float* w = dx + (n * d.C + c) * d.S;
#pragma omp simd
      for (int64_t p = 0; p < d.S; ++p) w[p] = g[p] * k + (v[p] - fmu) * kx + k0;
    }
  }
}

}  // namespace

std::vector<KernelVariant> cpu_batchnorm_kernels() {
  return {
      KernelVariant{"batchnorm", "omp", batchnorm, nullptr, true, f32_operands},
      KernelVariant{"batchnorm_replay", "omp", batchnorm_replay, nullptr, true, f32_operands},
      KernelVariant{"batchnorm_grad", "omp", batchnorm_grad, nullptr, true, f32_operands},
  };
}

}  // namespace pooch::kern
