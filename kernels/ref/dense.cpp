// Reference kernels of the dense family (docs/OPS.md, "Dense"). Every sum is
// taken in double in index order, so a result depends on nothing but the
// inputs; the fast kernels are judged against these, and the kernel checker
// runs them in f64 for finite differences, hence the float/double templates.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/permute.h"
#include "../common/philox.h"
#include "../common/supports.h"
#include "ref_kernels.h"

namespace pooch::kern {
namespace {

// Instantiates `Body<T>::run(args)` for the element type of the first float
// operand. Shape inference guarantees that all float operands of one call
// share that type.
template <template <class> class Body>
void dispatch(const KernelArgs& a) {
  const DType dt = a.n_in > 0 ? a.in[0].dtype : a.out[0].dtype;
  if (dt == DType::f64)
    Body<double>::run(a);
  else
    Body<float>::run(a);
}

// Φ and φ of the standard normal, in double whatever T is, so the f32 and f64
// runs differ only in the final rounding.
double norm_cdf(double x) {
  return 0.5 * (1.0 + std::erf(x * 0.70710678118654752440));
}
double norm_pdf(double x) {
  return 0.39894228040143267794 * std::exp(-0.5 * x * x);
}

template <class T>
struct Linear {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    const T* bias = a.n_in > 2 ? a.in[2].as<T>() : nullptr;
    T* y = a.out[0].as<T>();
    // x[..., I]: the leading dimensions are rows.
    const int64_t B = a.in[0].rows(), I = a.in[0].cols(), O = a.in[1].dim(0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t o = 0; o < O; ++o) {
        double s = bias ? static_cast<double>(bias[o]) : 0.0;
        for (int64_t i = 0; i < I; ++i)
          s += static_cast<double>(x[b * I + i]) * static_cast<double>(w[o * I + i]);
        y[b * O + o] = static_cast<T>(s);
      }
  }
};

template <class T>
struct LinearGradInput {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* w = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].dim(1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < I; ++i) {
        double s = 0.0;
        for (int64_t o = 0; o < O; ++o)
          s += static_cast<double>(dy[b * O + o]) * static_cast<double>(w[o * I + i]);
        dx[b * I + i] = static_cast<T>(s);
      }
  }
};

template <class T>
struct LinearGradWeight {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dw = a.out[0].as<T>();
    T* db = a.n_out > 1 ? a.out[1].as<T>() : nullptr;
    const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].cols();
    for (int64_t o = 0; o < O; ++o) {
      for (int64_t i = 0; i < I; ++i) {
        double s = 0.0;
        for (int64_t b = 0; b < B; ++b)
          s += static_cast<double>(dy[b * O + o]) * static_cast<double>(x[b * I + i]);
        dw[o * I + i] = static_cast<T>(s);
      }
      if (db) {
        double s = 0.0;
        for (int64_t b = 0; b < B; ++b) s += static_cast<double>(dy[b * O + o]);
        db[o] = static_cast<T>(s);
      }
    }
  }
};

template <class T>
struct Relu {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    // `x < 0 ? 0 : x` rather than max(x, 0): a NaN input stays NaN, as in
    // PyTorch, instead of silently becoming 0.
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
  }
};

template <class T>
struct ReluGrad {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* y = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
  }
};

// y = s·x, s rounded to T first (as the fast kernels do).
template <class T>
struct Scale {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    const T s = static_cast<T>(a.attrs.get("s", 1.0));
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) y[i] = x[i] * s;
  }
};

template <class T>
struct Gelu {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      y[i] = static_cast<T>(v * norm_cdf(v));
    }
  }
};

template <class T>
struct GeluGrad {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      dx[i] = static_cast<T>(static_cast<double>(dy[i]) * (norm_cdf(v) + v * norm_pdf(v)));
    }
  }
};

// dropout and dropout_grad are the same map: multiply by keep/(1-p), with the
// mask regenerated from (seed, step, key, i) instead of stored.
template <class T>
struct Dropout {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    const int64_t n = a.in[0].numel();
    const double p = a.attrs.get("p", 0.0);
    // Inference (training = 0) passes the input through, as p = 0 does.
    if (p <= 0.0 || (a.ctx && !a.ctx->training)) {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i];
      return;
    }
    const uint32_t key = static_cast<uint32_t>(a.attrs.geti("key", 0));
    const uint64_t seed = a.ctx ? a.ctx->seed : 0, step = a.ctx ? a.ctx->step : 0;
    // Compared in float: philox_uniform yields floats, and the fast kernels
    // must draw exactly the same mask.
    const float pf = static_cast<float>(p);
    const double scale = 1.0 / (1.0 - p);
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(seed, step, key, static_cast<uint64_t>(i)) >= pf;
      y[i] = static_cast<T>(static_cast<double>(x[i]) * (keep ? scale : 0.0));
    }
  }
};

template <class T>
struct LayerNorm {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    const T* gamma = a.in[1].as<T>();
    const T* beta = a.in[2].as<T>();
    T* y = a.out[0].as<T>();
    T* mean_out = a.out[1].as<T>();
    T* rstd_out = a.out[2].as<T>();
    const int64_t B = a.in[0].rows(), D = a.in[0].cols();
    const double eps = a.attrs.get("eps", 1e-5);
    for (int64_t b = 0; b < B; ++b) {
      const T* xr = x + b * D;
      // Two passes (mean, then squared deviations) so a large common offset
      // does not cancel the variance away.
      double mean = 0.0;
      for (int64_t d = 0; d < D; ++d) mean += static_cast<double>(xr[d]);
      mean = D > 0 ? mean / static_cast<double>(D) : 0.0;
      double var = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        const double c = static_cast<double>(xr[d]) - mean;
        var += c * c;
      }
      var = D > 0 ? var / static_cast<double>(D) : 0.0;
      const double rstd = 1.0 / std::sqrt(var + eps);
      for (int64_t d = 0; d < D; ++d)
        y[b * D + d] = static_cast<T>((static_cast<double>(xr[d]) - mean) * rstd *
                                          static_cast<double>(gamma[d]) +
                                      static_cast<double>(beta[d]));
      mean_out[b] = static_cast<T>(mean);
      rstd_out[b] = static_cast<T>(rstd);
    }
  }
};

// With xhat = (x - mean)·rstd and g = dy·γ, differentiating through mean and
// rstd (biased variance, eps included) gives
//   dx = rstd·(g - mean_d(g) - xhat·mean_d(g·xhat)).
template <class T>
struct LayerNormGrad {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    const T* gamma = a.in[2].as<T>();
    const T* mean = a.in[3].as<T>();
    const T* rstd = a.in[4].as<T>();
    T* dx = a.out[0].as<T>();
    T* dgamma = a.out[1].as<T>();
    T* dbeta = a.out[2].as<T>();
    const int64_t B = a.in[0].rows(), D = a.in[0].cols();
    for (int64_t b = 0; b < B; ++b) {
      const double mu = static_cast<double>(mean[b]), rs = static_cast<double>(rstd[b]);
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        const double g = static_cast<double>(dy[b * D + d]) * static_cast<double>(gamma[d]);
        const double xhat = (static_cast<double>(x[b * D + d]) - mu) * rs;
        sum_g += g;
        sum_gx += g * xhat;
      }
      const double mg = D > 0 ? sum_g / static_cast<double>(D) : 0.0;
      const double mgx = D > 0 ? sum_gx / static_cast<double>(D) : 0.0;
      for (int64_t d = 0; d < D; ++d) {
        const double g = static_cast<double>(dy[b * D + d]) * static_cast<double>(gamma[d]);
        const double xhat = (static_cast<double>(x[b * D + d]) - mu) * rs;
        dx[b * D + d] = static_cast<T>(rs * (g - mg - xhat * mgx));
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      double sg = 0.0, sb = 0.0;
      for (int64_t b = 0; b < B; ++b) {
        const double g = static_cast<double>(dy[b * D + d]);
        const double xhat = (static_cast<double>(x[b * D + d]) - static_cast<double>(mean[b])) *
                            static_cast<double>(rstd[b]);
        sg += g * xhat;
        sb += g;
      }
      dgamma[d] = static_cast<T>(sg);
      dbeta[d] = static_cast<T>(sb);
    }
  }
};

template <class T>
struct Add {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    const T* z = a.in[1].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i)
      y[i] = static_cast<T>(static_cast<double>(x[i]) + static_cast<double>(z[i]));
  }
};

// reshape: the same elements in the same order.
void reshape(const KernelArgs& a) {
  const size_t bytes = static_cast<size_t>(a.in[0].numel()) * dtype_size(a.in[0].dtype);
  if (bytes > 0 && a.out[0].data != a.in[0].data) std::memmove(a.out[0].data, a.in[0].data, bytes);
}

// transpose: one element at a time, the source offset from the output index.
template <class E>
void transpose_elems(const KernelArgs& a) {
  const Permutation p = permutation_of(a);
  const E* x = a.in[0].as<const E>();
  E* y = a.out[0].as<E>();
  int64_t o = 0;
  for (int64_t i0 = 0; i0 < p.shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < p.shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < p.shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < p.shape[3]; ++i3)
          y[o++] = x[i0 * p.stride[0] + i1 * p.stride[1] + i2 * p.stride[2] + i3 * p.stride[3]];
}

// Elements are moved as unsigned integers of their size: any dtype.
void transpose(const KernelArgs& a) {
  switch (dtype_size(a.in[0].dtype)) {
    case 1:
      return transpose_elems<uint8_t>(a);
    case 2:
      return transpose_elems<uint16_t>(a);
    case 4:
      return transpose_elems<uint32_t>(a);
    default:
      return transpose_elems<uint64_t>(a);
  }
}

// Every float operand f32, or every one f64.
bool supports_floats(const KernelArgs& a) {
  return ref_float_operands(a);
}

KernelVariant ref(const char* op, KernelFn fn, SupportsFn supports = supports_floats) {
  return KernelVariant{op, "ref", fn, nullptr, true, supports};
}

}  // namespace

std::vector<KernelVariant> ref_dense_kernels() {
  return {
      ref("linear", dispatch<Linear>),
      ref("linear_grad_input", dispatch<LinearGradInput>),
      ref("linear_grad_weight", dispatch<LinearGradWeight>),
      ref("relu", dispatch<Relu>),
      ref("relu_grad", dispatch<ReluGrad>),
      ref("gelu", dispatch<Gelu>),
      ref("gelu_grad", dispatch<GeluGrad>),
      ref("dropout", dispatch<Dropout>),
      ref("dropout_grad", dispatch<Dropout>),
      ref("layernorm", dispatch<LayerNorm>),
      ref("layernorm_grad", dispatch<LayerNormGrad>),
      ref("add", dispatch<Add>),
      ref("scale", dispatch<Scale>),
      // Any dtype: elements are moved, never computed with.
      ref("reshape", reshape, nullptr),
      ref("transpose", transpose, nullptr),
  };
}

}  // namespace pooch::kern
