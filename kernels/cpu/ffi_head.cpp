// Fast f32 kernels of the fused fixed fan-in output layer (ffi_loss,
// ffi_loss_grad, ffi_topk; runtime/core/ops/ffi_head_ops.cpp).
//
// Layout: the input h[B,H] is transposed once into hT[H,Bp] (Bp = B rounded up
// to kLanes, padding rows zero), so label l's logits for the whole batch are
// z[0..Bp) = b[l] + sum_k w[l,k] * hT[index[l,k], :]: K contiguous rows, one
// FMA per lane. The labels are split into contiguous ranges, one per thread;
// each label's logits live only in a Bp-float tile, turned at once into its
// loss terms, its gradient g[0..Bp), db[l] = sum g, dw[l,k] = g . hT[u,:] and
// dhT[u,:] += w[l,k] g (dhT per thread, summed in thread order at the end).
// Nothing here grows with L: the scratch is hT, one dhT per thread, the
// batch's (label, row) target pairs sorted by label, and per-row sums.
//
// Targets: every label is first treated as absent (t = 0) for the whole
// tile, then the few listed (label, row) pairs are corrected, as the unfused
// label-CSR losses do.
//
// Softmax needs each row's log-sum-exp over all labels before any gradient:
// a first pass keeps a running (max, sum of e^(z - max)) per row and thread.
//
// Determinism: the labels are split into kMaxSlots fixed slices (threads take
// whole slices), each slice sums on its own, and the slices' partial results
// are combined in slice order, so the result is bitwise the same for any
// thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../common/supports.h"
#include "cpu_kernels.h"
#include "vec_math.h"

// No clones under a sanitizer: the clones' ifunc resolver runs while the
// program is relocated, before the sanitizer's runtime is up, and an
// instrumented resolver crashes there (seen with ThreadSanitizer).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define POOCH_VEC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define POOCH_VEC_CLONES
#endif

namespace pooch::kern {
namespace {

constexpr int64_t kLanes = 16;
constexpr size_t kAlign = 64;

enum class Loss { bce = 0, hinge = 1, xent = 2 };

int threads_of(const KernelArgs& a) {
  return a.ctx && a.ctx->threads > 1 ? a.ctx->threads : 1;
}

// Per-thread scratch is sized when the plan is made, which knows no thread
// count: for up to kMaxSlots threads, or the process's OpenMP default if
// fewer. A call then uses as many threads as the session asks and the
// workspace it was given holds slots for (a workspace function and its
// kernel agree through slots_for), so it never writes past the workspace.
constexpr int kMaxSlots = 8;
int planned_slots() {
  return kMaxSlots;
}

int64_t padded(int64_t batch) {
  return (batch + kLanes - 1) / kLanes * kLanes;
}

size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Carves the workspace into aligned pieces in call order; without a base it
// only counts the bytes (for the workspace size).
struct Carver {
  char* base;
  size_t used = 0;
  template <class T>
  T* take(int64_t n) {
    T* out = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += round_up(static_cast<size_t>(n) * sizeof(T));
    return out;
  }
};

template <class I>
struct Layer {
  const float* h;
  const I* index;
  const float* w;
  const float* bias;
  int64_t batch, hidden, labels, fan_in, bp;
};

template <class I>
Layer<I> layer_of(const KernelArgs& a) {
  return {a.in[0].as<float>(), a.in[1].as<I>(),  a.in[2].as<float>(),
          a.in[3].as<float>(), a.in[0].shape[0], a.in[0].shape[1],
          a.in[1].shape[0],    a.in[1].shape[1], padded(a.in[0].shape[0])};
}

// hT[H, bp] from h[B, H]; rows past B are zero.
void transpose_in(const float* h, int64_t batch, int64_t hidden, int64_t bp, float* ht, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t u = 0; u < hidden; ++u) {
    float* row = ht + u * bp;
    for (int64_t r = 0; r < batch; ++r) row[r] = h[r * hidden + u];
    for (int64_t r = batch; r < bp; ++r) row[r] = 0.0f;
  }
}

// The batch's targets as (label << 32 | row), sorted: each thread walks the
// pairs of its label range in order. Returns the count.
int64_t sorted_pairs(const int32_t* lptr, const int32_t* lidx, int64_t batch, int64_t* pairs) {
  int64_t n = 0;
  for (int64_t r = 0; r < batch; ++r)
    for (int32_t j = lptr[r]; j < lptr[r + 1]; ++j)
      pairs[n++] = (static_cast<int64_t>(lidx[j]) << 32) | r;
  std::sort(pairs, pairs + n);
  return n;
}

// The first pair whose label is >= l.
int64_t first_pair(const int64_t* pairs, int64_t n, int64_t l) {
  return std::lower_bound(pairs, pairs + n, l << 32) - pairs;
}

// z[0..bp) = bias + sum_k w[l,k] hT[index[l,k], :].
template <class I>
POOCH_VEC_CLONES void logits_tile(const float* ht, int64_t bp, const I* il, const float* wl,
                                  int64_t fan_in, float bias, float* z) {
  for (int64_t r = 0; r < bp; ++r) z[r] = bias;
  for (int64_t k = 0; k < fan_in; ++k) {
    const float* row = ht + int64_t{il[k]} * bp;
    const float wk = wl[k];
#pragma omp simd
    for (int64_t r = 0; r < bp; ++r) z[r] += wk * row[r];
  }
}

// With the tile's gradient g[0..bp) (zero on padding rows): db, dw[l, :] and
// dhT[index[l, k], :] += w[l, k] g.
template <class I>
POOCH_VEC_CLONES void backward_tile(const float* ht, int64_t bp, const I* il, const float* wl,
                                    int64_t fan_in, const float* g, float* dwl, float* dbl,
                                    float* dht) {
  float sb = 0;
#pragma omp simd reduction(+ : sb)
  for (int64_t r = 0; r < bp; ++r) sb += g[r];
  *dbl = sb;
  for (int64_t k = 0; k < fan_in; ++k) {
    const int64_t u = il[k];
    const float* row = ht + u * bp;
    float* drow = dht + u * bp;
    const float wk = wl[k];
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t r = 0; r < bp; ++r) {
      s += g[r] * row[r];
      drow[r] += wk * g[r];
    }
    dwl[k] = s;
  }
}

// Loss terms of a tile with every target 0, rows [0, batch) only.
POOCH_VEC_CLONES double tile_loss_absent(const float* z, int64_t batch, Loss kind) {
  float s = 0;
  if (kind == Loss::bce) {
#pragma omp simd reduction(+ : s)
    for (int64_t r = 0; r < batch; ++r) s += max0(z[r]) + log1p_unit(exp_f(-std::fabs(z[r])));
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t r = 0; r < batch; ++r) {
      const float m = max0(1.0f + z[r]);
      s += m * m;
    }
  }
  return s;
}

// One logit's loss term for target t (bce or squared hinge).
float term(float x, float t, Loss kind) {
  if (kind == Loss::bce) return max0(x) - x * t + log1p_unit(exp_f(-std::fabs(x)));
  const float m = max0(1.0f - (2.0f * t - 1.0f) * x);
  return m * m;
}

// Gradient of a tile with every target 0, times k; zero on padding rows.
POOCH_VEC_CLONES void tile_grad_absent(const float* z, int64_t batch, int64_t bp, Loss kind,
                                       float k, float* g) {
  if (kind == Loss::bce) {
#pragma omp simd
    for (int64_t r = 0; r < batch; ++r) g[r] = k * sigmoid_f(z[r]);
  } else {
#pragma omp simd
    for (int64_t r = 0; r < batch; ++r) g[r] = k * 2.0f * max0(1.0f + z[r]);
  }
  for (int64_t r = batch; r < bp; ++r) g[r] = 0.0f;
}

// One logit's gradient (before the scale) for target t.
float grad_of(float x, float t, Loss kind) {
  if (kind == Loss::bce) return sigmoid_f(x) - t;
  return -2.0f * (2.0f * t - 1.0f) * max0(1.0f - (2.0f * t - 1.0f) * x);
}

// Each thread's contiguous label range [lo, hi).
void label_range(int64_t labels, int nt, int t, int64_t* lo, int64_t* hi) {
  *lo = labels * t / nt;
  *hi = labels * (t + 1) / nt;
}

// Per row: the log-sum-exp of its logits over every label (softmax). Each
// thread keeps a running max and sum over its labels, merged in thread order.
template <class I>
void row_lse(const Layer<I>& y, const float* ht, int nt, int th, float* ztiles, double* m_part,
             double* s_part, double* lse) {
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* z = ztiles + t * y.bp;
    double* m = m_part + t * y.bp;
    double* s = s_part + t * y.bp;
    std::fill(m, m + y.bp, -std::numeric_limits<double>::infinity());
    std::fill(s, s + y.bp, 0.0);
    for (int64_t l = lo; l < hi; ++l) {
      logits_tile(ht, y.bp, y.index + l * y.fan_in, y.w + l * y.fan_in, y.fan_in, y.bias[l], z);
      for (int64_t r = 0; r < y.batch; ++r) {
        const double v = z[r];
        if (v > m[r]) {  // rescale the running sum to the new maximum
          s[r] = s[r] * (std::isfinite(m[r]) ? std::exp(m[r] - v) : 0.0) + 1.0;
          m[r] = v;
        } else {
          s[r] += std::exp(v - m[r]);
        }
      }
    }
  }
  for (int64_t r = 0; r < y.batch; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < nt; ++t) m = std::max(m, m_part[t * y.bp + r]);
    double s = 0;
    for (int t = 0; t < nt; ++t)
      if (std::isfinite(m_part[t * y.bp + r]))
        s += s_part[t * y.bp + r] * std::exp(m_part[t * y.bp + r] - m);
    lse[r] = std::isfinite(m) ? m + std::log(s) : m;
  }
}

// ---- workspace --------------------------------------------------------------

struct Scratch {
  float* ht;       // [H, bp]
  float* dht;      // [nt, H, bp] (grad only)
  float* z;        // [nt, bp] logit tiles
  float* g;        // [nt, bp] gradient tiles
  int64_t* pairs;  // [M]
  double* m_part;  // [nt, bp] softmax running max
  double* s_part;  // [nt, bp] softmax running sum
  double* lse;     // [bp]
  double* part;    // [nt] loss partial sums
};

Scratch carve(const KernelArgs& a, bool grad, int nt, void* base, size_t* bytes = nullptr) {
  const int64_t hidden = a.in[0].shape[1], bp = padded(a.in[0].shape[0]);
  const int64_t m = a.n_in > 5 ? a.in[5].shape[0] : 0;
  Carver c{static_cast<char*>(base)};
  Scratch s{};
  s.ht = c.take<float>(hidden * bp);
  s.dht = grad ? c.take<float>(nt * hidden * bp) : nullptr;
  s.z = c.take<float>(nt * bp);
  s.g = c.take<float>(nt * bp);
  s.pairs = c.take<int64_t>(m);
  s.m_part = c.take<double>(nt * bp);
  s.s_part = c.take<double>(nt * bp);
  s.lse = c.take<double>(bp);
  s.part = c.take<double>(nt);
  if (bytes) *bytes = c.used;
  return s;
}

size_t ws_bytes(const KernelArgs& a, bool grad, int nt) {
  size_t n = 0;
  carve(a, grad, nt, nullptr, &n);
  return n;
}

// The label slices of a call: kMaxSlots, each summed on its own and the
// slices combined in order, so the result does not depend on the thread
// count (fewer only if the workspace holds fewer; it is sized for kMaxSlots).
int slots_for(const KernelArgs& a, bool grad) {
  int nt = kMaxSlots;
  while (nt > 1 && ws_bytes(a, grad, nt) > a.workspace_bytes) --nt;
  return nt;
}
size_t loss_ws(const KernelArgs& a) {
  return ws_bytes(a, false, planned_slots());
}
size_t loss_grad_ws(const KernelArgs& a) {
  return ws_bytes(a, true, planned_slots());
}

// ---- ffi_loss ---------------------------------------------------------------

template <class I>
void loss_fwd(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  const int nt = slots_for(a, false), th = threads_of(a);
  Scratch s = carve(a, false, nt, a.workspace);
  float* out = a.out[0].as<float>();
  if (y.batch == 0) {
    *out = 0.0f;
    return;
  }
  transpose_in(y.h, y.batch, y.hidden, y.bp, s.ht, th);
  const int64_t np = sorted_pairs(lptr, lidx, y.batch, s.pairs);
  double total = 0;
  if (kind == Loss::xent) {
    // sum over rows of |targets| * lse - the targets' logits.
    row_lse(y, s.ht, nt, th, s.z, s.m_part, s.s_part, s.lse);
    for (int64_t r = 0; r < y.batch; ++r)
      if (lptr[r + 1] > lptr[r]) total += static_cast<double>(lptr[r + 1] - lptr[r]) * s.lse[r];
    for (int64_t p = 0; p < np; ++p) {
      const int64_t l = s.pairs[p] >> 32, r = s.pairs[p] & 0xffffffff;
      double acc = 0;
      for (int64_t k = 0; k < y.fan_in; ++k)
        acc += static_cast<double>(y.h[r * y.hidden + int64_t{y.index[l * y.fan_in + k]}]) *
               y.w[l * y.fan_in + k];
      total -= static_cast<float>(acc + y.bias[l]);
    }
  } else {
#pragma omp parallel for num_threads(th) schedule(static, 1)
    for (int t = 0; t < nt; ++t) {
      int64_t lo, hi;
      label_range(y.labels, nt, t, &lo, &hi);
      float* z = s.z + t * y.bp;
      int64_t p = first_pair(s.pairs, np, lo);
      double sum = 0;
      for (int64_t l = lo; l < hi; ++l) {
        logits_tile(s.ht, y.bp, y.index + l * y.fan_in, y.w + l * y.fan_in, y.fan_in, y.bias[l], z);
        sum += tile_loss_absent(z, y.batch, kind);
        for (; p < np && (s.pairs[p] >> 32) == l; ++p) {
          const float x = z[s.pairs[p] & 0xffffffff];
          sum += static_cast<double>(term(x, 1.0f, kind)) - term(x, 0.0f, kind);
        }
      }
      s.part[t] = sum;
    }
    for (int t = 0; t < nt; ++t) total += s.part[t];
  }
  *out = static_cast<float>(total / static_cast<double>(y.batch));
}

// ---- ffi_loss_grad ----------------------------------------------------------

template <class I>
void loss_grad(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  const int nt = slots_for(a, true), th = threads_of(a);
  Scratch s = carve(a, true, nt, a.workspace);
  float* dh = a.out[0].as<float>();
  float* dw = a.out[1].as<float>();
  float* db = a.out[2].as<float>();
  if (y.batch == 0) {
    std::fill(dw, dw + y.labels * y.fan_in, 0.0f);
    std::fill(db, db + y.labels, 0.0f);
    return;
  }
  transpose_in(y.h, y.batch, y.hidden, y.bp, s.ht, th);
  const int64_t np = sorted_pairs(lptr, lidx, y.batch, s.pairs);
  const float k = static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(y.batch));
  if (kind == Loss::xent) row_lse(y, s.ht, nt, th, s.z, s.m_part, s.s_part, s.lse);
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* z = s.z + t * y.bp;
    float* g = s.g + t * y.bp;
    float* dht = s.dht + t * y.hidden * y.bp;
    std::memset(dht, 0, static_cast<size_t>(y.hidden * y.bp) * sizeof(float));
    int64_t p = first_pair(s.pairs, np, lo);
    for (int64_t l = lo; l < hi; ++l) {
      const I* il = y.index + l * y.fan_in;
      const float* wl = y.w + l * y.fan_in;
      logits_tile(s.ht, y.bp, il, wl, y.fan_in, y.bias[l], z);
      if (kind == Loss::xent) {
        for (int64_t r = 0; r < y.batch; ++r)
          g[r] = k * static_cast<float>(std::exp(static_cast<double>(z[r]) - s.lse[r]) *
                                        static_cast<double>(lptr[r + 1] - lptr[r]));
        for (int64_t r = y.batch; r < y.bp; ++r) g[r] = 0.0f;
        for (; p < np && (s.pairs[p] >> 32) == l; ++p) g[s.pairs[p] & 0xffffffff] -= k;
      } else {
        tile_grad_absent(z, y.batch, y.bp, kind, k, g);
        for (; p < np && (s.pairs[p] >> 32) == l; ++p) {
          const int64_t r = s.pairs[p] & 0xffffffff;
          g[r] = k * grad_of(z[r], 1.0f, kind);
        }
      }
      backward_tile(s.ht, y.bp, il, wl, y.fan_in, g, dw + l * y.fan_in, db + l, dht);
    }
  }
  // dh[r, u] = sum over the slices of dhT[u, r], in slice order.
#pragma omp parallel for num_threads(th) schedule(static)
  for (int64_t u = 0; u < y.hidden; ++u)
    for (int64_t r = 0; r < y.batch; ++r) {
      float v = 0;
      for (int t = 0; t < nt; ++t) v += s.dht[(t * y.hidden + u) * y.bp + r];
      dh[r * y.hidden + u] = v;
    }
}

// ---- ffi_topk ---------------------------------------------------------------

// topk's order: larger first, NaN after every number, ties by lower label.
inline bool ranks_above(float u, int64_t iu, float v, int64_t iv) {
  const bool nu = std::isnan(u), nv = std::isnan(v);
  if (nu != nv) return nv;
  if (!nu && u != v) return u > v;
  return iu < iv;
}

// Inserts (v, l) into a rank-ordered list of n <= k entries.
inline void insert(float v, int64_t l, float* bv, int32_t* bi, int64_t& n, int64_t k) {
  if (n == k && !ranks_above(v, l, bv[n - 1], bi[n - 1])) return;
  int64_t p = n < k ? n++ : k - 1;
  while (p > 0 && ranks_above(v, l, bv[p - 1], bi[p - 1])) {
    bv[p] = bv[p - 1];
    bi[p] = bi[p - 1];
    --p;
  }
  bv[p] = v;
  bi[p] = static_cast<int32_t>(l);
}

// hT, one logit tile per thread, and per thread and row a running top k.
size_t topk_bytes(const KernelArgs& a, int nt) {
  const int64_t hidden = a.in[0].shape[1], bp = padded(a.in[0].shape[0]);
  const int64_t k = a.out[0].shape[1];
  Carver c{nullptr};
  c.take<float>(hidden * bp);
  c.take<float>(nt * bp);
  c.take<float>(nt * bp * k);
  c.take<int32_t>(nt * bp * k);
  c.take<int64_t>(nt * bp);
  return c.used;
}
size_t topk_ws(const KernelArgs& a) {
  return topk_bytes(a, planned_slots());
}

template <class I>
void topk(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  int nt = kMaxSlots;
  const int th = threads_of(a);
  while (nt > 1 && topk_bytes(a, nt) > a.workspace_bytes) --nt;
  const int64_t k = a.out[0].shape[1];
  float* values = a.out[0].as<float>();
  int32_t* indices = a.out[1].as<int32_t>();
  if (y.batch == 0) return;
  Carver c{static_cast<char*>(a.workspace)};
  float* ht = c.take<float>(y.hidden * y.bp);
  float* zt = c.take<float>(nt * y.bp);
  float* bv = c.take<float>(nt * y.bp * k);
  auto* bi = c.take<int32_t>(nt * y.bp * k);
  auto* cnt = c.take<int64_t>(nt * y.bp);
  transpose_in(y.h, y.batch, y.hidden, y.bp, ht, th);
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* z = zt + t * y.bp;
    float* v = bv + t * y.bp * k;
    int32_t* ix = bi + t * y.bp * k;
    int64_t* n = cnt + t * y.bp;
    std::fill(n, n + y.bp, 0);
    for (int64_t l = lo; l < hi; ++l) {
      logits_tile(ht, y.bp, y.index + l * y.fan_in, y.w + l * y.fan_in, y.fan_in, y.bias[l], z);
      for (int64_t r = 0; r < y.batch; ++r) {
        // Most labels lose to the row's k-th: one comparison rejects them.
        if (n[r] == k && !ranks_above(z[r], l, v[r * k + k - 1], ix[r * k + k - 1])) continue;
        insert(z[r], l, v + r * k, ix + r * k, n[r], k);
      }
    }
  }
  // Merge the slices' lists per row (slice t's labels all precede t+1's).
#pragma omp parallel for num_threads(th) schedule(static)
  for (int64_t r = 0; r < y.batch; ++r) {
    float* out_v = values + r * k;
    int32_t* out_i = indices + r * k;
    int64_t n = 0;
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < cnt[t * y.bp + r]; ++j)
        insert(bv[(t * y.bp + r) * k + j], bi[(t * y.bp + r) * k + j], out_v, out_i, n, k);
  }
}

template <void (*F16)(const KernelArgs&), void (*F32)(const KernelArgs&)>
void by_index(const KernelArgs& a) {
  if (a.in[1].dtype == DType::u16)
    F16(a);
  else
    F32(a);
}

bool supports(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype) && a.in[0].shape[0] <= kInt32Max;
}

}  // namespace

std::vector<KernelVariant> cpu_ffi_head_kernels() {
  return {
      {"ffi_loss", "tiled", by_index<loss_fwd<uint16_t>, loss_fwd<int32_t>>, loss_ws, true,
       supports},
      {"ffi_loss_grad", "tiled", by_index<loss_grad<uint16_t>, loss_grad<int32_t>>, loss_grad_ws,
       true, supports},
      {"ffi_topk", "tiled", by_index<topk<uint16_t>, topk<int32_t>>, topk_ws, true, supports},
  };
}

}  // namespace pooch::kern
