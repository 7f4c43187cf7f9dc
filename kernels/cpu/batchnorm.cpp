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

// ---- nChw16c (Layout::nchw16c) --------------------------------------------------
//
// Block b holds channels 16b .. 16b + 15: for image n, S positions of 16
// lanes at (n·C/16 + b)·S·16, lane j channel 16b + j. A thread takes whole
// blocks and sums each lane over (n, p) in that order, in double (vectors of
// the 16 lanes), so the bits do not depend on the thread count. They are
// not the plain loops' (the same terms in another order), and the
// normalisation is the plain loop's, lane by lane.
constexpr int64_t kLanes = 16;

struct BlockStats {
  double mean[kLanes] = {}, var[kLanes] = {}, sq_dev[kLanes] = {};
};

// One block's batch statistics, as batch_stats computes one channel's.
// Not inlined, like batch_stats: batchnorm and batchnorm_replay share it.
[[gnu::noinline]] BlockStats block_stats(const float* xb, const BnDims& d) {
  BlockStats st;
  const int64_t count = d.N * d.S;
  if (!count) return st;
  double s[kLanes] = {}, q[kLanes] = {};
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = xb + n * d.C * d.S;
    for (int64_t p = 0; p < d.S; ++p)
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) s[j] += static_cast<double>(v[p * kLanes + j]);
  }
  for (int64_t j = 0; j < kLanes; ++j) st.mean[j] = s[j] / static_cast<double>(count);
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = xb + n * d.C * d.S;
    for (int64_t p = 0; p < d.S; ++p)
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) {
        const double t = static_cast<double>(v[p * kLanes + j]) - st.mean[j];
        q[j] += t * t;
      }
  }
  for (int64_t j = 0; j < kLanes; ++j) {
    st.sq_dev[j] = q[j];
    st.var[j] = q[j] / static_cast<double>(count);
  }
  return st;
}

// channel_normalise for the 16 channels of one block (gamma and beta from
// the block's first channel).
[[gnu::noinline]] void block_normalise(const float* xb, float* yb, const BnDims& d,
                                       const double* mean, const double* var, const float* gamma,
                                       const float* beta, double eps) {
  float fmean[kLanes], fscale[kLanes], shift[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) {
    const double scale = gamma[j] / std::sqrt(var[j] + eps);
    fmean[j] = static_cast<float>(mean[j]);
    fscale[j] = static_cast<float>(scale);
    shift[j] = static_cast<float>(beta[j] - (mean[j] - fmean[j]) * scale);
  }
  for (int64_t n = 0; n < d.N; ++n) {
    const float* v = xb + n * d.C * d.S;
    float* w = yb + n * d.C * d.S;
    for (int64_t p = 0; p < d.S; ++p)
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j)
        w[p * kLanes + j] = (v[p * kLanes + j] - fmean[j]) * fscale[j] + shift[j];
  }
}

// ---- the kernels ------------------------------------------------------------------
//
// Each loop takes a group of channels at a time: one channel in plain
// NCHW, a block of 16 in nChw16c (`lanes`); the statistics of a group are
// arrays of `lanes` values.

void batchnorm(const KernelArgs& a) {
  const BnDims d = bn_dims(a.in[0]);
  const bool blocked = a.in[0].layout == Layout::nchw16c;
  const int64_t lanes = blocked ? kLanes : 1;
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
  for (int64_t grp = 0; grp < d.C / lanes; ++grp) {
    const int64_t c0 = grp * lanes;
    const float* xg = x + c0 * d.S;
    BlockStats st;
    if (training) {
      if (blocked) {
        st = block_stats(xg, d);
      } else {
        const ChannelStats cs = batch_stats(xg, d);
        st.mean[0] = cs.mean;
        st.var[0] = cs.var;
        st.sq_dev[0] = cs.sq_dev;
      }
      // The running averages move toward the batch's statistics (those of
      // nothing are 0). The running variance takes the unbiased estimate
      // (PyTorch's rule); one value has none, and the batch variance stands in.
      for (int64_t j = 0; j < lanes; ++j) {
        const double unbiased =
            count > 1 ? st.sq_dev[j] / static_cast<double>(count - 1) : st.var[j];
        rmean[c0 + j] = static_cast<float>((1 - mom) * rmean[c0 + j] + mom * st.mean[j]);
        rvar[c0 + j] = static_cast<float>((1 - mom) * rvar[c0 + j] + mom * unbiased);
      }
    } else {
      for (int64_t j = 0; j < lanes; ++j) {
        st.mean[j] = rmean[c0 + j];
        st.var[j] = rvar[c0 + j];
      }
    }
    for (int64_t j = 0; j < lanes; ++j) {
      mean_out[c0 + j] = static_cast<float>(st.mean[j]);
      var_out[c0 + j] = static_cast<float>(st.var[j]);
    }
    if (blocked)
      block_normalise(xg, y + c0 * d.S, d, st.mean, st.var, gamma + c0, beta + c0, eps);
    else
      channel_normalise(xg, y + c0 * d.S, d, st.mean[0], st.var[0], gamma[c0], beta[c0], eps);
  }
}

// batchnorm's training output again: the same statistics and normalisation
// code, nothing else written (a recompute, docs/OPS.md).
void batchnorm_replay(const KernelArgs& a) {
  const BnDims d = bn_dims(a.in[0]);
  const bool blocked = a.in[0].layout == Layout::nchw16c;
  const int64_t lanes = blocked ? kLanes : 1;
  const float* x = a.in[0].as<float>();
  const float* gamma = a.in[1].as<float>();
  const float* beta = a.in[2].as<float>();
  float* y = a.out[0].as<float>();
  const double eps = a.attrs.get("eps", 1e-5);
#pragma omp parallel for num_threads(threads_of(a)) if (d.N * d.S * d.C > 32768) schedule(static)
  for (int64_t grp = 0; grp < d.C / lanes; ++grp) {
    const int64_t c0 = grp * lanes;
    const float* xg = x + c0 * d.S;
    if (blocked) {
      const BlockStats st = block_stats(xg, d);
      block_normalise(xg, y + c0 * d.S, d, st.mean, st.var, gamma + c0, beta + c0, eps);
    } else {
      const ChannelStats st = batch_stats(xg, d);
      channel_normalise(xg, y + c0 * d.S, d, st.mean, st.var, gamma[c0], beta[c0], eps);
    }
  }
}

// batchnorm_grad's operands.
struct BnGrad {
  BnDims d;
  const float *dy, *x, *gamma, *mean, *var;
  float *dx, *dgamma, *dbeta;
  double eps;
};

BnGrad bn_grad_of(const KernelArgs& a) {
  return {bn_dims(a.in[1]),     a.in[0].as<float>(),     a.in[1].as<float>(),  a.in[2].as<float>(),
          a.in[3].as<float>(),  a.in[4].as<float>(),     a.out[0].as<float>(), a.out[1].as<float>(),
          a.out[2].as<float>(), a.attrs.get("eps", 1e-5)};
}

// batchnorm_grad's formulas, lane by lane.
void batchnorm_grad_blocked(const KernelArgs& a, const BnGrad& op) {
  const BnDims& d = op.d;
  const int64_t count = d.N * d.S;
  const double m = static_cast<double>(count);
#pragma omp parallel for num_threads(threads_of(a)) if (count * d.C > 32768) schedule(static)
  for (int64_t b = 0; b < d.C / kLanes; ++b) {
    const int64_t c0 = b * kLanes;
    double mu[kLanes], rstd[kLanes], sdy[kLanes] = {}, sdyx[kLanes] = {};
    for (int64_t j = 0; j < kLanes; ++j) {
      mu[j] = op.mean[c0 + j];
      rstd[j] = 1.0 / std::sqrt(op.var[c0 + j] + op.eps);
    }
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = op.dy + (n * d.C + c0) * d.S;
      const float* v = op.x + (n * d.C + c0) * d.S;
      for (int64_t p = 0; p < d.S; ++p)
#pragma omp simd
        for (int64_t j = 0; j < kLanes; ++j) {
          const double gj = g[p * kLanes + j];
          sdy[j] += gj;
          sdyx[j] += gj * (static_cast<double>(v[p * kLanes + j]) - mu[j]);
        }
    }
    float k[kLanes], kx[kLanes], k0[kLanes], fmu[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      sdyx[j] *= rstd[j];
      op.dbeta[c0 + j] = static_cast<float>(sdy[j]);
      op.dgamma[c0 + j] = static_cast<float>(sdyx[j]);
      const double gm = op.gamma[c0 + j];
      k[j] = static_cast<float>(gm * rstd[j]);
      kx[j] = count ? static_cast<float>(-gm * rstd[j] * rstd[j] * sdyx[j] / m) : 0.0f;
      k0[j] = count ? static_cast<float>(-gm * rstd[j] * sdy[j] / m) : 0.0f;
      fmu[j] = op.mean[c0 + j];
    }
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = op.dy + (n * d.C + c0) * d.S;
      const float* v = op.x + (n * d.C + c0) * d.S;
      float* w = op.dx + (n * d.C + c0) * d.S;
      for (int64_t p = 0; p < d.S; ++p)
#pragma omp simd
        for (int64_t j = 0; j < kLanes; ++j)
          w[p * kLanes + j] =
              g[p * kLanes + j] * k[j] + (v[p * kLanes + j] - fmu[j]) * kx[j] + k0[j];
    }
  }
}

// dβ = Σ dy, dγ = Σ dy·x̂, dx = γ·rstd·(dy − dβ/m − x̂·dγ/m), x̂ = (x − mean)·rstd.
void batchnorm_grad(const KernelArgs& a) {
  const BnGrad op = bn_grad_of(a);
  if (a.in[1].layout == Layout::nchw16c) return batchnorm_grad_blocked(a, op);
  const BnDims& d = op.d;
  const int64_t count = d.N * d.S;
  const double m = static_cast<double>(count);
#pragma omp parallel for num_threads(threads_of(a)) if (count * d.C > 32768) schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const double mu = op.mean[c];
    const double rstd = 1.0 / std::sqrt(op.var[c] + op.eps);
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = op.dy + (n * d.C + c) * d.S;
      const float* v = op.x + (n * d.C + c) * d.S;
#pragma omp simd reduction(+ : sdy, sdyx)
      for (int64_t p = 0; p < d.S; ++p) {
        sdy += static_cast<double>(g[p]);
        sdyx += static_cast<double>(g[p]) * (static_cast<double>(v[p]) - mu);
      }
    }
    sdyx *= rstd;
    op.dbeta[c] = static_cast<float>(sdy);
    op.dgamma[c] = static_cast<float>(sdyx);
    if (!count) continue;
    // dx = k·dy + kx·(x − mean) + k0: the terms of the formula above grouped
    // by what they multiply.
    const float k = static_cast<float>(op.gamma[c] * rstd);
    const float kx = static_cast<float>(-op.gamma[c] * rstd * rstd * sdyx / m);
    const float k0 = static_cast<float>(-op.gamma[c] * rstd * sdy / m);
    const float fmu = op.mean[c];
    for (int64_t n = 0; n < d.N; ++n) {
      const float* g = op.dy + (n * d.C + c) * d.S;
      const float* v = op.x + (n * d.C + c) * d.S;
      float* w = op.dx + (n * d.C + c) * d.S;
#pragma omp simd
      for (int64_t p = 0; p < d.S; ++p) w[p] = g[p] * k + (v[p] - fmu) * kx + k0;
    }
  }
}

}  // namespace

std::vector<KernelVariant> cpu_batchnorm_kernels() {
  return {
      // x with y, or dy and x with dx: all plain or all nChw16c.
      KernelVariant{"batchnorm", "omp", batchnorm, nullptr, true, f32_operands,
                    in_bit(0) | out_bit(0), true},
      KernelVariant{"batchnorm_replay", "omp", batchnorm_replay, nullptr, true, f32_operands,
                    in_bit(0) | out_bit(0), true},
      KernelVariant{"batchnorm_grad", "omp", batchnorm_grad, nullptr, true, f32_operands,
                    in_bit(0) | in_bit(1) | out_bit(0), true},
  };
}

}  // namespace pooch::kern
