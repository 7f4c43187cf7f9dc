// Fast f32 loss kernels (docs/OPS.md, "Losses").
//
// Speed: the loss and its gradient touch every logit of a label space that
// may be hundreds of thousands wide, so the inner loops are written to
// vectorise: exp and log1p are branch-free polynomials (libm's are scalar
// calls that stop the vectoriser), edge cases are selects, not branches.
//
// Determinism: a loss is reduced in two fixed stages. Each row belongs to one
// thread and is summed in double over kLanes interleaved partial sums that
// are combined in a fixed tree; the row sums go to the workspace and are then
// added in row order. Nothing depends on the thread count, so the result is
// bitwise the same for any.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common/supports.h"
#include "cpu_kernels.h"
#include "vec_math.h"

namespace pooch::kern {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kGrain = 1 << 15;

// x[..., L] as [b, L]: every dimension but the last counts rows (the
// label-CSR losses are rank 2 only; shape inference sees to it). Read into
// plain variables, not a structured binding: clang (the sanitizer build)
// cannot capture a binding in an OpenMP region.
struct Dims {
  int64_t b, l;
};
Dims dims_of(const TensorView& x) {
  if (x.ndim < 2) return {0, 0};
  int64_t b = 1;
  for (int i = 0; i + 1 < x.ndim; ++i) b *= x.shape[i];
  return {b, x.shape[x.ndim - 1]};
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// Sum of term(j) over [0, l) in double. Interleaved lanes let the compiler
// vectorise; the fixed combination order keeps the result reproducible.
constexpr int kLanes = 8;
template <class Term>
double lane_sum(int64_t l, Term term) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= l; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += term(j + k);
  for (int k = 0; j < l; ++j, ++k) acc[k] += term(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The reference's shift rule: by the row maximum when it is finite, else
// none, so inf and NaN come out where the reference has them. A NaN is
// skipped by the maximum but reaches the sum.
inline float row_shift(const float* x, int64_t l) {
  float mx[kLanes];
  for (float& m : mx) m = -kInf;
  int64_t j = 0;
  for (; j + kLanes <= l; j += kLanes)
    for (int k = 0; k < kLanes; ++k) mx[k] = std::max(mx[k], x[j + k]);
  for (int k = 0; j < l; ++j, ++k) mx[k] = std::max(mx[k], x[j]);
  float m = mx[0];
  for (int k = 1; k < kLanes; ++k) m = std::max(m, mx[k]);
  return std::isfinite(m) ? m : 0.0f;
}

inline double row_lse(const float* x, int64_t l) {
  const float shift = row_shift(x, l);
  const double s = lane_sum(l, [&](int64_t j) { return static_cast<double>(exp_f(x[j] - shift)); });
  return static_cast<double>(shift) + std::log(s);
}

// Only e^-|x| <= 1 is formed; max(x,0) - x*t, which grows with |x|, needs no
// exponential.
double bce_row(const float* x, const float* t, int64_t l) {
  return lane_sum(l, [&](int64_t j) {
    const float xj = x[j];
    return static_cast<double>(max0(xj) - xj * t[j] + log1p_unit(exp_f(-std::fabs(xj))));
  });
}

double hinge_row(const float* x, const float* t, int64_t l) {
  return lane_sum(l, [&](int64_t j) {
    const float m = max0(1.0f - (2.0f * t[j] - 1.0f) * x[j]);
    return static_cast<double>(m * m);
  });
}

// sum t*(lse - x): the differences are formed in double, where lse lives, so
// no cancellation in float when both are large.
double xent_row(const float* x, const float* t, int64_t l) {
  if (l == 0) return 0;
  const double lse = row_lse(x, l);
  return lane_sum(l, [&](int64_t j) { return static_cast<double>(t[j]) * (lse - x[j]); });
}

size_t loss_workspace(const KernelArgs& a) {
  return static_cast<size_t>(dims_of(a.in[0]).b) * sizeof(double);
}

template <double (*Row)(const float*, const float*, int64_t)>
void loss_fwd(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  float* out = a.out[0].as<float>();
  if (b == 0) {
    *out = 0.0f;  // the mean over no rows is defined as 0
    return;
  }
  const float* x = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  double* partial = static_cast<double*>(a.workspace);
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) partial[r] = Row(x + r * l, t + r * l, l);
  double total = 0;
  for (int64_t r = 0; r < b; ++r) total += partial[r];
  *out = static_cast<float>(total / static_cast<double>(b));
}

void bce_grad_row(const float* x, const float* t, float* dx, int64_t l, float k) {
  for (int64_t j = 0; j < l; ++j) dx[j] = k * (sigmoid_f(x[j]) - t[j]);
}

void hinge_grad_row(const float* x, const float* t, float* dx, int64_t l, float k) {
  const float k2 = -2.0f * k;
  for (int64_t j = 0; j < l; ++j) {
    const float s = 2.0f * t[j] - 1.0f;
    dx[j] = k2 * s * max0(1.0f - s * x[j]);
  }
}

void xent_grad_row(const float* x, const float* t, float* dx, int64_t l, float k) {
  if (l == 0) return;
  const double lse = row_lse(x, l);
  const float ts = static_cast<float>(lane_sum(l, [&](int64_t j) { return double{t[j]}; }));
  for (int64_t j = 0; j < l; ++j) {
    // x - lse in double keeps p accurate when both are large.
    const float p = exp_f(static_cast<float>(x[j] - lse));
    dx[j] = k * (p * ts - t[j]);
  }
}

template <void (*Row)(const float*, const float*, float*, int64_t, float)>
void loss_grad(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  if (b == 0) return;
  const float* x = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  float* dx = a.out[0].as<float>();
  const float k = static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(b));
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) Row(x + r * l, t + r * l, dx + r * l, l, k);
}

// ---- label-CSR targets ----------------------------------------------------------
//
// t[b,l] = 1 for the labels lidx[lptr[b] .. lptr[b+1]) of row b, else 0. A
// row costs one elementwise pass at t = 0, the dense kernels' inner loop with
// the target a constant, plus O(labels) corrections at the listed positions;
// no [B,L] target array exists. The same float expressions as the dense
// kernels are used, so a gradient is bitwise the dense kernel's and a loss
// differs from it only in the order of the double sums.

// The listed labels of one row.
struct RowLabels {
  const int32_t* id;
  int64_t n;
};
inline RowLabels row_labels(const int32_t* lptr, const int32_t* lidx, int64_t r) {
  return {lidx + lptr[r], static_cast<int64_t>(lptr[r + 1]) - lptr[r]};
}

// A sum of double terms that may be infinite or NaN: what the dense kernels'
// plain double sum of them gives (NaN from a NaN or from +inf meeting -inf).
struct ExactSum {
  double fin = 0;
  bool pinf = false, ninf = false, nan = false;
  void add(double v) {
    if (std::isnan(v))
      nan = true;
    else if (v == std::numeric_limits<double>::infinity())
      pinf = true;
    else if (v == -std::numeric_limits<double>::infinity())
      ninf = true;
    else
      fin += v;
  }
  double value() const {
    if (nan || (pinf && ninf)) return std::numeric_limits<double>::quiet_NaN();
    if (pinf) return std::numeric_limits<double>::infinity();
    if (ninf) return -std::numeric_limits<double>::infinity();
    return fin;
  }
};

inline float bce_term_f(float x, float t) {
  return max0(x) - x * t + log1p_unit(exp_f(-std::fabs(x)));
}

inline float hinge_term_f(float x, float t) {
  const float m = max0(1.0f - (2.0f * t - 1.0f) * x);
  return m * m;
}

// The fast form of a row is (Σ_l term(x_l, 0)) + Σ_listed (term(x,1) − term(x,0)).
// Taking a t = 0 term out again is exact unless it is infinite or NaN, and
// accurate unless it dwarfs what is left (|x| ~ 1e20 on a listed label): its
// rounding error is about 2^-53 of it. Past 2^24 times the row's value
// (an error above ~2^-29 of the result) the row is summed again term by term.
constexpr double kMaxCancel = 16777216.0;

// Σ_l term(x_l, t_l) term by term: the row's labels are sorted into `sorted`
// (the workspace) and merged with the walk over the row.
template <float (*Term)(float, float)>
double csr_row_exact(const float* x, int64_t l, RowLabels lab, int32_t* sorted) {
  std::copy(lab.id, lab.id + lab.n, sorted);
  std::sort(sorted, sorted + lab.n);
  ExactSum s;
  int64_t next = 0;
  for (int64_t j = 0; j < l; ++j) {
    const bool listed = next < lab.n && sorted[next] == j;
    next += listed;
    s.add(Term(x[j], listed ? 1.0f : 0.0f));
  }
  return s.value();
}

// Σ_l term(x_l, t_l): every term at t = 0 (the dense kernels' vectorised
// loop with the target a constant), then the listed labels' corrections.
template <float (*Term)(float, float)>
double csr_row(const float* x, int64_t l, RowLabels lab, int32_t* sorted) {
  const double base = lane_sum(l, [&](int64_t j) { return static_cast<double>(Term(x[j], 0.0f)); });
  double fix = 0, removed = 0;
  for (int64_t i = 0; i < lab.n; ++i) {
    const float xj = x[lab.id[i]];
    const double t0 = Term(xj, 0.0f);
    fix += static_cast<double>(Term(xj, 1.0f)) - t0;
    removed = std::max(removed, t0);
  }
  const double row = base + fix;
  if (std::isfinite(base) && std::isfinite(row) && removed <= kMaxCancel * std::fabs(row))
    return row;
  return csr_row_exact<Term>(x, l, lab, sorted);
}

double bce_csr_row(const float* x, int64_t l, RowLabels lab, int32_t* sorted) {
  return csr_row<bce_term_f>(x, l, lab, sorted);
}

double hinge_csr_row(const float* x, int64_t l, RowLabels lab, int32_t* sorted) {
  return csr_row<hinge_term_f>(x, l, lab, sorted);
}

// Σ_l t_l·(lse − x_l) = Σ_listed (lse − x_l), as the dense kernel has it
// including its non-finite cases: a row whose lse is not finite is NaN there
// (some term is inf − inf or NaN), and an unlisted −inf logit contributes
// 0·inf = NaN while a listed one contributes +inf.
double xent_csr_row(const float* x, int64_t l, RowLabels lab, int32_t*) {
  if (l == 0) return 0;
  float mx[kLanes], mn[kLanes];
  for (int k = 0; k < kLanes; ++k) mx[k] = -kInf, mn[k] = kInf;
  int64_t j = 0;
  for (; j + kLanes <= l; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      mx[k] = std::max(mx[k], x[j + k]);
      mn[k] = std::min(mn[k], x[j + k]);
    }
  for (int k = 0; j < l; ++j, ++k) {
    mx[k] = std::max(mx[k], x[j]);
    mn[k] = std::min(mn[k], x[j]);
  }
  float m = mx[0], lo = mn[0];
  for (int k = 1; k < kLanes; ++k) m = std::max(m, mx[k]), lo = std::min(lo, mn[k]);
  const float shift = std::isfinite(m) ? m : 0.0f;
  const double lse =
      static_cast<double>(shift) +
      std::log(lane_sum(l, [&](int64_t i) { return static_cast<double>(exp_f(x[i] - shift)); }));
  if (!std::isfinite(lse)) return std::numeric_limits<double>::quiet_NaN();
  if (lo == -kInf) {  // rare: is every -inf logit a listed one?
    int64_t all = 0, listed = 0;
    for (int64_t i = 0; i < l; ++i) all += x[i] == -kInf;
    for (int64_t i = 0; i < lab.n; ++i) listed += x[lab.id[i]] == -kInf;
    if (all > listed) return std::numeric_limits<double>::quiet_NaN();
  }
  double row = 0;
  for (int64_t i = 0; i < lab.n; ++i) row += lse - static_cast<double>(x[lab.id[i]]);
  return row;
}

// Per-row partial sums (B doubles), then room for a sorted copy of lidx
// (the rows that are summed term by term sort their labels there).
size_t csr_loss_workspace(const KernelArgs& a) {
  const size_t rows = static_cast<size_t>(dims_of(a.in[0]).b) * sizeof(double);
  const size_t ids = a.in[2].ndim == 1 ? static_cast<size_t>(a.in[2].shape[0]) : 0;
  return rows + ids * sizeof(int32_t);
}

template <double (*Row)(const float*, int64_t, RowLabels, int32_t*)>
void csr_loss_fwd(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  float* out = a.out[0].as<float>();
  if (b == 0) {
    *out = 0.0f;  // the mean over no rows is defined as 0
    return;
  }
  const float* x = a.in[0].as<const float>();
  const int32_t* lptr = a.in[1].as<const int32_t>();
  const int32_t* lidx = a.in[2].as<const int32_t>();
  double* partial = static_cast<double*>(a.workspace);
  // Row r sorts into [lptr[r], lptr[r+1]) of this: the rows' slices are disjoint.
  int32_t* sorted = reinterpret_cast<int32_t*>(partial + b);
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r)
    partial[r] = Row(x + r * l, l, row_labels(lptr, lidx, r), sorted + lptr[r]);
  double total = 0;
  for (int64_t r = 0; r < b; ++r) total += partial[r];
  *out = static_cast<float>(total / static_cast<double>(b));
}

// Gradients: the dense kernel's expression at t = 0 everywhere, then again at
// t = 1 over the listed positions (overwritten, not corrected, so each
// element is bitwise what the dense kernel writes).
void bce_csr_grad_row(const float* x, float* dx, int64_t l, RowLabels lab, float k) {
  for (int64_t j = 0; j < l; ++j) dx[j] = k * (sigmoid_f(x[j]) - 0.0f);
  for (int64_t i = 0; i < lab.n; ++i) {
    const int64_t j = lab.id[i];
    dx[j] = k * (sigmoid_f(x[j]) - 1.0f);
  }
}

void hinge_csr_grad_row(const float* x, float* dx, int64_t l, RowLabels lab, float k) {
  const float k2 = -2.0f * k;
  for (int64_t j = 0; j < l; ++j) {
    const float s = -1.0f;
    dx[j] = k2 * s * max0(1.0f - s * x[j]);
  }
  for (int64_t i = 0; i < lab.n; ++i) {
    const int64_t j = lab.id[i];
    const float s = 1.0f;
    dx[j] = k2 * s * max0(1.0f - s * x[j]);
  }
}

void xent_csr_grad_row(const float* x, float* dx, int64_t l, RowLabels lab, float k) {
  if (l == 0) return;
  const double lse = row_lse(x, l);
  const float ts = static_cast<float>(lab.n);  // Σ_l t_l
  for (int64_t j = 0; j < l; ++j) {
    const float p = exp_f(static_cast<float>(x[j] - lse));
    dx[j] = k * (p * ts - 0.0f);
  }
  for (int64_t i = 0; i < lab.n; ++i) {
    const int64_t j = lab.id[i];
    const float p = exp_f(static_cast<float>(x[j] - lse));
    dx[j] = k * (p * ts - 1.0f);
  }
}

template <void (*Row)(const float*, float*, int64_t, RowLabels, float)>
void csr_loss_grad(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  if (b == 0) return;
  const float* x = a.in[0].as<const float>();
  const int32_t* lptr = a.in[1].as<const int32_t>();
  const int32_t* lidx = a.in[2].as<const int32_t>();
  float* dx = a.out[0].as<float>();
  const float k = static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(b));
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) Row(x + r * l, dx + r * l, l, row_labels(lptr, lidx, r), k);
}

// ---- mean squared error with row weights ------------------------------------------
//
// Σ_r w_r Σ_c (p − t)² / (C · max(Σ_r w_r, 1)); a row of weight 0 is not read
// and gets a zero gradient. Row sums go to the workspace and are added in
// row order, as the other losses do.

size_t rows_workspace(const KernelArgs& a) {
  return static_cast<size_t>(dims_of(a.in[0]).b) * sizeof(double);
}

// Σ_r w_r over the rows of nonzero weight, in row order.
double weight_sum(const float* w, int64_t b) {
  double s = 0;
  for (int64_t r = 0; r < b; ++r)
    if (w[r] != 0.0f) s += static_cast<double>(w[r]);
  return s;
}

void mse_fwd(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, c = d.l;
  float* out = a.out[0].as<float>();
  if (b == 0 || c == 0) {
    *out = 0.0f;  // no rows or no columns: the loss is 0, not 0/0
    return;
  }
  const float* p = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  const float* w = a.in[2].as<const float>();
  double* partial = static_cast<double*>(a.workspace);
#pragma omp parallel for num_threads(threads_of(a)) if (b * c > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) {
    if (w[r] == 0.0f) {
      partial[r] = 0.0;
      continue;
    }
    const float* pr = p + r * c;
    const float* tr = t + r * c;
    // The difference in double is exact, its square nearly so.
    partial[r] = static_cast<double>(w[r]) * lane_sum(c, [&](int64_t j) {
                   const double d = static_cast<double>(pr[j]) - static_cast<double>(tr[j]);
                   return d * d;
                 });
  }
  double total = 0;
  for (int64_t r = 0; r < b; ++r) total += partial[r];
  const double den = static_cast<double>(c) * std::max(weight_sum(w, b), 1.0);
  *out = static_cast<float>(total / den);
}

void mse_grad(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, c = d.l;
  if (b == 0 || c == 0) return;
  const float* p = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  const float* w = a.in[2].as<const float>();
  float* dx = a.out[0].as<float>();
  const double k =
      2.0 * a.attrs.get("scale", 1.0) / (static_cast<double>(c) * std::max(weight_sum(w, b), 1.0));
#pragma omp parallel for num_threads(threads_of(a)) if (b * c > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) {
    float* dr = dx + r * c;
    if (w[r] == 0.0f) {
      std::fill(dr, dr + c, 0.0f);
      continue;
    }
    const float kw = static_cast<float>(k * static_cast<double>(w[r]));
    const float* pr = p + r * c;
    const float* tr = t + r * c;
    for (int64_t j = 0; j < c; ++j) dr[j] = kw * (pr[j] - tr[j]);
  }
}

// ---- softmax cross-entropy with one class id per row ------------------------------
//
// Rows whose id is outside [0, C) (−1: padding) are not read and get a zero
// gradient; the loss is the mean over the others (0 when there are none).
// Each counted row costs one pass for its maximum and one for Σ exp(x − max)
// (row_lse); the gradient adds one pass that writes the softmax.

inline bool counted(int32_t c, int64_t l) {
  return c >= 0 && c < l;
}

void xent_index_fwd(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  float* out = a.out[0].as<float>();
  if (b == 0 || l == 0) {
    *out = 0.0f;
    return;
  }
  const float* x = a.in[0].as<const float>();
  const int32_t* t = a.in[1].as<const int32_t>();
  double* partial = static_cast<double*>(a.workspace);
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) {
    const int32_t c = t[r];
    partial[r] = counted(c, l) ? row_lse(x + r * l, l) - static_cast<double>(x[r * l + c]) : 0.0;
  }
  double total = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r) {
    total += partial[r];
    n += counted(t[r], l) ? 1 : 0;
  }
  *out = static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

void xent_index_grad(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  const int64_t b = d.b, l = d.l;
  if (b == 0 || l == 0) return;
  const float* x = a.in[0].as<const float>();
  const int32_t* t = a.in[1].as<const int32_t>();
  float* dx = a.out[0].as<float>();
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r) n += counted(t[r], l) ? 1 : 0;
  const float k =
      static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(std::max<int64_t>(n, 1)));
#pragma omp parallel for num_threads(threads_of(a)) if (b * l > kGrain) schedule(static)
  for (int64_t r = 0; r < b; ++r) {
    const float* xr = x + r * l;
    float* dr = dx + r * l;
    const int32_t c = t[r];
    if (!counted(c, l)) {
      std::fill(dr, dr + l, 0.0f);
      continue;
    }
    const double lse = row_lse(xr, l);
    // x − lse in double keeps p accurate when both are large.
    for (int64_t j = 0; j < l; ++j) dr[j] = k * exp_f(static_cast<float>(xr[j] - lse));
    dr[c] = k * (exp_f(static_cast<float>(xr[c] - lse)) - 1.0f);
  }
}

}  // namespace

std::vector<KernelVariant> cpu_loss_kernels() {
  return {
      {"bce_logits", "omp", loss_fwd<bce_row>, loss_workspace, true, f32_operands},
      {"bce_logits_grad", "omp", loss_grad<bce_grad_row>, nullptr, true, f32_operands},
      {"squared_hinge", "omp", loss_fwd<hinge_row>, loss_workspace, true, f32_operands},
      {"squared_hinge_grad", "omp", loss_grad<hinge_grad_row>, nullptr, true, f32_operands},
      {"softmax_xent", "omp", loss_fwd<xent_row>, loss_workspace, true, f32_operands},
      {"softmax_xent_grad", "omp", loss_grad<xent_grad_row>, nullptr, true, f32_operands},
      {"bce_logits_csr", "omp", csr_loss_fwd<bce_csr_row>, csr_loss_workspace, true, f32_operands},
      {"bce_logits_csr_grad", "omp", csr_loss_grad<bce_csr_grad_row>, nullptr, true, f32_operands},
      {"squared_hinge_csr", "omp", csr_loss_fwd<hinge_csr_row>, csr_loss_workspace, true,
       f32_operands},
      {"squared_hinge_csr_grad", "omp", csr_loss_grad<hinge_csr_grad_row>, nullptr, true,
       f32_operands},
      {"softmax_xent_csr", "omp", csr_loss_fwd<xent_csr_row>, csr_loss_workspace, true,
       f32_operands},
      {"softmax_xent_csr_grad", "omp", csr_loss_grad<xent_csr_grad_row>, nullptr, true,
       f32_operands},
      {"mse", "omp", mse_fwd, rows_workspace, true, f32_operands},
      {"mse_grad", "omp", mse_grad, nullptr, true, f32_operands},
      {"softmax_xent_index", "omp", xent_index_fwd, rows_workspace, true, f32_operands},
      {"softmax_xent_index_grad", "omp", xent_index_grad, nullptr, true, f32_operands},
  };
}

}  // namespace pooch::kern
