// Reference kernels of the convolutional family (docs/OPS.md,
// "Convolutional"): direct loops over NCHW images, every sum in double in
// index order. The oneDNN and cuDNN kernels are judged against these, and
// the kernel checker runs them in f64 for finite differences.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../common/conv_geom.h"
#include "../common/supports.h"
#include "ref_kernels.h"

namespace pooch::kern {
namespace {

template <template <class> class Body>
void dispatch(const KernelArgs& a) {
  const DType dt = a.n_in > 0 ? a.in[0].dtype : a.out[0].dtype;
  if (dt == DType::f64)
    Body<double>::run(a);
  else
    Body<float>::run(a);
}

// The sizes of one convolution: x[N,C,H,W], w[O,C/g,KH,KW], y[N,O,OH,OW].
struct ConvDims {
  int64_t N, C, H, W, O, KH, KW, OH, OW, G, Cg, Og;
  Window w;
};

ConvDims conv_dims(const KernelAttrs& at, const TensorView& x, const TensorView& wt,
                   const TensorView& y) {
  ConvDims d;
  d.w = window_of(at);
  d.N = x.shape[0], d.C = x.shape[1], d.H = x.shape[2], d.W = x.shape[3];
  d.O = wt.shape[0], d.KH = wt.shape[2], d.KW = wt.shape[3];
  d.OH = y.shape[2], d.OW = y.shape[3];
  d.G = d.w.groups, d.Cg = d.C / d.G, d.Og = d.O / d.G;
  return d;
}

// Calls f(n, o, oy, ox, c, ky, kx, iy, ix) for every term of the
// convolution sum whose input pixel lies inside the image.
template <class F>
void for_each_term(const ConvDims& d, F&& f) {
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t o = 0; o < d.O; ++o) {
      const int64_t g = o / d.Og;
      for (int64_t oy = 0; oy < d.OH; ++oy)
        for (int64_t ox = 0; ox < d.OW; ++ox)
          for (int64_t cg = 0; cg < d.Cg; ++cg)
            for (int64_t ky = 0; ky < d.KH; ++ky) {
              const int64_t iy = oy * d.w.sh - d.w.ph + ky * d.w.dh;
              if (iy < 0 || iy >= d.H) continue;
              for (int64_t kx = 0; kx < d.KW; ++kx) {
                const int64_t ix = ox * d.w.sw - d.w.pw + kx * d.w.dw;
                if (ix < 0 || ix >= d.W) continue;
                f(n, o, oy, ox, g * d.Cg + cg, cg, ky, kx, iy, ix);
              }
            }
    }
}

template <class T>
struct Conv2d {
  static void run(const KernelArgs& a) {
    const ConvDims d = conv_dims(a.attrs, a.in[0], a.in[1], a.out[0]);
    const T* x = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    const T* b = a.n_in > 2 ? a.in[2].as<T>() : nullptr;
    T* y = a.out[0].as<T>();
    std::vector<double> acc(static_cast<size_t>(a.out[0].numel()), 0.0);
    for_each_term(d, [&](int64_t n, int64_t o, int64_t oy, int64_t ox, int64_t c, int64_t cg,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
      acc[static_cast<size_t>(((n * d.O + o) * d.OH + oy) * d.OW + ox)] +=
          static_cast<double>(x[((n * d.C + c) * d.H + iy) * d.W + ix]) *
          static_cast<double>(w[((o * d.Cg + cg) * d.KH + ky) * d.KW + kx]);
    });
    for (int64_t i = 0; i < a.out[0].numel(); ++i) {
      const int64_t o = i / (d.OH * d.OW) % d.O;
      y[i] = static_cast<T>(acc[static_cast<size_t>(i)] + (b ? static_cast<double>(b[o]) : 0.0));
    }
  }
};

template <class T>
struct Conv2dGradInput {
  static void run(const KernelArgs& a) {
    // dy plays y's part, dx x's.
    const ConvDims d = conv_dims(a.attrs, a.out[0], a.in[1], a.in[0]);
    const T* dy = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    std::vector<double> acc(static_cast<size_t>(a.out[0].numel()), 0.0);
    for_each_term(d, [&](int64_t n, int64_t o, int64_t oy, int64_t ox, int64_t c, int64_t cg,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
      acc[static_cast<size_t>(((n * d.C + c) * d.H + iy) * d.W + ix)] +=
          static_cast<double>(dy[((n * d.O + o) * d.OH + oy) * d.OW + ox]) *
          static_cast<double>(w[((o * d.Cg + cg) * d.KH + ky) * d.KW + kx]);
    });
    for (int64_t i = 0; i < a.out[0].numel(); ++i)
      dx[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
  }
};

template <class T>
struct Conv2dGradWeight {
  static void run(const KernelArgs& a) {
    const ConvDims d = conv_dims(a.attrs, a.in[1], a.out[0], a.in[0]);
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dw = a.out[0].as<T>();
    T* db = a.n_out > 1 ? a.out[1].as<T>() : nullptr;
    std::vector<double> acc(static_cast<size_t>(a.out[0].numel()), 0.0);
    for_each_term(d, [&](int64_t n, int64_t o, int64_t oy, int64_t ox, int64_t c, int64_t cg,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
      acc[static_cast<size_t>(((o * d.Cg + cg) * d.KH + ky) * d.KW + kx)] +=
          static_cast<double>(dy[((n * d.O + o) * d.OH + oy) * d.OW + ox]) *
          static_cast<double>(x[((n * d.C + c) * d.H + iy) * d.W + ix]);
    });
    for (int64_t i = 0; i < a.out[0].numel(); ++i)
      dw[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
    if (!db) return;
    for (int64_t o = 0; o < d.O; ++o) {
      double s = 0;
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t p = 0; p < d.OH * d.OW; ++p)
          s += static_cast<double>(dy[(n * d.O + o) * d.OH * d.OW + p]);
      db[o] = static_cast<T>(s);
    }
  }
};

// x[N,C] or x[N,C,H,W]: N images of C channels of S pixels.
struct BnDims {
  int64_t N, C, S;
};
BnDims bn_dims(const TensorView& x) {
  return {x.shape[0], x.shape[1], x.ndim == 4 ? x.shape[2] * x.shape[3] : 1};
}

// One channel's batch statistics: the mean, the biased variance and Σ (x −
// mean)² (for the running variance's unbiased estimate); all 0 for no values.
struct ChannelStats {
  double mean = 0, var = 0, sq_dev = 0;
};

template <class T>
ChannelStats channel_stats(const T* x, const BnDims& d, int64_t c) {
  const int64_t count = d.N * d.S;
  if (!count) return {};
  double s = 0;
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t p = 0; p < d.S; ++p) s += static_cast<double>(x[(n * d.C + c) * d.S + p]);
  const double mean = s / static_cast<double>(count);
  double q = 0;
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t p = 0; p < d.S; ++p) {
      const double v = static_cast<double>(x[(n * d.C + c) * d.S + p]) - mean;
      q += v * v;
    }
  return {mean, q / static_cast<double>(count), q};
}

// y = (x − mean)/√(var + eps)·γ + β over one channel.
template <class T>
void channel_normalise(const T* x, T* y, const BnDims& d, int64_t c, double mean, double var,
                       double gamma, double beta, double eps) {
  const double rstd = 1.0 / std::sqrt(var + eps);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t p = 0; p < d.S; ++p) {
      const int64_t i = (n * d.C + c) * d.S + p;
      y[i] = static_cast<T>((static_cast<double>(x[i]) - mean) * rstd * gamma + beta);
    }
}

template <class T>
struct BatchNorm {
  static void run(const KernelArgs& a) {
    const BnDims d = bn_dims(a.in[0]);
    const T* x = a.in[0].as<T>();
    const T* gamma = a.in[1].as<T>();
    const T* beta = a.in[2].as<T>();
    T* rmean = a.in[3].as<T>();
    T* rvar = a.in[4].as<T>();
    T* y = a.out[0].as<T>();
    T* mean_out = a.out[1].as<T>();
    T* var_out = a.out[2].as<T>();
    const double eps = a.attrs.get("eps", 1e-5), mom = a.attrs.get("momentum", 0.1);
    const bool training = !a.ctx || a.ctx->training;
    const int64_t count = d.N * d.S;
    for (int64_t c = 0; c < d.C; ++c) {
      double mean, var;
      if (training) {
        const ChannelStats st = channel_stats(x, d, c);
        mean = st.mean;
        var = st.var;
        // The running variance takes the unbiased estimate (PyTorch's rule);
        // one value has none, and the batch variance (0) stands in.
        const double unbiased = count > 1 ? st.sq_dev / static_cast<double>(count - 1) : var;
        rmean[c] = static_cast<T>((1 - mom) * static_cast<double>(rmean[c]) + mom * mean);
        rvar[c] = static_cast<T>((1 - mom) * static_cast<double>(rvar[c]) + mom * unbiased);
      } else {
        mean = static_cast<double>(rmean[c]);
        var = static_cast<double>(rvar[c]);
      }
      mean_out[c] = static_cast<T>(mean);
      var_out[c] = static_cast<T>(var);
      channel_normalise(x, y, d, c, mean, var, static_cast<double>(gamma[c]),
                        static_cast<double>(beta[c]), eps);
    }
  }
};

// batchnorm's training output alone; nothing else written.
template <class T>
struct BatchNormReplay {
  static void run(const KernelArgs& a) {
    const BnDims d = bn_dims(a.in[0]);
    const T* x = a.in[0].as<T>();
    const T* gamma = a.in[1].as<T>();
    const T* beta = a.in[2].as<T>();
    for (int64_t c = 0; c < d.C; ++c) {
      const ChannelStats st = channel_stats(x, d, c);
      channel_normalise(x, a.out[0].as<T>(), d, c, st.mean, st.var, static_cast<double>(gamma[c]),
                        static_cast<double>(beta[c]), a.attrs.get("eps", 1e-5));
    }
  }
};

template <class T>
struct BatchNormGrad {
  static void run(const KernelArgs& a) {
    const auto [N, C, S] = bn_dims(a.in[0]);
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    const T* gamma = a.in[2].as<T>();
    const T* mean = a.in[3].as<T>();
    const T* var = a.in[4].as<T>();
    T* dx = a.out[0].as<T>();
    T* dgamma = a.out[1].as<T>();
    T* dbeta = a.out[2].as<T>();
    const double eps = a.attrs.get("eps", 1e-5);
    const double m = static_cast<double>(N * S);
    for (int64_t c = 0; c < C; ++c) {
      const double mu = static_cast<double>(mean[c]);
      const double rstd = 1.0 / std::sqrt(static_cast<double>(var[c]) + eps);
      double sdy = 0, sdyx = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < S; ++p) {
          const int64_t i = (n * C + c) * S + p;
          sdy += static_cast<double>(dy[i]);
          sdyx += static_cast<double>(dy[i]) * (static_cast<double>(x[i]) - mu) * rstd;
        }
      dbeta[c] = static_cast<T>(sdy);
      dgamma[c] = static_cast<T>(sdyx);
      // dx = γ·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)).
      const double g = static_cast<double>(gamma[c]);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < S; ++p) {
          const int64_t i = (n * C + c) * S + p;
          const double xhat = (static_cast<double>(x[i]) - mu) * rstd;
          dx[i] =
              static_cast<T>(g * rstd * (static_cast<double>(dy[i]) - sdy / m - xhat * sdyx / m));
        }
    }
  }
};

// The pooling sizes: x[N,C,H,W] -> y[N,C,OH,OW] (for a gradient op, dx and dy).
struct PoolDims {
  int64_t NC, H, W, OH, OW;
  Window w;
};
PoolDims pool_dims(const KernelAttrs& at, const TensorView& x, const TensorView& y) {
  return {x.shape[0] * x.shape[1], x.shape[2], x.shape[3], y.shape[2], y.shape[3], window_of(at)};
}

// The first index of the largest value in each window (NaN wins, as in
// PyTorch), or -1 for an empty one.
template <class T>
int64_t argmax_window(const T* img, const PoolDims& d, int64_t oy, int64_t ox) {
  int64_t best = -1;
  T bv = T(0);
  for (int64_t ky = 0; ky < d.w.kh; ++ky) {
    const int64_t iy = oy * d.w.sh - d.w.ph + ky;
    if (iy < 0 || iy >= d.H) continue;
    for (int64_t kx = 0; kx < d.w.kw; ++kx) {
      const int64_t ix = ox * d.w.sw - d.w.pw + kx;
      if (ix < 0 || ix >= d.W) continue;
      const T v = img[iy * d.W + ix];
      if (best < 0 || v > bv || (std::isnan(v) && !std::isnan(bv))) {
        best = iy * d.W + ix;
        bv = v;
      }
    }
  }
  return best;
}

template <class T>
struct MaxPool {
  static void run(const KernelArgs& a) {
    const PoolDims d = pool_dims(a.attrs, a.in[0], a.out[0]);
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0; i < d.NC; ++i)
      for (int64_t oy = 0; oy < d.OH; ++oy)
        for (int64_t ox = 0; ox < d.OW; ++ox) {
          const int64_t k = argmax_window(x + i * d.H * d.W, d, oy, ox);
          y[(i * d.OH + oy) * d.OW + ox] =
              k < 0 ? -std::numeric_limits<T>::infinity() : x[i * d.H * d.W + k];
        }
  }
};

template <class T>
struct MaxPoolGrad {
  static void run(const KernelArgs& a) {
    const PoolDims d = pool_dims(a.attrs, a.in[1], a.in[0]);
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    std::vector<double> acc(static_cast<size_t>(a.out[0].numel()), 0.0);
    for (int64_t i = 0; i < d.NC; ++i)
      for (int64_t oy = 0; oy < d.OH; ++oy)
        for (int64_t ox = 0; ox < d.OW; ++ox) {
          const int64_t k = argmax_window(x + i * d.H * d.W, d, oy, ox);
          if (k >= 0)
            acc[static_cast<size_t>(i * d.H * d.W + k)] +=
                static_cast<double>(dy[(i * d.OH + oy) * d.OW + ox]);
        }
    for (int64_t i = 0; i < a.out[0].numel(); ++i)
      dx[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
  }
};

// The divisor of one average window.
int64_t avg_divisor(const PoolDims& d, int64_t oy, int64_t ox, bool include_pad) {
  const int64_t y0 = oy * d.w.sh - d.w.ph, x0 = ox * d.w.sw - d.w.pw;
  if (include_pad) {
    // The window clipped to the padded image (PyTorch's rule).
    const int64_t y1 = std::min(y0 + d.w.kh, d.H + d.w.ph),
                  x1 = std::min(x0 + d.w.kw, d.W + d.w.pw);
    return (y1 - y0) * (x1 - x0);
  }
  const int64_t y1 = std::min(y0 + d.w.kh, d.H), x1 = std::min(x0 + d.w.kw, d.W);
  return (y1 - std::max<int64_t>(y0, 0)) * (x1 - std::max<int64_t>(x0, 0));
}

template <class T>
struct AvgPool {
  static void run(const KernelArgs& a) {
    const PoolDims d = pool_dims(a.attrs, a.in[0], a.out[0]);
    const bool inc = a.attrs.geti("count_include_pad", 1) != 0;
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0; i < d.NC; ++i)
      for (int64_t oy = 0; oy < d.OH; ++oy)
        for (int64_t ox = 0; ox < d.OW; ++ox) {
          double s = 0;
          for (int64_t ky = 0; ky < d.w.kh; ++ky)
            for (int64_t kx = 0; kx < d.w.kw; ++kx) {
              const int64_t iy = oy * d.w.sh - d.w.ph + ky, ix = ox * d.w.sw - d.w.pw + kx;
              if (iy >= 0 && iy < d.H && ix >= 0 && ix < d.W)
                s += static_cast<double>(x[(i * d.H + iy) * d.W + ix]);
            }
          y[(i * d.OH + oy) * d.OW + ox] =
              static_cast<T>(s / static_cast<double>(avg_divisor(d, oy, ox, inc)));
        }
  }
};

template <class T>
struct AvgPoolGrad {
  static void run(const KernelArgs& a) {
    const PoolDims d = pool_dims(a.attrs, a.out[0], a.in[0]);
    const bool inc = a.attrs.geti("count_include_pad", 1) != 0;
    const T* dy = a.in[0].as<T>();
    T* dx = a.out[0].as<T>();
    std::vector<double> acc(static_cast<size_t>(a.out[0].numel()), 0.0);
    for (int64_t i = 0; i < d.NC; ++i)
      for (int64_t oy = 0; oy < d.OH; ++oy)
        for (int64_t ox = 0; ox < d.OW; ++ox) {
          const double g = static_cast<double>(dy[(i * d.OH + oy) * d.OW + ox]) /
                           static_cast<double>(avg_divisor(d, oy, ox, inc));
          for (int64_t ky = 0; ky < d.w.kh; ++ky)
            for (int64_t kx = 0; kx < d.w.kw; ++kx) {
              const int64_t iy = oy * d.w.sh - d.w.ph + ky, ix = ox * d.w.sw - d.w.pw + kx;
              if (iy >= 0 && iy < d.H && ix >= 0 && ix < d.W)
                acc[static_cast<size_t>((i * d.H + iy) * d.W + ix)] += g;
            }
        }
    for (int64_t i = 0; i < a.out[0].numel(); ++i)
      dx[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
  }
};

template <class T>
struct GlobalAvgPool {
  static void run(const KernelArgs& a) {
    const int64_t NC = a.in[0].shape[0] * a.in[0].shape[1], S = a.in[0].shape[2] * a.in[0].shape[3];
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0; i < NC; ++i) {
      double s = 0;
      for (int64_t p = 0; p < S; ++p) s += static_cast<double>(x[i * S + p]);
      y[i] = static_cast<T>(s / static_cast<double>(S));
    }
  }
};

template <class T>
struct GlobalAvgPoolGrad {
  static void run(const KernelArgs& a) {
    const int64_t NC = a.out[0].shape[0] * a.out[0].shape[1],
                  S = a.out[0].shape[2] * a.out[0].shape[3];
    const T* dy = a.in[0].as<T>();
    T* dx = a.out[0].as<T>();
    for (int64_t i = 0; i < NC; ++i) {
      const T g = static_cast<T>(static_cast<double>(dy[i]) / static_cast<double>(S));
      for (int64_t p = 0; p < S; ++p) dx[i * S + p] = g;
    }
  }
};

KernelVariant ref(const char* op, KernelFn fn) {
  return KernelVariant{op, "ref", fn, nullptr, true, ref_float_operands};
}

}  // namespace

std::vector<KernelVariant> ref_conv_kernels() {
  return {
      ref("conv2d", dispatch<Conv2d>),
      ref("conv2d_grad_input", dispatch<Conv2dGradInput>),
      ref("conv2d_grad_weight", dispatch<Conv2dGradWeight>),
      ref("batchnorm", dispatch<BatchNorm>),
      ref("batchnorm_replay", dispatch<BatchNormReplay>),
      ref("batchnorm_grad", dispatch<BatchNormGrad>),
      ref("maxpool2d", dispatch<MaxPool>),
      ref("maxpool2d_grad", dispatch<MaxPoolGrad>),
      ref("avgpool2d", dispatch<AvgPool>),
      ref("avgpool2d_grad", dispatch<AvgPoolGrad>),
      ref("global_avgpool", dispatch<GlobalAvgPool>),
      ref("global_avgpool_grad", dispatch<GlobalAvgPoolGrad>),
  };
}

}  // namespace pooch::kern
