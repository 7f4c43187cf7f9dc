// CUDA loss kernels (docs/OPS.md, "Losses"), f32 data, double accumulation.
//
// Reductions are deterministic: each block writes a partial sum to the
// workspace, then a single block adds the partials in index order. The block
// count depends on the shape alone, so the bits are the same on every run.
//
// bce_logits and squared_hinge sum their elementwise terms over the flat
// [B·L] array. softmax_xent works on chunks of each row in three passes, as
// the reference's formula needs them: the row maximum, then Σ exp(x − shift),
// then Σ t·(lse − x); each pass combines the row's chunk partials in order.
//
// The label-CSR forms (bce_logits_csr, ...) run the elementwise passes over
// row chunks, as softmax does, with the target a constant 0, then one warp per
// row (grid-stride) over that row's listed labels for the corrections; the
// row sums then go through the same ordered final sum.
#include <cmath>

#include "../common/supports.h"
#include "common.cuh"

namespace pooch::kern {
namespace cuda {
namespace {

constexpr int64_t kChunk = 4096;  // elements of one row per block (softmax)

// x[..., L] as [b, L]: every dimension but the last counts rows (the
// label-CSR losses are rank 2 only; shape inference sees to it).
struct Dims {
  int64_t b, l;
};
Dims dims_of(const TensorView& x) {
  if (x.ndim < 2) return {0, 0};
  int64_t b = 1;
  for (int i = 0; i + 1 < x.ndim; ++i) b *= x.shape[i];
  return {b, x.shape[x.ndim - 1]};
}

// ---- elementwise terms (float, as the CPU kernels) ------------------------------

__device__ __forceinline__ float bce_term(float x, float t) {
  return fmaxf(x, 0.0f) - x * t + log1pf(expf(-fabsf(x)));
}

// max(v, 0) that keeps a NaN, as the reference's std::max(v, 0.0) and the CPU
// kernels' max0 do (fmaxf would turn a NaN logit into a zero loss term).
__device__ __forceinline__ float max0(float v) {
  return v < 0.0f ? 0.0f : v;
}

__device__ __forceinline__ float hinge_term(float x, float t) {
  const float m = max0(1.0f - (2.0f * t - 1.0f) * x);
  return m * m;
}

__device__ __forceinline__ float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

enum class Kind { bce, hinge };

template <Kind K>
__global__ void flat_partials_kernel(const float* __restrict__ x, const float* __restrict__ t,
                                     int64_t n, double* __restrict__ partial) {
  __shared__ double scratch[33];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    acc += static_cast<double>(K == Kind::bce ? bce_term(x[i], t[i]) : hinge_term(x[i], t[i]));
  const double s = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out = Σ partial[0..n) / rows; each thread sums a strided slice in order,
// then the block's fixed tree.
__global__ void finish_kernel(const double* __restrict__ partial, int64_t n, int64_t rows,
                              float* __restrict__ out) {
  __shared__ double scratch[33];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  const double s = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = static_cast<float>(s / static_cast<double>(rows));
}

bool write_zero(float* out, cudaStream_t s) {
  return cuda_ok(cudaMemsetAsync(out, 0, sizeof(float), s), "cudaMemsetAsync");
}

size_t flat_ws(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  return static_cast<size_t>(partial_blocks(d.b * d.l)) * sizeof(double);
}

template <Kind K>
void flat_loss(const KernelArgs& a) {
  if (!f32_only(a, K == Kind::bce ? "bce_logits" : "squared_hinge")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  const int64_t n = d.b * d.l;
  if (d.b == 0 || n == 0) {  // the mean over no rows, or of empty rows, is 0
    write_zero(out, s);
    return;
  }
  auto* partial = static_cast<double*>(a.workspace);
  const int64_t blocks = partial_blocks(n);
  flat_partials_kernel<K><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), n, partial);
  if (!launched("flat_partials_kernel")) return;
  finish_kernel<<<1, kThreads, 0, s>>>(partial, blocks, d.b, out);
  launched("finish_kernel");
}

// ---- softmax cross-entropy: row statistics ------------------------------------

struct XentLayout {
  float* pmax;    // [B][chunks]
  double* psum;   // [B][chunks] Σ exp(x − shift)
  double* ptsum;  // [B][chunks] Σ t
  double* prow;   // [B][chunks] Σ t·(lse − x)
  size_t total;
};

XentLayout xent_layout(void* base, int64_t B, int64_t chunks) {
  const auto n = static_cast<size_t>(B * chunks);
  Carve c{static_cast<std::byte*>(base)};
  XentLayout L{};
  L.pmax = c.take<float>(n);
  L.psum = c.take<double>(n);
  L.ptsum = c.take<double>(n);
  L.prow = c.take<double>(n);
  L.total = c.used;
  return L;
}

int64_t chunks_of(int64_t l) {
  return std::max<int64_t>(1, ceil_div(l, kChunk));
}

size_t xent_ws(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  return xent_layout(nullptr, d.b, chunks_of(d.l)).total;
}

// Blocks: x over a row's chunks, y over rows (grid-stride).
dim3 chunk_grid(int64_t B, int64_t chunks) {
  return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(std::min<int64_t>(B, 65535)));
}

// Max of a chunk; fmaxf skips NaN as std::max(m, NaN) does from m = -inf.
__global__ void xent_max_kernel(const float* __restrict__ x, int64_t B, int64_t L,
                                float* __restrict__ pmax) {
  __shared__ float red[kThreads];
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    float m = -INFINITY;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) m = fmaxf(m, x[r * L + j]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) pmax[r * gridDim.x + blockIdx.x] = red[0];
    __syncthreads();
  }
}

// The shift of row r: its maximum when finite, else 0 (as the reference).
__device__ __forceinline__ float row_shift(const float* pmax, int64_t r, int64_t chunks) {
  float m = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, pmax[r * chunks + c]);
  return isfinite(m) ? m : 0.0f;
}

__device__ __forceinline__ double row_lse(const float* pmax, const double* psum, int64_t r,
                                          int64_t chunks) {
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += psum[r * chunks + c];
  return static_cast<double>(row_shift(pmax, r, chunks)) + log(s);
}

// Σ exp(x − shift) and Σ t over the chunk.
__global__ void xent_sum_kernel(const float* __restrict__ x, const float* __restrict__ t, int64_t B,
                                int64_t L, const float* __restrict__ pmax,
                                double* __restrict__ psum, double* __restrict__ ptsum) {
  __shared__ double scratch[33];
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const float shift = row_shift(pmax, r, chunks);
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    double se = 0.0, st = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      se += static_cast<double>(expf(x[r * L + j] - shift));
      st += static_cast<double>(t[r * L + j]);
    }
    se = block_sum(se, scratch);
    st = block_sum(st, scratch);
    if (threadIdx.x == 0) {
      psum[r * chunks + blockIdx.x] = se;
      ptsum[r * chunks + blockIdx.x] = st;
    }
  }
}

// Σ t·(lse − x) over the chunk, the difference formed in double.
__global__ void xent_row_kernel(const float* __restrict__ x, const float* __restrict__ t, int64_t B,
                                int64_t L, const float* __restrict__ pmax,
                                const double* __restrict__ psum, double* __restrict__ prow) {
  __shared__ double scratch[33];
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const double lse = row_lse(pmax, psum, r, chunks);
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    double acc = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x)
      acc += static_cast<double>(t[r * L + j]) * (lse - static_cast<double>(x[r * L + j]));
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) prow[r * chunks + blockIdx.x] = acc;
  }
}

bool xent_stats(const float* x, const float* t, int64_t B, int64_t L, const XentLayout& w,
                cudaStream_t s) {
  const int64_t chunks = chunks_of(L);
  xent_max_kernel<<<chunk_grid(B, chunks), kThreads, 0, s>>>(x, B, L, w.pmax);
  if (!launched("xent_max_kernel")) return false;
  xent_sum_kernel<<<chunk_grid(B, chunks), kThreads, 0, s>>>(x, t, B, L, w.pmax, w.psum, w.ptsum);
  return launched("xent_sum_kernel");
}

void softmax_xent(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  if (d.b == 0 || d.l == 0) {
    write_zero(out, s);
    return;
  }
  const float* x = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  const int64_t chunks = chunks_of(d.l);
  const XentLayout w = xent_layout(a.workspace, d.b, chunks);
  if (!xent_stats(x, t, d.b, d.l, w, s)) return;
  xent_row_kernel<<<chunk_grid(d.b, chunks), kThreads, 0, s>>>(x, t, d.b, d.l, w.pmax, w.psum,
                                                               w.prow);
  if (!launched("xent_row_kernel")) return;
  finish_kernel<<<1, kThreads, 0, s>>>(w.prow, d.b * chunks, d.b, out);
  launched("finish_kernel");
}

// ---- gradients -------------------------------------------------------------------

template <Kind K>
__global__ void flat_grad_kernel(const float* __restrict__ x, const float* __restrict__ t,
                                 float* __restrict__ dx, int64_t n, float k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (K == Kind::bce) {
      dx[i] = k * (sigmoid(x[i]) - t[i]);
    } else {
      const float sg = 2.0f * t[i] - 1.0f;
      dx[i] = -2.0f * k * sg * max0(1.0f - sg * x[i]);
    }
  }
}

float grad_scale(const KernelArgs& a, int64_t b) {
  return static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(b));
}

template <Kind K>
void flat_grad(const KernelArgs& a) {
  if (!f32_only(a, K == Kind::bce ? "bce_logits_grad" : "squared_hinge_grad")) return;
  const Dims d = dims_of(a.in[0]);
  const int64_t n = d.b * d.l;
  if (d.b == 0 || n == 0) return;
  flat_grad_kernel<K><<<grid_for(n, kThreads), kThreads, 0, stream_of(a)>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), a.out[0].as<float>(), n,
      grad_scale(a, d.b));
  launched("flat_grad_kernel");
}

// dx = k·(softmax(x)·Σt − t), p = exp(x − lse) with x − lse formed in double.
__global__ void xent_grad_kernel(const float* __restrict__ x, const float* __restrict__ t,
                                 float* __restrict__ dx, int64_t B, int64_t L,
                                 const float* __restrict__ pmax, const double* __restrict__ psum,
                                 const double* __restrict__ ptsum, float k) {
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const double lse = row_lse(pmax, psum, r, chunks);
    double ts = 0.0;
    for (int64_t c = 0; c < chunks; ++c) ts += ptsum[r * chunks + c];
    const float tsf = static_cast<float>(ts);
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      const float p = expf(static_cast<float>(static_cast<double>(x[r * L + j]) - lse));
      dx[r * L + j] = k * (p * tsf - t[r * L + j]);
    }
  }
}

void softmax_xent_grad(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent_grad")) return;
  const Dims d = dims_of(a.in[0]);
  if (d.b == 0 || d.l == 0) return;
  const float* x = a.in[0].as<const float>();
  const float* t = a.in[1].as<const float>();
  const cudaStream_t s = stream_of(a);
  const int64_t chunks = chunks_of(d.l);
  const XentLayout w = xent_layout(a.workspace, d.b, chunks);
  if (!xent_stats(x, t, d.b, d.l, w, s)) return;
  xent_grad_kernel<<<chunk_grid(d.b, chunks), kThreads, 0, s>>>(
      x, t, a.out[0].as<float>(), d.b, d.l, w.pmax, w.psum, w.ptsum, grad_scale(a, d.b));
  launched("xent_grad_kernel");
}

// ---- label-CSR targets --------------------------------------------------------
//
// t[b,l] = 1 for the labels lidx[lptr[b] .. lptr[b+1]) of row b, else 0. The
// host never reads lptr (a device array), so the correction kernels run one
// block per row (grid-stride) over the row's own labels. Expressions are the
// dense kernels' with t a constant, so a gradient element is bitwise the
// dense kernel's and a loss differs only in the order of its double sums.

constexpr int kRowThreads = 32;  // rows hold a handful of labels

// Blocks for the per-row correction kernels: a function of B alone.
unsigned rows_grid(int64_t B) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(B, int64_t{sm_count()} * 32)));
}

// A sum of terms that may be infinite or NaN, as flags (0/1 as doubles, so
// block_sum combines them) beside the finite part: its value is what the
// dense kernels' plain sum of the same terms gives.
struct Tally {
  double fin, pinf, ninf, nan;
};

__device__ __forceinline__ void tally_add(Tally& t, float v) {
  if (isfinite(v))
    t.fin += static_cast<double>(v);
  else if (isnan(v))
    t.nan = 1.0;
  else if (v > 0.0f)
    t.pinf = 1.0;
  else
    t.ninf = 1.0;
}

__device__ __forceinline__ double tally_value(Tally t, double* scratch) {
  t.fin = block_sum(t.fin, scratch);
  t.pinf = block_sum(t.pinf, scratch);
  t.ninf = block_sum(t.ninf, scratch);
  t.nan = block_sum(t.nan, scratch);
  if (t.nan > 0.0 || (t.pinf > 0.0 && t.ninf > 0.0)) return nan("");
  if (t.pinf > 0.0) return HUGE_VAL;
  if (t.ninf > 0.0) return -HUGE_VAL;
  return t.fin;
}

// The maximum over one warp, in every lane (NaN skipped, as fmax does).
__device__ __forceinline__ double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

template <Kind K>
__device__ __forceinline__ float csr_term(float x, float t) {
  return K == Kind::bce ? bce_term(x, t) : hinge_term(x, t);
}

// The fast form of a row, (Σ_l term(x_l, 0)) + Σ_listed (term(x,1) − term(x,0)),
// is used unless a term it takes out again is not finite, or dwarfs the row's
// value (its rounding error is about 2^-53 of it): past 2^24 times the value
// the row is summed term by term instead.
constexpr double kMaxCancel = 16777216.0;

// Σ term(x, 0) over each chunk of each row (grid as the softmax's).
template <Kind K>
__global__ void csr_chunk_kernel(const float* __restrict__ x, int64_t B, int64_t L,
                                 double* __restrict__ psum) {
  __shared__ double scratch[33];
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    double acc = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x)
      acc += static_cast<double>(csr_term<K>(x[r * L + j], 0.0f));
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) psum[r * chunks + blockIdx.x] = acc;
  }
}

// Row r's loss from its chunk sums and its labels' corrections, one warp per
// row (kRowThreads = 32); the rare rows that need it are summed term by term,
// each element's target found by scanning the row's labels.
template <Kind K>
__global__ void csr_row_kernel(const float* __restrict__ x, const int32_t* __restrict__ lptr,
                               const int32_t* __restrict__ lidx, int64_t B, int64_t L,
                               int64_t chunks, const double* __restrict__ psum,
                               double* __restrict__ prow) {
  __shared__ double scratch[33];
  for (int64_t r = blockIdx.x; r < B; r += gridDim.x) {
    const float* xr = x + r * L;
    const int64_t j0 = lptr[r], j1 = lptr[r + 1];
    double base = 0.0, fix = 0.0, removed = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) base += psum[r * chunks + c];
    for (int64_t j = j0 + int64_t{threadIdx.x}; j < j1; j += blockDim.x) {
      const float xj = xr[lidx[j]];
      const double t0 = csr_term<K>(xj, 0.0f);
      fix += static_cast<double>(csr_term<K>(xj, 1.0f)) - t0;
      removed = fmax(removed, t0);
    }
    base = block_sum(base, scratch);
    fix = block_sum(fix, scratch);
    removed = warp_max(removed);
    const double row = base + fix;
    // The same in every thread, so the whole block takes the same branch.
    if (isfinite(base) && isfinite(row) && removed <= kMaxCancel * fabs(row)) {
      if (threadIdx.x == 0) prow[r] = row;
      continue;
    }
    Tally t{0.0, 0.0, 0.0, 0.0};
    for (int64_t l = threadIdx.x; l < L; l += blockDim.x) {
      bool listed = false;
      for (int64_t j = j0; j < j1 && !listed; ++j) listed = lidx[j] == l;
      tally_add(t, csr_term<K>(xr[l], listed ? 1.0f : 0.0f));
    }
    const double exact = tally_value(t, scratch);
    if (threadIdx.x == 0) prow[r] = exact;
  }
}

struct CsrLayout {
  double* psum;  // [B][chunks]
  double* prow;  // [B]
  size_t total;
};

CsrLayout csr_layout(void* base, int64_t B, int64_t chunks) {
  auto* p = static_cast<std::byte*>(base);
  const size_t sums = align_up(static_cast<size_t>(B * chunks) * sizeof(double));
  CsrLayout w{};
  w.psum = p ? reinterpret_cast<double*>(p) : nullptr;
  w.prow = p ? reinterpret_cast<double*>(p + sums) : nullptr;
  w.total = sums + align_up(static_cast<size_t>(B) * sizeof(double));
  return w;
}

size_t csr_ws(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  return csr_layout(nullptr, d.b, chunks_of(d.l)).total;
}

template <Kind K>
void csr_loss(const KernelArgs& a) {
  if (!f32_only(a, K == Kind::bce ? "bce_logits_csr" : "squared_hinge_csr")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  if (d.b == 0 || d.l == 0) {  // the mean over no rows, or of empty rows, is 0
    write_zero(out, s);
    return;
  }
  const float* x = a.in[0].as<const float>();
  const int64_t chunks = chunks_of(d.l);
  const CsrLayout w = csr_layout(a.workspace, d.b, chunks);
  csr_chunk_kernel<K><<<chunk_grid(d.b, chunks), kThreads, 0, s>>>(x, d.b, d.l, w.psum);
  if (!launched("csr_chunk_kernel")) return;
  csr_row_kernel<K><<<rows_grid(d.b), kRowThreads, 0, s>>>(x, a.in[1].as<const int32_t>(),
                                                           a.in[2].as<const int32_t>(), d.b, d.l,
                                                           chunks, w.psum, w.prow);
  if (!launched("csr_row_kernel")) return;
  finish_kernel<<<1, kThreads, 0, s>>>(w.prow, d.b, d.b, out);
  launched("finish_kernel");
}

// dx at t = 0 everywhere (the dense expressions with t a constant) ...
template <Kind K>
__global__ void csr_flat_grad_kernel(const float* __restrict__ x, float* __restrict__ dx, int64_t n,
                                     float k) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (K == Kind::bce) {
      dx[i] = k * (sigmoid(x[i]) - 0.0f);
    } else {
      const float sg = -1.0f;
      dx[i] = -2.0f * k * sg * max0(1.0f - sg * x[i]);
    }
  }
}

// ... then at t = 1 over the listed labels (queued after it on the stream).
template <Kind K>
__global__ void csr_grad_fix_kernel(const float* __restrict__ x, const int32_t* __restrict__ lptr,
                                    const int32_t* __restrict__ lidx, float* __restrict__ dx,
                                    int64_t B, int64_t L, float k) {
  for (int64_t r = blockIdx.x; r < B; r += gridDim.x)
    for (int64_t j = lptr[r] + int64_t{threadIdx.x}; j < lptr[r + 1]; j += blockDim.x) {
      const int64_t i = r * L + lidx[j];
      if (K == Kind::bce) {
        dx[i] = k * (sigmoid(x[i]) - 1.0f);
      } else {
        const float sg = 1.0f;
        dx[i] = -2.0f * k * sg * max0(1.0f - sg * x[i]);
      }
    }
}

template <Kind K>
void csr_flat_grad(const KernelArgs& a) {
  if (!f32_only(a, K == Kind::bce ? "bce_logits_csr_grad" : "squared_hinge_csr_grad")) return;
  const Dims d = dims_of(a.in[0]);
  const int64_t n = d.b * d.l;
  if (d.b == 0 || n == 0) return;
  const float* x = a.in[0].as<const float>();
  float* dx = a.out[0].as<float>();
  const float k = grad_scale(a, d.b);
  const cudaStream_t s = stream_of(a);
  csr_flat_grad_kernel<K><<<grid_for(n, kThreads), kThreads, 0, s>>>(x, dx, n, k);
  if (!launched("csr_flat_grad_kernel")) return;
  csr_grad_fix_kernel<K><<<rows_grid(d.b), kRowThreads, 0, s>>>(
      x, a.in[1].as<const int32_t>(), a.in[2].as<const int32_t>(), dx, d.b, d.l, k);
  launched("csr_grad_fix_kernel");
}

// ---- softmax cross-entropy with label-CSR targets -----------------------------

struct XentCsrLayout {
  float* pmax;   // [B][chunks]
  float* pninf;  // [B][chunks] logits equal to -inf
  double* psum;  // [B][chunks] Σ exp(x − shift)
  double* prow;  // [B] the row's loss
  size_t total;
};

XentCsrLayout xent_csr_layout(void* base, int64_t B, int64_t chunks) {
  const auto n = static_cast<size_t>(B * chunks);
  Carve c{static_cast<std::byte*>(base)};
  XentCsrLayout w{};
  w.pmax = c.take<float>(n);
  w.pninf = c.take<float>(n);
  w.psum = c.take<double>(n);
  w.prow = c.take<double>(static_cast<size_t>(B));
  w.total = c.used;
  return w;
}

size_t xent_csr_ws(const KernelArgs& a) {
  const Dims d = dims_of(a.in[0]);
  return xent_csr_layout(nullptr, d.b, chunks_of(d.l)).total;
}

// Max of a chunk (NaN skipped, as in xent_max_kernel) and its count of -inf
// logits (a chunk holds at most kChunk, exact in float).
__global__ void xent_csr_max_kernel(const float* __restrict__ x, int64_t B, int64_t L,
                                    float* __restrict__ pmax, float* __restrict__ pninf) {
  __shared__ float red[kThreads];
  __shared__ float cnt[kThreads];
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    float m = -INFINITY, c = 0.0f;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      const float v = x[r * L + j];
      m = fmaxf(m, v);
      c += v == -INFINITY ? 1.0f : 0.0f;
    }
    red[threadIdx.x] = m;
    cnt[threadIdx.x] = c;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        cnt[threadIdx.x] += cnt[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      pmax[r * gridDim.x + blockIdx.x] = red[0];
      pninf[r * gridDim.x + blockIdx.x] = cnt[0];
    }
    __syncthreads();
  }
}

// Σ exp(x − shift) over the chunk.
__global__ void xent_csr_sum_kernel(const float* __restrict__ x, int64_t B, int64_t L,
                                    const float* __restrict__ pmax, double* __restrict__ psum) {
  __shared__ double scratch[33];
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const float shift = row_shift(pmax, r, chunks);
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    double se = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x)
      se += static_cast<double>(expf(x[r * L + j] - shift));
    se = block_sum(se, scratch);
    if (threadIdx.x == 0) psum[r * chunks + blockIdx.x] = se;
  }
}

bool xent_csr_stats(const float* x, int64_t B, int64_t L, const XentCsrLayout& w, cudaStream_t s) {
  const int64_t chunks = chunks_of(L);
  xent_csr_max_kernel<<<chunk_grid(B, chunks), kThreads, 0, s>>>(x, B, L, w.pmax, w.pninf);
  if (!launched("xent_csr_max_kernel")) return false;
  xent_csr_sum_kernel<<<chunk_grid(B, chunks), kThreads, 0, s>>>(x, B, L, w.pmax, w.psum);
  return launched("xent_csr_sum_kernel");
}

// Row r's loss Σ_listed (lse − x), with the dense form's non-finite cases: a
// non-finite lse gives NaN (some term is inf − inf or NaN there), and so does
// an unlisted -inf logit (0·inf); a listed one gives +inf.
__global__ void xent_csr_row_kernel(const float* __restrict__ x, const int32_t* __restrict__ lptr,
                                    const int32_t* __restrict__ lidx, int64_t B, int64_t L,
                                    int64_t chunks, const float* __restrict__ pmax,
                                    const float* __restrict__ pninf,
                                    const double* __restrict__ psum, double* __restrict__ prow) {
  __shared__ double scratch[33];
  for (int64_t r = blockIdx.x; r < B; r += gridDim.x) {
    const double lse = row_lse(pmax, psum, r, chunks);
    double acc = 0.0, listed_ninf = 0.0;
    for (int64_t j = lptr[r] + int64_t{threadIdx.x}; j < lptr[r + 1]; j += blockDim.x) {
      const float xj = x[r * L + lidx[j]];
      acc += lse - static_cast<double>(xj);
      listed_ninf += xj == -INFINITY ? 1.0 : 0.0;
    }
    acc = block_sum(acc, scratch);
    listed_ninf = block_sum(listed_ninf, scratch);
    if (threadIdx.x == 0) {
      double ninf = 0.0;
      for (int64_t c = 0; c < chunks; ++c) ninf += pninf[r * chunks + c];
      prow[r] = !isfinite(lse) || ninf > listed_ninf ? nan("") : acc;
    }
  }
}

void softmax_xent_csr(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent_csr")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  if (d.b == 0 || d.l == 0) {
    write_zero(out, s);
    return;
  }
  const float* x = a.in[0].as<const float>();
  const int64_t chunks = chunks_of(d.l);
  const XentCsrLayout w = xent_csr_layout(a.workspace, d.b, chunks);
  if (!xent_csr_stats(x, d.b, d.l, w, s)) return;
  xent_csr_row_kernel<<<rows_grid(d.b), kRowThreads, 0, s>>>(
      x, a.in[1].as<const int32_t>(), a.in[2].as<const int32_t>(), d.b, d.l, chunks, w.pmax,
      w.pninf, w.psum, w.prow);
  if (!launched("xent_csr_row_kernel")) return;
  finish_kernel<<<1, kThreads, 0, s>>>(w.prow, d.b, d.b, out);
  launched("finish_kernel");
}

// dx = k·(softmax(x)·n_r − 0) everywhere, n_r = the row's label count ...
__global__ void xent_csr_grad_kernel(const float* __restrict__ x, const int32_t* __restrict__ lptr,
                                     float* __restrict__ dx, int64_t B, int64_t L,
                                     const float* __restrict__ pmax,
                                     const double* __restrict__ psum, float k) {
  const int64_t chunks = gridDim.x;
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const double lse = row_lse(pmax, psum, r, chunks);
    const float tsf = static_cast<float>(lptr[r + 1] - lptr[r]);
    const int64_t j0 = blockIdx.x * kChunk, j1 = j0 + kChunk < L ? j0 + kChunk : L;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      const float p = expf(static_cast<float>(static_cast<double>(x[r * L + j]) - lse));
      dx[r * L + j] = k * (p * tsf - 0.0f);
    }
  }
}

// ... then k·(softmax(x)·n_r − 1) at the listed labels.
__global__ void xent_csr_grad_fix_kernel(const float* __restrict__ x,
                                         const int32_t* __restrict__ lptr,
                                         const int32_t* __restrict__ lidx, float* __restrict__ dx,
                                         int64_t B, int64_t L, int64_t chunks,
                                         const float* __restrict__ pmax,
                                         const double* __restrict__ psum, float k) {
  for (int64_t r = blockIdx.x; r < B; r += gridDim.x) {
    const double lse = row_lse(pmax, psum, r, chunks);
    const float tsf = static_cast<float>(lptr[r + 1] - lptr[r]);
    for (int64_t j = lptr[r] + int64_t{threadIdx.x}; j < lptr[r + 1]; j += blockDim.x) {
      const int64_t i = r * L + lidx[j];
      const float p = expf(static_cast<float>(static_cast<double>(x[i]) - lse));
      dx[i] = k * (p * tsf - 1.0f);
    }
  }
}

void softmax_xent_csr_grad(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent_csr_grad")) return;
  const Dims d = dims_of(a.in[0]);
  if (d.b == 0 || d.l == 0) return;
  const float* x = a.in[0].as<const float>();
  const int32_t* lptr = a.in[1].as<const int32_t>();
  const int32_t* lidx = a.in[2].as<const int32_t>();
  float* dx = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  const int64_t chunks = chunks_of(d.l);
  const XentCsrLayout w = xent_csr_layout(a.workspace, d.b, chunks);
  const float k = grad_scale(a, d.b);
  if (!xent_csr_stats(x, d.b, d.l, w, s)) return;
  xent_csr_grad_kernel<<<chunk_grid(d.b, chunks), kThreads, 0, s>>>(x, lptr, dx, d.b, d.l, w.pmax,
                                                                    w.psum, k);
  if (!launched("xent_csr_grad_kernel")) return;
  xent_csr_grad_fix_kernel<<<rows_grid(d.b), kRowThreads, 0, s>>>(x, lptr, lidx, dx, d.b, d.l,
                                                                  chunks, w.pmax, w.psum, k);
  launched("xent_csr_grad_fix_kernel");
}

// ---- mean squared error with row weights ------------------------------------------
//
// Σ_r w_r Σ_c (p − t)² / (C · max(Σ_r w_r, 1)); a row of weight 0 is not read
// and gets a zero gradient. The forward pass is a flat reduction as bce's,
// each block also summing a strided share of the row weights.

__global__ void mse_partials_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                    const float* __restrict__ w, int64_t B, int64_t C,
                                    double* __restrict__ pnum, double* __restrict__ pw) {
  __shared__ double scratch[33];
  const int64_t n = B * C;
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  double acc = 0.0, ws = 0.0;
  for (int64_t i = start; i < n; i += stride) {
    const float wr = w[i / C];
    if (wr == 0.0f) continue;
    const double d = static_cast<double>(p[i]) - static_cast<double>(t[i]);
    acc += static_cast<double>(wr) * (d * d);
  }
  for (int64_t r = start; r < B; r += stride)
    if (w[r] != 0.0f) ws += static_cast<double>(w[r]);
  acc = block_sum(acc, scratch);
  ws = block_sum(ws, scratch);
  if (threadIdx.x == 0) {
    pnum[blockIdx.x] = acc;
    pw[blockIdx.x] = ws;
  }
}

__global__ void mse_finish_kernel(const double* __restrict__ pnum, const double* __restrict__ pw,
                                  int64_t n, int64_t C, float* __restrict__ out) {
  __shared__ double scratch[33];
  double num = 0.0, ws = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    num += pnum[i];
    ws += pw[i];
  }
  num = block_sum(num, scratch);
  ws = block_sum(ws, scratch);
  if (threadIdx.x == 0) *out = static_cast<float>(num / (static_cast<double>(C) * fmax(ws, 1.0)));
}

struct MseLayout {
  double* pnum;  // [blocks]
  double* pw;    // [blocks]
  size_t total;
};

MseLayout mse_layout(void* base, int64_t blocks) {
  Carve c{static_cast<std::byte*>(base)};
  MseLayout w{};
  w.pnum = c.take<double>(static_cast<size_t>(blocks));
  w.pw = c.take<double>(static_cast<size_t>(blocks));
  w.total = c.used;
  return w;
}

// Blocks of the forward reduction: enough for the elements and for the rows.
int64_t mse_blocks(const Dims& d) {
  return partial_blocks(std::max(d.b * d.l, d.b));
}

size_t mse_ws(const KernelArgs& a) {
  return mse_layout(nullptr, mse_blocks(dims_of(a.in[0]))).total;
}

void mse(const KernelArgs& a) {
  if (!f32_only(a, "mse")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  if (d.b == 0 || d.l == 0) {  // no rows or no columns: the loss is 0, not 0/0
    write_zero(out, s);
    return;
  }
  const int64_t blocks = mse_blocks(d);
  const MseLayout w = mse_layout(a.workspace, blocks);
  mse_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), a.in[2].as<const float>(), d.b, d.l,
      w.pnum, w.pw);
  if (!launched("mse_partials_kernel")) return;
  mse_finish_kernel<<<1, kThreads, 0, s>>>(w.pnum, w.pw, blocks, d.l, out);
  launched("mse_finish_kernel");
}

// Σ_r w_r over the rows of nonzero weight, one block, into *sum.
__global__ void weight_sum_kernel(const float* __restrict__ w, int64_t B,
                                  double* __restrict__ sum) {
  __shared__ double scratch[33];
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < B; r += blockDim.x)
    if (w[r] != 0.0f) acc += static_cast<double>(w[r]);
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *sum = acc;
}

// dx = k·w_r·(p − t), k = 2·scale / (C·max(Σw, 1)); 0 where w_r = 0.
__global__ void mse_grad_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                const float* __restrict__ w, float* __restrict__ dx, int64_t n,
                                int64_t C, double two_scale_over_c,
                                const double* __restrict__ wsum) {
  const double k = two_scale_over_c / fmax(*wsum, 1.0);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float wr = w[i / C];
    dx[i] = wr == 0.0f ? 0.0f : static_cast<float>(k * static_cast<double>(wr)) * (p[i] - t[i]);
  }
}

size_t one_double_ws(const KernelArgs&) {
  return sizeof(double);
}

void mse_grad(const KernelArgs& a) {
  if (!f32_only(a, "mse_grad")) return;
  const Dims d = dims_of(a.in[0]);
  const int64_t n = d.b * d.l;
  if (n == 0) return;
  const cudaStream_t s = stream_of(a);
  const float* w = a.in[2].as<const float>();
  auto* wsum = static_cast<double*>(a.workspace);
  weight_sum_kernel<<<1, kThreads, 0, s>>>(w, d.b, wsum);
  if (!launched("weight_sum_kernel")) return;
  const double k = 2.0 * a.attrs.get("scale", 1.0) / static_cast<double>(d.l);
  mse_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(a.in[0].as<const float>(),
                                                             a.in[1].as<const float>(), w,
                                                             a.out[0].as<float>(), n, d.l, k, wsum);
  launched("mse_grad_kernel");
}

// ---- softmax cross-entropy with one class id per row ------------------------------
//
// A group of G threads owns a row (grid-stride over rows): a warp when rows
// are short, the whole block when they are long. Per counted row: one pass
// for the maximum, one for Σ exp(x − shift) (the reference's shift rule),
// and for the gradient one that writes the softmax. Rows whose id is outside
// [0, C) are not read: their loss is not counted, their gradient is 0.

constexpr int64_t kWarpRowMax = 2048;  // rows up to this long: a warp each

__device__ __forceinline__ bool counted(int32_t c, int64_t l) {
  return c >= 0 && c < l;
}

// Max over the group (NaN skipped, as fmaxf does), in every thread of it.
template <int G>
__device__ __forceinline__ float group_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  if constexpr (G == 32) {
    return v;
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = scratch[0];
    for (int i = 1; i < G / 32; ++i) m = fmaxf(m, scratch[i]);
    __syncthreads();  // scratch may be reused right away
    return m;
  }
}

// Sum over the group in a fixed tree, in every thread of it.
template <int G>
__device__ __forceinline__ double group_sum(double v, double* scratch) {
  if constexpr (G == 32) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    return v;
  } else {
    return block_sum(v, scratch);
  }
}

// Row r's log Σ exp, from its G threads (lane = the thread's place in the group).
template <int G>
__device__ __forceinline__ double group_row_lse(const float* __restrict__ xr, int64_t L, int lane,
                                                float* fscratch, double* dscratch) {
  float m = -INFINITY;
  for (int64_t j = lane; j < L; j += G) m = fmaxf(m, xr[j]);
  m = group_max<G>(m, fscratch);
  const float shift = isfinite(m) ? m : 0.0f;
  double se = 0.0;
  for (int64_t j = lane; j < L; j += G) se += static_cast<double>(expf(xr[j] - shift));
  se = group_sum<G>(se, dscratch);
  return static_cast<double>(shift) + log(se);
}

// Rows handled by one block, and the group and row this thread starts at.
template <int G>
struct RowGroups {
  static constexpr int kPerBlock = kThreads / G;
  __device__ static int lane() { return static_cast<int>(threadIdx.x) % G; }
  __device__ static int64_t first() { return blockIdx.x * int64_t{kPerBlock} + threadIdx.x / G; }
  __device__ static int64_t stride() { return int64_t{gridDim.x} * kPerBlock; }
};

template <int G>
__global__ void xent_index_row_kernel(const float* __restrict__ x, const int32_t* __restrict__ t,
                                      int64_t B, int64_t L, double* __restrict__ prow,
                                      double* __restrict__ pcnt) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[33];
  using RG = RowGroups<G>;
  const int lane = RG::lane();
  // Every thread of a group walks the same rows; with G = the block, so does
  // the whole block, and the branch below is taken by all of it alike.
  for (int64_t r = RG::first(); r < B; r += RG::stride()) {
    const int32_t c = t[r];
    if (!counted(c, L)) {
      if (lane == 0) prow[r] = pcnt[r] = 0.0;
      continue;
    }
    const float* xr = x + r * L;
    const double lse = group_row_lse<G>(xr, L, lane, fscratch, dscratch);
    if (lane == 0) {
      prow[r] = lse - static_cast<double>(xr[c]);
      pcnt[r] = 1.0;
    }
  }
}

// out = Σ prow / Σ pcnt over [0, B), 0 when no row counted.
__global__ void xent_index_finish_kernel(const double* __restrict__ prow,
                                         const double* __restrict__ pcnt, int64_t B,
                                         float* __restrict__ out) {
  __shared__ double scratch[33];
  double s = 0.0, n = 0.0;
  for (int64_t i = threadIdx.x; i < B; i += blockDim.x) {
    s += prow[i];
    n += pcnt[i];
  }
  s = block_sum(s, scratch);
  n = block_sum(n, scratch);
  if (threadIdx.x == 0) *out = static_cast<float>(n > 0.0 ? s / n : 0.0);
}

template <int G>
unsigned row_group_grid(int64_t B) {
  const int64_t need = ceil_div(B, int64_t{RowGroups<G>::kPerBlock});
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(need, int64_t{sm_count()} * 32)));
}

struct XentIndexLayout {
  double* prow;  // [B] the row's loss
  double* pcnt;  // [B] 1 for a counted row
  size_t total;
};

XentIndexLayout xent_index_layout(void* base, int64_t B) {
  Carve c{static_cast<std::byte*>(base)};
  XentIndexLayout w{};
  w.prow = c.take<double>(static_cast<size_t>(B));
  w.pcnt = c.take<double>(static_cast<size_t>(B));
  w.total = c.used;
  return w;
}

size_t xent_index_ws(const KernelArgs& a) {
  return xent_index_layout(nullptr, dims_of(a.in[0]).b).total;
}

void softmax_xent_index(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent_index")) return;
  const Dims d = dims_of(a.in[0]);
  float* out = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  if (d.b == 0 || d.l == 0) {  // no row can be counted
    write_zero(out, s);
    return;
  }
  const float* x = a.in[0].as<const float>();
  const int32_t* t = a.in[1].as<const int32_t>();
  const XentIndexLayout w = xent_index_layout(a.workspace, d.b);
  if (d.l <= kWarpRowMax)
    xent_index_row_kernel<32>
        <<<row_group_grid<32>(d.b), kThreads, 0, s>>>(x, t, d.b, d.l, w.prow, w.pcnt);
  else
    xent_index_row_kernel<kThreads>
        <<<row_group_grid<kThreads>(d.b), kThreads, 0, s>>>(x, t, d.b, d.l, w.prow, w.pcnt);
  if (!launched("xent_index_row_kernel")) return;
  xent_index_finish_kernel<<<1, kThreads, 0, s>>>(w.prow, w.pcnt, d.b, out);
  launched("xent_index_finish_kernel");
}

// The number of counted rows, one block, into *count.
__global__ void xent_index_count_kernel(const int32_t* __restrict__ t, int64_t B, int64_t L,
                                        double* __restrict__ count) {
  __shared__ double scratch[33];
  double n = 0.0;
  for (int64_t r = threadIdx.x; r < B; r += blockDim.x) n += counted(t[r], L) ? 1.0 : 0.0;
  n = block_sum(n, scratch);
  if (threadIdx.x == 0) *count = n;
}

// dx = k·(softmax(x) − onehot(c)), k = scale / max(count, 1); 0 on rows not
// counted. p = exp(x − lse) with x − lse formed in double.
template <int G>
__global__ void xent_index_grad_kernel(const float* __restrict__ x, const int32_t* __restrict__ t,
                                       float* __restrict__ dx, int64_t B, int64_t L, double scale,
                                       const double* __restrict__ count) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[33];
  using RG = RowGroups<G>;
  const int lane = RG::lane();
  const float k = static_cast<float>(scale / fmax(*count, 1.0));
  for (int64_t r = RG::first(); r < B; r += RG::stride()) {
    const int32_t c = t[r];
    const float* xr = x + r * L;
    float* dr = dx + r * L;
    if (!counted(c, L)) {
      for (int64_t j = lane; j < L; j += G) dr[j] = 0.0f;
      continue;
    }
    const double lse = group_row_lse<G>(xr, L, lane, fscratch, dscratch);
    for (int64_t j = lane; j < L; j += G) {
      const float p = expf(static_cast<float>(static_cast<double>(xr[j]) - lse));
      dr[j] = k * (j == c ? p - 1.0f : p);
    }
  }
}

void softmax_xent_index_grad(const KernelArgs& a) {
  if (!f32_only(a, "softmax_xent_index_grad")) return;
  const Dims d = dims_of(a.in[0]);
  if (d.b == 0 || d.l == 0) return;
  const float* x = a.in[0].as<const float>();
  const int32_t* t = a.in[1].as<const int32_t>();
  float* dx = a.out[0].as<float>();
  const cudaStream_t s = stream_of(a);
  auto* count = static_cast<double*>(a.workspace);
  xent_index_count_kernel<<<1, kThreads, 0, s>>>(t, d.b, d.l, count);
  if (!launched("xent_index_count_kernel")) return;
  const double scale = a.attrs.get("scale", 1.0);
  if (d.l <= kWarpRowMax)
    xent_index_grad_kernel<32>
        <<<row_group_grid<32>(d.b), kThreads, 0, s>>>(x, t, dx, d.b, d.l, scale, count);
  else
    xent_index_grad_kernel<kThreads>
        <<<row_group_grid<kThreads>(d.b), kThreads, 0, s>>>(x, t, dx, d.b, d.l, scale, count);
  launched("xent_index_grad_kernel");
}

KernelVariant det(const char* op, KernelFn fn, WorkspaceFn ws) {
  return KernelVariant{op, "cuda", fn, ws, true, f32_operands};
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_loss_kernels() {
  using namespace cuda;
  return {
      det("bce_logits", flat_loss<Kind::bce>, flat_ws),
      det("bce_logits_grad", flat_grad<Kind::bce>, nullptr),
      det("squared_hinge", flat_loss<Kind::hinge>, flat_ws),
      det("squared_hinge_grad", flat_grad<Kind::hinge>, nullptr),
      det("softmax_xent", softmax_xent, xent_ws),
      det("softmax_xent_grad", softmax_xent_grad, xent_ws),
      det("bce_logits_csr", csr_loss<Kind::bce>, csr_ws),
      det("bce_logits_csr_grad", csr_flat_grad<Kind::bce>, nullptr),
      det("squared_hinge_csr", csr_loss<Kind::hinge>, csr_ws),
      det("squared_hinge_csr_grad", csr_flat_grad<Kind::hinge>, nullptr),
      det("softmax_xent_csr", softmax_xent_csr, xent_csr_ws),
      det("softmax_xent_csr_grad", softmax_xent_csr_grad, xent_csr_ws),
      {"mse", "cuda", mse, mse_ws, true, f32_operands},
      {"mse_grad", "cuda", mse_grad, one_double_ws, true, f32_operands},
      {"softmax_xent_index", "cuda", softmax_xent_index, xent_index_ws, true, f32_operands},
      {"softmax_xent_index_grad", "cuda", softmax_xent_index_grad, one_double_ws, true,
       f32_operands},
  };
}

}  // namespace pooch::kern
