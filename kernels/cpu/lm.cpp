// Fast f32 kernels of the language-model family (docs/OPS.md, "Language
// models").
//
// As in dense.cpp, OpenBLAS is only called from outside OpenMP regions (it
// runs its own pool). Attention is one head at a time: S = Q·Kᵀ by one GEMM,
// the causal mask and softmax fused in one pass over S's rows, Y = P·V by a
// second GEMM; the T×T scores live in the workspace only for the head being
// computed. The output projection + cross-entropy works on blocks of rows
// and chunks of the vocabulary, so only a [rows block × vocabulary chunk]
// tile of logits ever exists. Scatter-adds (embedding gradients) are split
// over blocks of columns, each walking the positions in order: deterministic
// for any thread count, no atomics.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../common/supports.h"
#include "../common/util.h"
#include "cpu_kernels.h"
#include "vec_math.h"

namespace pooch::kern {
namespace {

constexpr int64_t kGrain = int64_t{1} << 14;
constexpr int64_t kColBlock = 64;
// The lm head's tile: rows per block and vocabulary entries per chunk.
constexpr int64_t kHeadRows = 512;
constexpr int64_t kHeadChunk = 4096;

blasint bi(int64_t v) {
  return static_cast<blasint>(v);
}

bool valid_id(int32_t id, int64_t V) {
  return id >= 0 && id < V;
}

// ---- embeddings ---------------------------------------------------------------

void embedding(const KernelArgs& a) {
  const int32_t* ids = a.in[0].as<int32_t>();
  const float* w = a.in[1].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t N = a.in[0].numel(), V = a.in[1].dim(0), C = a.in[1].dim(1);
#pragma omp parallel for num_threads(threads_of(a)) if (N * C > kGrain) schedule(static)
  for (int64_t p = 0; p < N; ++p) {
    float* out = y + p * C;
    if (!valid_id(ids[p], V)) {
      std::fill(out, out + C, 0.0f);
      continue;
    }
    const float* src = w + ids[p] * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] = src[c];
  }
}

// g[slot(p)] += dy[p] for every position p in order, where slot(p) is the
// row of g that position p's id maps to (-1: skipped); parallel over column
// blocks, so each element is summed by one thread in position order.
template <class Slot>
void scatter_rows(const float* dy, int64_t N, int64_t C, float* g, Slot slot, int threads) {
  const int64_t nblk = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for num_threads(threads) if (N * C > kGrain) schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kColBlock, nc = std::min(kColBlock, C - c0);
    for (int64_t p = 0; p < N; ++p) {
      const int64_t r = slot(p);
      if (r < 0) continue;
      float* dst = g + r * C + c0;
      const float* src = dy + p * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) dst[c] += src[c];
    }
  }
}

// The workspace maps each vocabulary id to its slot in the row-sparse
// gradient (-1: not in the batch).
size_t embedding_grad_rows_ws(const KernelArgs& a) {
  return static_cast<size_t>(a.attrs.geti("vocab", 0)) * sizeof(int32_t);
}

void embedding_grad_rows(const KernelArgs& a) {
  const int32_t* ids = a.in[0].as<int32_t>();
  const float* dy = a.in[1].as<float>();
  int32_t* rows = a.out[0].as<int32_t>();
  float* g = a.out[1].as<float>();
  const int64_t N = a.in[0].numel(), C = a.in[1].cols(), V = a.attrs.geti("vocab", 0);
  const int64_t R = a.out[1].dim(0);
  auto* slot = static_cast<int32_t*>(a.workspace);
  std::fill(slot, slot + V, -1);
  for (int64_t p = 0; p < N; ++p)
    if (valid_id(ids[p], V)) slot[ids[p]] = 0;
  int64_t n = 0;
  for (int64_t v = 0; v < V && n < R; ++v)
    if (slot[v] == 0) {
      slot[v] = static_cast<int32_t>(n);
      rows[1 + n++] = static_cast<int32_t>(v);
    }
  rows[0] = static_cast<int32_t>(n);
  std::fill(g, g + n * C, 0.0f);
  scatter_rows(
      dy, N, C, g, [&](int64_t p) -> int64_t { return valid_id(ids[p], V) ? slot[ids[p]] : -1; },
      threads_of(a));
}

void embedding_grad_dense(const KernelArgs& a) {
  const int32_t* ids = a.in[0].as<int32_t>();
  const float* dy = a.in[1].as<float>();
  float* g = a.out[0].as<float>();
  const int64_t N = a.in[0].numel(), C = a.in[1].cols(), V = a.out[0].dim(0);
  std::fill(g, g + V * C, 0.0f);
  scatter_rows(
      dy, N, C, g, [&](int64_t p) -> int64_t { return valid_id(ids[p], V) ? ids[p] : -1; },
      threads_of(a));
}

// ---- GELU, tanh form ------------------------------------------------------------

constexpr float kGeluK = 0.7978845608f;
constexpr float kGeluA = 0.044715f;

// 0.5·(1 + tanh(u)) is σ(2u): written so, the loop needs no libm call
// (std::tanh is a scalar call that stops the vectoriser: gelu and its
// gradient were 16% of a GPT-2 124M train step) and 1 + tanh(u) never
// cancels for very negative u.
void gelu_tanh(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
#pragma omp parallel for simd num_threads(threads_of(a)) if (n > kGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * sigmoid_f(2.0f * kGeluK * (v + kGeluA * v * v * v));
  }
}

void gelu_tanh_grad(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
#pragma omp parallel for simd num_threads(threads_of(a)) if (n > kGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // With s = σ(2u) = 0.5·(1 + tanh u): 0.5·(1 − tanh² u) = 2·s·(1 − s).
    const float v = x[i];
    const float s = sigmoid_f(2.0f * kGeluK * (v + kGeluA * v * v * v));
    const float d = s + 2.0f * v * s * (1.0f - s) * kGeluK * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * d;
  }
}

// ---- causal attention -------------------------------------------------------------

struct AttnDims {
  int64_t B, T, C, H, D;
  float scale;
};

AttnDims attn_dims(const TensorView& qkv, const KernelAttrs& attrs) {
  AttnDims d{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, attrs.geti("heads", 1), 0, 0};
  d.D = d.C / d.H;
  d.scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  return d;
}

// Blocks the GEMMs cannot express: T×T score buffers must fit blasint.
bool attention_supported(const KernelArgs& a) {
  if (!f32_operands(a)) return false;
  const int qkv = a.n_in == 1 ? 0 : 1;
  const int64_t T = a.in[qkv].dim(1), C3 = a.in[qkv].dim(2);
  return fits_int32(T * T) && fits_int32(C3);
}

size_t attention_ws(const KernelArgs& a) {
  const int qkv = a.n_in == 1 ? 0 : 1;
  const int64_t T = a.in[qkv].dim(1);
  // Forward: S. Backward: S (then P, then dS) and dP.
  return static_cast<size_t>(T * T) * sizeof(float) * (a.n_in == 1 ? 1 : 2);
}

void causal_attention(const KernelArgs& a) {
  const AttnDims d = attn_dims(a.in[0], a.attrs);
  const float* qkv = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  float* lse = a.out[1].as<float>();
  float* S = static_cast<float*>(a.workspace);
  const int64_t T = d.T, ld = 3 * d.C;
  if (T == 0) return;
  const int nt = threads_of(a);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const float* q = qkv + b * T * ld + h * d.D;
      const float* k = q + d.C;
      const float* v = q + 2 * d.C;
      float* l = lse + (b * d.H + h) * T;
      // S = scale·Q·Kᵀ (the upper triangle is computed and ignored).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(T), bi(T), bi(d.D), d.scale, q,
                  bi(ld), k, bi(ld), 0.0f, S, bi(T));
#pragma omp parallel for num_threads(nt) if (T * T > kGrain) schedule(static)
      for (int64_t i = 0; i < T; ++i) {
        float* s = S + i * T;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) m = std::max(m, s[j]);
        float z = 0.0f;
#pragma omp simd reduction(+ : z)
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = std::exp(s[j] - m);
          z += s[j];
        }
        const float inv = 1.0f / z;
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) s[j] *= inv;
        std::fill(s + i + 1, s + T, 0.0f);
        l[i] = m + std::log(z);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(T), bi(d.D), bi(T), 1.0f, S, bi(T),
                  v, bi(ld), 0.0f, y + b * T * d.C + h * d.D, bi(d.C));
    }
}

void causal_attention_grad(const KernelArgs& a) {
  const AttnDims d = attn_dims(a.in[1], a.attrs);
  const float* dy = a.in[0].as<float>();
  const float* qkv = a.in[1].as<float>();
  const float* y = a.in[2].as<float>();
  const float* lse = a.in[3].as<float>();
  float* dqkv = a.out[0].as<float>();
  const int64_t T = d.T, ld = 3 * d.C;
  if (T == 0) return;
  float* P = static_cast<float*>(a.workspace);
  float* dP = P + T * T;
  const int nt = threads_of(a);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t off = b * T * ld + h * d.D;
      const float* q = qkv + off;
      const float* k = q + d.C;
      const float* v = q + 2 * d.C;
      float* dq = dqkv + off;
      float* dk = dq + d.C;
      float* dv = dq + 2 * d.C;
      const float* dyh = dy + b * T * d.C + h * d.D;
      const float* yh = y + b * T * d.C + h * d.D;
      const float* l = lse + (b * d.H + h) * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(T), bi(T), bi(d.D), d.scale, q,
                  bi(ld), k, bi(ld), 0.0f, P, bi(T));
      // dP = dY·Vᵀ.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(T), bi(T), bi(d.D), 1.0f, dyh,
                  bi(d.C), v, bi(ld), 0.0f, dP, bi(T));
      // P from the saved lse, then dS = P·(dP − Δ) into dP, Δ_i = dY_i·Y_i.
#pragma omp parallel for num_threads(nt) if (T * T > kGrain) schedule(static)
      for (int64_t i = 0; i < T; ++i) {
        float* p = P + i * T;
        float* ds = dP + i * T;
        float delta = 0.0f;
        for (int64_t c = 0; c < d.D; ++c) delta += dyh[i * d.C + c] * yh[i * d.C + c];
#pragma omp simd
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - l[i]);
          ds[j] = p[j] * (ds[j] - delta) * d.scale;
        }
        std::fill(p + i + 1, p + T, 0.0f);
        std::fill(ds + i + 1, ds + T, 0.0f);
      }
      // dV = Pᵀ·dY, dQ = dS·K (scale folded into dS), dK = dSᵀ·Q.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(T), bi(d.D), bi(T), 1.0f, P, bi(T),
                  dyh, bi(d.C), 0.0f, dv, bi(ld));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(T), bi(d.D), bi(T), 1.0f, dP, bi(T),
                  k, bi(ld), 0.0f, dq, bi(ld));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(T), bi(d.D), bi(T), 1.0f, dP, bi(T),
                  q, bi(ld), 0.0f, dk, bi(ld));
    }
}

// One decoding step: per sequence, k and v into the cache at its position,
// then per head the scores over the cached positions, their softmax and the
// weighted sum of v. Parallel over (sequence, head); the workspace holds one
// score row per thread.
size_t attention_decode_ws(const KernelArgs& a) {
  return static_cast<size_t>(a.in[1].dim(1)) * sizeof(float) *
         static_cast<size_t>(std::max(1, threads_of(a)));
}

void attention_decode(const KernelArgs& a) {
  const float* qkv = a.in[0].as<float>();
  float* cache = a.in[1].as<float>();
  const int32_t* pos = a.in[2].as<int32_t>();
  float* y = a.out[0].as<float>();
  const int64_t B = a.in[0].dim(0), C = a.in[0].dim(2) / 3, P = a.in[1].dim(1);
  const int64_t H = a.attrs.geti("heads", 1), D = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t p = pos[b];
    if (p >= 0 && p < P)
      std::copy(qkv + b * 3 * C + C, qkv + b * 3 * C + 3 * C, cache + (b * P + p) * 2 * C);
  }
  const int nt = threads_of(a);
#pragma omp parallel for num_threads(nt) if (B * H * P * D > kGrain) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, p = pos[b];
    float* out = y + b * C + h * D;
    if (p < 0 || p >= P) {
      std::fill(out, out + D, 0.0f);
      continue;
    }
#ifdef _OPENMP
    float* s = static_cast<float*>(a.workspace) + static_cast<int64_t>(omp_get_thread_num()) * P;
#else
    float* s = static_cast<float*>(a.workspace);
#endif
    const float* q = qkv + b * 3 * C + h * D;
    const float* rows = cache + b * P * 2 * C;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= p; ++j) {
      const float* k = rows + j * 2 * C + h * D;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
      s[j] = acc * scale;
      m = std::max(m, s[j]);
    }
    float z = 0.0f;
    for (int64_t j = 0; j <= p; ++j) {
      s[j] = std::exp(s[j] - m);
      z += s[j];
    }
    std::fill(out, out + D, 0.0f);
    for (int64_t j = 0; j <= p; ++j) {
      const float w = s[j] / z;
      const float* v = rows + j * 2 * C + C + h * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] += w * v[d];
    }
  }
}

// ---- output projection + softmax cross-entropy ------------------------------------

struct HeadDims {
  int64_t rows, V, C, rb, vc;  // rb rows per block, vc vocabulary entries per chunk
};

HeadDims head_dims(const KernelArgs& a) {
  HeadDims h{a.in[2].numel(), a.in[1].dim(0), a.in[1].dim(1), 0, 0};
  h.rb = std::max<int64_t>(1, std::min(h.rows, kHeadRows));
  h.vc = std::max<int64_t>(1, std::min(h.V, kHeadChunk));
  return h;
}

bool head_supported(const KernelArgs& a) {
  return f32_operands(a) && fits_int32(a.in[2].numel()) && fits_int32(a.in[1].dim(0)) &&
         fits_int32(a.in[1].dim(1));
}

// Per row of a block the running max, sum and target logit (doubles, first,
// so that they are aligned whatever the tile's size; UBSan found them after
// an odd-sized tile), then the logit tile.
size_t head_ws(const KernelArgs& a) {
  const HeadDims h = head_dims(a);
  return static_cast<size_t>(h.rb * h.vc) * sizeof(float) +
         static_cast<size_t>(h.rb) * 3 * sizeof(double);
}

// lse of rows [r0, r0+nr) into lse[], target logits into tgt[] (computed
// chunk by chunk with an online maximum).
void head_lse(const float* x, const float* w, const int32_t* cls, const HeadDims& h, int64_t r0,
              int64_t nr, float* S, double* lse, double* tgt, int nt) {
  std::fill(lse, lse + nr, -std::numeric_limits<double>::infinity());
  double* sum = tgt + nr;  // a third array after tgt
  std::fill(sum, sum + nr, 0.0);
  std::fill(tgt, tgt + nr, 0.0);
  for (int64_t v0 = 0; v0 < h.V; v0 += h.vc) {
    const int64_t nv = std::min(h.vc, h.V - v0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(nr), bi(nv), bi(h.C), 1.0f,
                x + r0 * h.C, bi(h.C), w + v0 * h.C, bi(h.C), 0.0f, S, bi(nv));
#pragma omp parallel for num_threads(nt) if (nr * nv > kGrain) schedule(static)
    for (int64_t r = 0; r < nr; ++r) {
      const float* s = S + r * nv;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nv; ++j) m = std::max(m, s[j]);
      const double mo = lse[r];
      const double mn = std::max(mo, static_cast<double>(m));
      float z = 0.0f;
#pragma omp simd reduction(+ : z)
      for (int64_t j = 0; j < nv; ++j) z += std::exp(s[j] - static_cast<float>(mn));
      sum[r] =
          (mo == -std::numeric_limits<double>::infinity() ? 0.0 : sum[r] * std::exp(mo - mn)) + z;
      lse[r] = mn;  // the running max until the end
      const int32_t c = cls[r0 + r];
      if (c >= v0 && c < v0 + nv) tgt[r] = s[c - v0];
    }
  }
  for (int64_t r = 0; r < nr; ++r) lse[r] += std::log(sum[r]);
}

void linear_xent_index(const KernelArgs& a) {
  const HeadDims h = head_dims(a);
  const float* x = a.in[0].as<float>();
  const float* w = a.in[1].as<float>();
  const int32_t* cls = a.in[2].as<int32_t>();
  float* lse = a.out[1].as<float>();
  auto* stats = static_cast<double*>(a.workspace);  // first: doubles need 8-byte alignment
  float* S = reinterpret_cast<float*>(stats + 3 * h.rb);
  double loss = 0.0;
  int64_t n = 0;
  for (int64_t r0 = 0; r0 < h.rows; r0 += h.rb) {
    const int64_t nr = std::min(h.rb, h.rows - r0);
    head_lse(x, w, cls, h, r0, nr, S, stats, stats + h.rb, threads_of(a));
    for (int64_t r = 0; r < nr; ++r) {
      const bool counted = valid_id(cls[r0 + r], h.V);
      lse[r0 + r] = counted ? static_cast<float>(stats[r]) : 0.0f;
      if (counted) {
        loss += stats[r] - stats[h.rb + r];
        ++n;
      }
    }
  }
  a.out[0].as<float>()[0] = static_cast<float>(n > 0 ? loss / static_cast<double>(n) : 0.0);
}

void linear_xent_index_grad(const KernelArgs& a) {
  const HeadDims h = head_dims(a);
  const float* x = a.in[0].as<float>();
  const float* w = a.in[1].as<float>();
  const int32_t* cls = a.in[2].as<int32_t>();
  const float* lse = a.in[3].as<float>();  // the forward's, per row
  float* dx = a.out[0].as<float>();
  float* dw = a.out[1].as<float>();
  auto* stats = static_cast<double*>(a.workspace);  // first: doubles need 8-byte alignment
  float* S = reinterpret_cast<float*>(stats + 3 * h.rb);
  const int nt = threads_of(a);
  int64_t n = 0;
  for (int64_t r = 0; r < h.rows; ++r) n += valid_id(cls[r], h.V) ? 1 : 0;
  const float scale =
      static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(std::max<int64_t>(n, 1)));
  const bool want_dw = a.out[1].numel() > 0;  // empty: W is frozen
  if (h.rows == 0 || h.C == 0 || h.V == 0) {
    if (want_dw) std::fill(dw, dw + h.V * h.C, 0.0f);
    std::fill(dx, dx + h.rows * h.C, 0.0f);
    return;
  }
  for (int64_t r0 = 0; r0 < h.rows; r0 += h.rb) {
    const int64_t nr = std::min(h.rb, h.rows - r0);
    for (int64_t v0 = 0; v0 < h.V; v0 += h.vc) {
      const int64_t nv = std::min(h.vc, h.V - v0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(nr), bi(nv), bi(h.C), 1.0f,
                  x + r0 * h.C, bi(h.C), w + v0 * h.C, bi(h.C), 0.0f, S, bi(nv));
      // G = scale·(softmax − onehot) on counted rows, 0 on the others.
#pragma omp parallel for num_threads(nt) if (nr * nv > kGrain) schedule(static)
      for (int64_t r = 0; r < nr; ++r) {
        float* s = S + r * nv;
        const int32_t c = cls[r0 + r];
        if (!valid_id(c, h.V)) {
          std::fill(s, s + nv, 0.0f);
          continue;
        }
        const float l = lse[r0 + r];
#pragma omp simd
        for (int64_t j = 0; j < nv; ++j) s[j] = scale * std::exp(s[j] - l);
        if (c >= v0 && c < v0 + nv) s[c - v0] -= scale;
      }
      // dx[block] (+)= G·W[chunk]; dW[chunk] (+)= Gᵀ·x[block].
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(nr), bi(h.C), bi(nv), 1.0f, S,
                  bi(nv), w + v0 * h.C, bi(h.C), v0 == 0 ? 0.0f : 1.0f, dx + r0 * h.C, bi(h.C));
      if (want_dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(nv), bi(h.C), bi(nr), 1.0f, S,
                    bi(nv), x + r0 * h.C, bi(h.C), r0 == 0 ? 0.0f : 1.0f, dw + v0 * h.C, bi(h.C));
    }
  }
}

KernelVariant omp(const char* op, KernelFn fn, WorkspaceFn ws = nullptr,
                  SupportsFn supports = f32_operands) {
  return KernelVariant{op, "omp", fn, ws, true, supports};
}

KernelVariant blas(const char* op, KernelFn fn, WorkspaceFn ws, SupportsFn supports) {
  return KernelVariant{op, "blas", fn, ws, true, supports};
}

}  // namespace

std::vector<KernelVariant> cpu_lm_kernels() {
  return {
      omp("embedding", embedding),
      omp("embedding_grad_rows", embedding_grad_rows, embedding_grad_rows_ws),
      omp("embedding_grad_dense", embedding_grad_dense),
      omp("gelu_tanh", gelu_tanh),
      omp("gelu_tanh_grad", gelu_tanh_grad),
      blas("causal_attention", causal_attention, attention_ws, attention_supported),
      blas("causal_attention_grad", causal_attention_grad, attention_ws, attention_supported),
      omp("attention_decode", attention_decode, attention_decode_ws),
      blas("linear_xent_index", linear_xent_index, head_ws, head_supported),
      blas("linear_xent_index_grad", linear_xent_index_grad, head_ws, head_supported),
  };
}

}  // namespace pooch::kern
