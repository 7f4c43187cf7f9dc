// Reference kernels of the language-model family (docs/OPS.md, "Language
// models"). Every sum is taken in double in index order and nothing is
// allocated, so values are recomputed where a fast kernel would keep them:
// these are slow on purpose (quadratic where the fast kernels are linear)
// and only ever run on the kernel checker's small cases.
#include <cmath>
#include <cstdint>

#include "../common/supports.h"
#include "ref_kernels.h"

namespace pooch::kern {
namespace {

// Instantiates Body<T> for the dtype of the first float input (token and
// class ids are i32; shape inference makes every float operand agree).
template <template <class> class Body>
void dispatch(const KernelArgs& a) {
  for (int i = 0; i < a.n_in; ++i)
    if (dtype_is_float(a.in[i].dtype)) {
      if (a.in[i].dtype == DType::f64) return Body<double>::run(a);
      break;
    }
  Body<float>::run(a);
}

inline bool valid_id(int32_t id, int64_t V) {
  return id >= 0 && id < V;
}

template <class T>
struct Embedding {
  static void run(const KernelArgs& a) {
    const int32_t* ids = a.in[0].as<int32_t>();
    const T* w = a.in[1].as<T>();
    T* y = a.out[0].as<T>();
    const int64_t N = a.in[0].numel(), V = a.in[1].dim(0), C = a.in[1].dim(1);
    for (int64_t p = 0; p < N; ++p)
      for (int64_t c = 0; c < C; ++c) y[p * C + c] = valid_id(ids[p], V) ? w[ids[p] * C + c] : T(0);
  }
};

// Σ over positions holding `id`, of dy's column c, in position order.
template <class T>
double sum_rows(const int32_t* ids, const T* dy, int64_t N, int64_t C, int32_t id, int64_t c) {
  double s = 0.0;
  for (int64_t p = 0; p < N; ++p)
    if (ids[p] == id) s += static_cast<double>(dy[p * C + c]);
  return s;
}

template <class T>
struct EmbeddingGradRows {
  static void run(const KernelArgs& a) {
    const int32_t* ids = a.in[0].as<int32_t>();
    const T* dy = a.in[1].as<T>();
    int32_t* rows = a.out[0].as<int32_t>();
    T* g = a.out[1].as<T>();
    const int64_t N = a.in[0].numel(), C = a.in[1].cols();
    const int64_t V = a.attrs.geti("vocab", 0), R = a.out[1].dim(0);
    // The distinct valid ids in ascending order: each the smallest above the last.
    int64_t n = 0;
    int64_t last = -1;
    while (n < R) {
      int64_t next = V;
      for (int64_t p = 0; p < N; ++p)
        if (valid_id(ids[p], V) && ids[p] > last && ids[p] < next) next = ids[p];
      if (next == V) break;
      rows[1 + n] = static_cast<int32_t>(next);
      for (int64_t c = 0; c < C; ++c)
        g[n * C + c] = static_cast<T>(sum_rows(ids, dy, N, C, static_cast<int32_t>(next), c));
      last = next;
      ++n;
    }
    rows[0] = static_cast<int32_t>(n);
  }
};

template <class T>
struct EmbeddingGradDense {
  static void run(const KernelArgs& a) {
    const int32_t* ids = a.in[0].as<int32_t>();
    const T* dy = a.in[1].as<T>();
    T* g = a.out[0].as<T>();
    const int64_t N = a.in[0].numel(), C = a.in[1].cols(), V = a.out[0].dim(0);
    for (int64_t v = 0; v < V; ++v) {
      bool any = false;
      for (int64_t p = 0; p < N && !any; ++p) any = ids[p] == v;
      for (int64_t c = 0; c < C; ++c)
        g[v * C + c] =
            any ? static_cast<T>(sum_rows(ids, dy, N, C, static_cast<int32_t>(v), c)) : T(0);
    }
  }
};

// GPT-2's GELU: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
constexpr double kGeluK = 0.79788456080286535588;  // √(2/π)
constexpr double kGeluA = 0.044715;

template <class T>
struct GeluTanh {
  static void run(const KernelArgs& a) {
    const T* x = a.in[0].as<T>();
    T* y = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      y[i] = static_cast<T>(0.5 * v * (1.0 + std::tanh(kGeluK * (v + kGeluA * v * v * v))));
    }
  }
};

template <class T>
struct GeluTanhGrad {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* x = a.in[1].as<T>();
    T* dx = a.out[0].as<T>();
    for (int64_t i = 0, n = a.in[0].numel(); i < n; ++i) {
      const double v = static_cast<double>(x[i]);
      const double t = std::tanh(kGeluK * (v + kGeluA * v * v * v));
      const double d =
          0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * kGeluA * v * v);
      dx[i] = static_cast<T>(static_cast<double>(dy[i]) * d);
    }
  }
};

// One head of one sequence inside qkv[B,T,3C]: q, k and v of token t start
// at row t's offsets 0, C and 2C, plus h·D.
template <class T>
struct Head {
  const T* qkv;
  int64_t T_, C, D, b, h;
  const T* q(int64_t t) const { return qkv + (b * T_ + t) * 3 * C + h * D; }
  const T* k(int64_t t) const { return q(t) + C; }
  const T* v(int64_t t) const { return q(t) + 2 * C; }
  double score(int64_t i, int64_t j) const {
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<double>(q(i)[d]) * static_cast<double>(k(j)[d]);
    return s / std::sqrt(static_cast<double>(D));
  }
};

template <class T>
struct CausalAttention {
  static void run(const KernelArgs& a) {
    const int64_t B = a.in[0].dim(0), Tn = a.in[0].dim(1), C = a.in[0].dim(2) / 3;
    const int64_t H = a.attrs.geti("heads", 1), D = C / H;
    T* y = a.out[0].as<T>();
    T* lse = a.out[1].as<T>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const Head<T> hd{a.in[0].as<T>(), Tn, C, D, b, h};
        for (int64_t i = 0; i < Tn; ++i) {
          double m = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) m = std::fmax(m, hd.score(i, j));
          double z = 0.0;
          for (int64_t j = 0; j <= i; ++j) z += std::exp(hd.score(i, j) - m);
          const double l = m + std::log(z);
          lse[(b * H + h) * Tn + i] = static_cast<T>(l);
          for (int64_t d = 0; d < D; ++d) {
            double s = 0.0;
            for (int64_t j = 0; j <= i; ++j)
              s += std::exp(hd.score(i, j) - l) * static_cast<double>(hd.v(j)[d]);
            y[(b * Tn + i) * C + h * D + d] = static_cast<T>(s);
          }
        }
      }
  }
};

// With p = softmax row i, dP = dY·Vᵀ and Δ_i = Σ_d dY[i,d]·Y[i,d] (= Σ_j p_ij dP_ij):
// dS = p·(dP − Δ), dQ = dS·K/√D, dK = dSᵀ·Q/√D, dV = Pᵀ·dY.
template <class T>
struct CausalAttentionGrad {
  static void run(const KernelArgs& a) {
    const T* dy = a.in[0].as<T>();
    const T* y = a.in[2].as<T>();
    const T* lse = a.in[3].as<T>();
    T* dqkv = a.out[0].as<T>();
    const int64_t B = a.in[1].dim(0), Tn = a.in[1].dim(1), C = a.in[1].dim(2) / 3;
    const int64_t H = a.attrs.geti("heads", 1), D = C / H;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const Head<T> hd{a.in[1].as<T>(), Tn, C, D, b, h};
        auto row = [&](const T* base, int64_t t) { return base + (b * Tn + t) * C + h * D; };
        auto p = [&](int64_t i, int64_t j) {
          return std::exp(hd.score(i, j) - static_cast<double>(lse[(b * H + h) * Tn + i]));
        };
        auto ds = [&](int64_t i, int64_t j) {
          double dp = 0.0, delta = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            dp += static_cast<double>(row(dy, i)[d]) * static_cast<double>(hd.v(j)[d]);
            delta += static_cast<double>(row(dy, i)[d]) * static_cast<double>(row(y, i)[d]);
          }
          return p(i, j) * (dp - delta);
        };
        for (int64_t t = 0; t < Tn; ++t) {
          T* dq = dqkv + (b * Tn + t) * 3 * C + h * D;
          T* dk = dq + C;
          T* dv = dq + 2 * C;
          for (int64_t d = 0; d < D; ++d) {
            double sq = 0.0, sk = 0.0, sv = 0.0;
            for (int64_t j = 0; j <= t; ++j) sq += ds(t, j) * static_cast<double>(hd.k(j)[d]);
            for (int64_t i = t; i < Tn; ++i) {
              sk += ds(i, t) * static_cast<double>(hd.q(i)[d]);
              sv += p(i, t) * static_cast<double>(row(dy, i)[d]);
            }
            dq[d] = static_cast<T>(sq * scale);
            dk[d] = static_cast<T>(sk * scale);
            dv[d] = static_cast<T>(sv);
          }
        }
      }
  }
};

// qkv[B,1,3C], cache[B,P,2C] (written), pos i32[B,1] -> y[B,1,C].
template <class T>
struct AttentionDecode {
  static void run(const KernelArgs& a) {
    const T* qkv = a.in[0].as<T>();
    T* cache = a.in[1].as<T>();
    const int32_t* pos = a.in[2].as<int32_t>();
    T* y = a.out[0].as<T>();
    const int64_t B = a.in[0].dim(0), C = a.in[0].dim(2) / 3, P = a.in[1].dim(1);
    const int64_t H = a.attrs.geti("heads", 1), D = C / H;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t p = pos[b];
      const T* q = qkv + b * 3 * C;
      T* rows = cache + b * P * 2 * C;
      if (p < 0 || p >= P) {
        for (int64_t c = 0; c < C; ++c) y[b * C + c] = T(0);
        continue;
      }
      for (int64_t c = 0; c < 2 * C; ++c) rows[p * 2 * C + c] = q[C + c];
      for (int64_t h = 0; h < H; ++h) {
        auto score = [&](int64_t j) {
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d)
            s += static_cast<double>(q[h * D + d]) *
                 static_cast<double>(rows[j * 2 * C + h * D + d]);
          return s * scale;
        };
        double m = -INFINITY;
        for (int64_t j = 0; j <= p; ++j) m = std::fmax(m, score(j));
        double z = 0.0;
        for (int64_t j = 0; j <= p; ++j) z += std::exp(score(j) - m);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j <= p; ++j)
            acc +=
                std::exp(score(j) - m) / z * static_cast<double>(rows[j * 2 * C + C + h * D + d]);
          y[b * C + h * D + d] = static_cast<T>(acc);
        }
      }
    }
  }
};

// The lm head: x[rows, C], W[V, C], class ids c[rows]; a row counts when
// 0 <= c < V.
template <class T>
struct LmHead {
  const T* x;
  const T* w;
  const int32_t* c;
  int64_t rows, V, C;
  explicit LmHead(const KernelArgs& a)
      : x(a.in[0].as<T>()),
        w(a.in[1].as<T>()),
        c(a.in[2].as<int32_t>()),
        rows(a.in[2].numel()),
        V(a.in[1].dim(0)),
        C(a.in[1].dim(1)) {}
  double logit(int64_t r, int64_t v) const {
    double s = 0.0;
    for (int64_t k = 0; k < C; ++k)
      s += static_cast<double>(x[r * C + k]) * static_cast<double>(w[v * C + k]);
    return s;
  }
  double lse(int64_t r) const {
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::fmax(m, logit(r, v));
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(logit(r, v) - m);
    return m + std::log(z);
  }
  bool counted(int64_t r) const { return c[r] >= 0 && c[r] < V; }
  int64_t count() const {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r) n += counted(r) ? 1 : 0;
    return n;
  }
};

template <class T>
struct LinearXentIndex {
  static void run(const KernelArgs& a) {
    const LmHead<T> m(a);
    T* lse_out = a.out[1].as<T>();
    double loss = 0.0;
    for (int64_t r = 0; r < m.rows; ++r) {
      const double l = m.counted(r) ? m.lse(r) : 0.0;
      lse_out[r] = static_cast<T>(l);
      if (m.counted(r)) loss += l - m.logit(r, m.c[r]);
    }
    const int64_t n = m.count();
    a.out[0].as<T>()[0] = static_cast<T>(n > 0 ? loss / static_cast<double>(n) : 0.0);
  }
};

// Row by row, with each row's lse from the forward pass (input 3): its
// softmax row added into dW. dx is summed in double per element; dW
// accumulates over rows in T (exact in the f64 runs that finite differences
// use; the f32 comparison tolerances cover the rest).
template <class T>
struct LinearXentIndexGrad {
  static void run(const KernelArgs& a) {
    const LmHead<T> m(a);
    T* dx = a.out[0].as<T>();
    T* dw = a.out[1].as<T>();
    const int64_t n = m.count();
    const double s = a.attrs.get("scale", 1.0) / static_cast<double>(n > 0 ? n : 1);
    const bool want_dw = a.out[1].numel() > 0;  // empty: W is frozen
    if (want_dw)
      for (int64_t i = 0; i < m.V * m.C; ++i) dw[i] = T(0);
    for (int64_t r = 0; r < m.rows; ++r) {
      T* dxr = dx + r * m.C;
      for (int64_t k = 0; k < m.C; ++k) dxr[k] = T(0);
      if (!m.counted(r)) continue;
      const double l = static_cast<double>(a.in[3].as<T>()[r]);  // the forward's lse
      for (int64_t k = 0; k < m.C; ++k) {
        double acc = 0.0;
        for (int64_t v = 0; v < m.V; ++v)
          acc += s * (std::exp(m.logit(r, v) - l) - (v == m.c[r] ? 1.0 : 0.0)) *
                 static_cast<double>(m.w[v * m.C + k]);
        dxr[k] = static_cast<T>(acc);
      }
      for (int64_t v = 0; want_dw && v < m.V; ++v) {
        const double g = s * (std::exp(m.logit(r, v) - l) - (v == m.c[r] ? 1.0 : 0.0));
        for (int64_t k = 0; k < m.C; ++k)
          dw[v * m.C + k] = static_cast<T>(static_cast<double>(dw[v * m.C + k]) +
                                           g * static_cast<double>(m.x[r * m.C + k]));
      }
    }
  }
};

KernelVariant ref(const char* op, KernelFn fn) {
  return KernelVariant{op, "ref", fn, nullptr, true, ref_float_operands};
}

}  // namespace

std::vector<KernelVariant> ref_lm_kernels() {
  return {
      ref("embedding", dispatch<Embedding>),
      ref("embedding_grad_rows", dispatch<EmbeddingGradRows>),
      ref("embedding_grad_dense", dispatch<EmbeddingGradDense>),
      ref("gelu_tanh", dispatch<GeluTanh>),
      ref("gelu_tanh_grad", dispatch<GeluTanhGrad>),
      ref("causal_attention", dispatch<CausalAttention>),
      ref("causal_attention_grad", dispatch<CausalAttentionGrad>),
      ref("attention_decode", dispatch<AttentionDecode>),
      ref("linear_xent_index", dispatch<LinearXentIndex>),
      ref("linear_xent_index_grad", dispatch<LinearXentIndexGrad>),
  };
}

}  // namespace pooch::kern
