// Fast f32 kernels of the dense family (docs/OPS.md, "Dense").
//
// GEMMs go to OpenBLAS, always called from outside any OpenMP region: it runs
// its own thread pool, and calling it from inside ours would oversubscribe
// the cores. Everything else is OpenMP over rows or elements, with an `if`
// clause so small tensors stay on the calling thread, and `omp simd` on the
// inner loops: it both vectorises reductions (a fixed order, so still
// bitwise reproducible) and lets in-place calls (relu, add) vectorise, where
// the compiler's own overlap check would fall back to scalar code.
//
// Column reductions (bias and layernorm parameter gradients) are split over
// blocks of columns, each summed over all rows by one thread in row order:
// deterministic for any thread count, and no atomics.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../common/permute.h"
#include "../common/philox.h"
#include "../common/supports.h"
#include "cpu_kernels.h"
#include "target_clones.h"

namespace pooch::kern {
namespace {

// Below these sizes a parallel region costs more than it saves. Elementwise
// ops that only load and store saturate memory bandwidth with few threads;
// gelu and dropout do enough arithmetic per element to split earlier.
constexpr int64_t kGrainCheap = int64_t{1} << 15;
constexpr int64_t kGrainMath = int64_t{1} << 12;
// Columns per task in column reductions: the double accumulators of one
// block (2 × 64 × 8 bytes) stay in L1 while rows stream past.
constexpr int64_t kColBlock = 64;

// OpenBLAS takes 32-bit dimensions and rejects a leading dimension of 0, so
// callers handle empty operands themselves before reaching it.
blasint bi(int64_t v) {
  return static_cast<blasint>(v);
}

// out[c] = Σ_b m[b·C + c] over B rows, in double, parallel over column blocks.
void column_sums(const float* m, int64_t B, int64_t C, float* out, int threads) {
  const int64_t nblk = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for num_threads(threads) if (B * C > kGrainCheap) schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kColBlock, nc = std::min(kColBlock, C - c0);
    double acc[kColBlock] = {};
    for (int64_t b = 0; b < B; ++b) {
      const float* row = m + b * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < nc; ++c) acc[c] += static_cast<double>(row[c]);
    }
    for (int64_t c = 0; c < nc; ++c) out[c0 + c] = static_cast<float>(acc[c]);
  }
}

void fill_zero(float* p, int64_t n) {
  std::fill(p, p + n, 0.0f);
}

// y[B,O] = x[B,I]·W[O,I]ᵀ (+ b[O]); x[..., I] of any rank is B rows (the
// product of its leading dimensions), so rank 2 is exactly the plain GEMM.
void linear(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  const float* w = a.in[1].as<float>();
  const float* bias = a.n_in > 2 ? a.in[2].as<float>() : nullptr;
  float* y = a.out[0].as<float>();
  const int64_t B = a.in[0].rows(), I = a.in[0].cols(), O = a.in[1].dim(0);
  if (B == 0 || O == 0) return;
  // The bias is written first and the GEMM accumulates onto it (beta = 1),
  // which saves a second pass over y.
  if (bias) {
#pragma omp parallel for num_threads(threads_of(a)) if (B * O > kGrainCheap) schedule(static)
    for (int64_t b = 0; b < B; ++b) std::copy(bias, bias + O, y + b * O);
  } else if (I == 0) {
    fill_zero(y, B * O);
  }
  if (I == 0) return;
  // One row (a decoding step at batch 1): OpenBLAS's GEMM would first pack
  // all of W, reading it twice; GEMV streams it once, and at batch 1 the
  // weights' bandwidth is the whole cost. Its y starts at zero (beta = 1)
  // rather than trusting beta = 0 to overwrite arena garbage: some OpenBLAS
  // versions scale y by beta, and 0 × NaN is NaN.
  if (B == 1) {
    if (!bias) fill_zero(y, O);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, bi(O), bi(I), 1.0f, w, bi(I), x, 1, 1.0f, y, 1);
  } else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(B), bi(O), bi(I), 1.0f, x, bi(I), w,
                bi(I), bias ? 1.0f : 0.0f, y, bi(O));
}

// dx[B,I] = dy[B,O]·W[O,I].
void linear_grad_input(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* w = a.in[1].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].dim(1);
  if (B == 0 || I == 0) return;
  if (O == 0) return fill_zero(dx, B * I);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(B), bi(I), bi(O), 1.0f, dy, bi(O), w,
              bi(I), 0.0f, dx, bi(I));
}

// dW[O,I] = dy[B,O]ᵀ·x[B,I], db[O] = Σ_b dy.
void linear_grad_weight(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  float* dw = a.out[0].as<float>();
  const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].cols();
  if (O > 0 && I > 0) {
    if (B == 0)
      fill_zero(dw, O * I);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(O), bi(I), bi(B), 1.0f, dy, bi(O), x,
                  bi(I), 0.0f, dw, bi(I));
  }
  if (a.n_out > 1) column_sums(dy, B, O, a.out[1].as<float>(), threads_of(a));
}

void relu(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
  // As the reference: NaN stays NaN.
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainCheap) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void scale(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
  const float s = static_cast<float>(a.attrs.get("s", 1.0));
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainCheap) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

void relu_grad(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* y = a.in[1].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainCheap) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // loaded unconditionally, so the select vectorises
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// libm's erff and expf are calls the compiler cannot vectorise (without
// -ffast-math), so gelu uses branch-free approximations that it can.

// c ? a : b as a bit blend. With -ftrapping-math (the default) GCC will not
// if-convert a float ternary whose result feeds more arithmetic, and leaves
// the whole loop scalar; a blend of the bits has no control flow to convert.
inline float select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((m & std::bit_cast<uint32_t>(a)) | (~m & std::bit_cast<uint32_t>(b)));
}

// erf as a rational function on [-4, 4] (the minimax fit Eigen and XLA use);
// beyond that erf is ±1 in single precision. Within 4.2e-7 of erf (7 ulp
// near ±1, where gelu's 1 + erf cancels anyway).
inline float erf_approx(float v) {
  // A NaN fails both tests and propagates.
  float x = select(v < -4.0f, -4.0f, v);
  x = select(x > 4.0f, 4.0f, x);
  const float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  p = x * p;
  float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  return p / q;
}

// e^t for t <= 0 (Cephes' expf: t = k·ln2 + r, a degree-7 polynomial in r,
// then 2^k through the exponent bits). About 1 ulp. Below -87 the result
// (< 1.7e-38) is flushed to 0, which keeps 2^k a normal number.
inline float exp_nonpositive(float t) {
  // The clamp maps NaN to -87 too, so the float-to-int conversion is always
  // defined; r is then taken from t itself, so a NaN still propagates.
  const float tc = select(t >= -87.0f, t, -87.0f);
  const float fx = tc * 1.44269504088896341f + 0.5f;
  int32_t k = static_cast<int32_t>(fx);
  k -= static_cast<int32_t>(static_cast<float>(k) > fx);  // truncation to floor for negative fx
  const float kf = static_cast<float>(k);
  const float r = t - kf * 0.693359375f - kf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
  return select(t < -87.0f, 0.0f, y * scale);
}

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

void gelu(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainMath) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * (0.5f + 0.5f * erf_approx(v * kInvSqrt2));
  }
}

void gelu_grad(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainMath) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f + 0.5f * erf_approx(v * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * exp_nonpositive(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

// Philox4x32-10 (philox.h) for kLanes consecutive blocks at once: the same
// arithmetic lane by lane, so the same bits, but the rounds' 32×32→64-bit
// multiplies run as vectors. With the products below in vectors too, dropout
// went from 5.8% to 2.4% of a Debtags training run's samples (`perf record`
// over `pooch-run train` with the defaults; one block at a time, and the
// products in a loop that indexed the words by block, neither vectorised),
// the model the same bits. words[4·l + w] is word w of block first + l:
// element order, for the caller's vector loop.
constexpr int kPhiloxLanes = 16;
POOCH_VEC_CLONES void philox_lanes(uint64_t first, uint32_t key, uint64_t step, uint64_t seed,
                                   uint32_t (&words)[4 * kPhiloxLanes]) {
  uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
  for (int l = 0; l < kPhiloxLanes; ++l) {
    const uint64_t b = first + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(b);
    c1[l] = static_cast<uint32_t>(b >> 32);
    c2[l] = key;
    c3[l] = static_cast<uint32_t>(step);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
#pragma omp simd
    for (int l = 0; l < kPhiloxLanes; ++l) philox_round(c0[l], c1[l], c2[l], c3[l], k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int l = 0; l < kPhiloxLanes; ++l) {
    words[4 * l] = c0[l];
    words[4 * l + 1] = c1[l];
    words[4 * l + 2] = c2[l];
    words[4 * l + 3] = c3[l];
  }
}

// y[j] = x[j] · (u[j] >= p ? scale : 0) over one group's elements, u[j]
// the uniform of words[j] (philox_uniform's), the product in double.
POOCH_VEC_CLONES void dropout_group(const float* __restrict x, const uint32_t* words, int64_t m,
                                    float p, double scale, float* __restrict y) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) {
    const float u = static_cast<float>(words[j] >> 8) * (1.0f / 16777216.0f);
    y[j] = static_cast<float>(static_cast<double>(x[j]) * (u >= p ? scale : 0.0));
  }
}

// dropout and dropout_grad. philox_uniform(seed, step, key, i) is word i & 3
// of Philox block i >> 2: the loop takes kPhiloxLanes blocks (64 elements) at
// a time and reproduces exactly those values. The product is formed in
// double as the reference does, so results match it bit for bit.
void dropout(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const double p = a.attrs.get("p", 0.0);
  const int threads = threads_of(a);
  // Inference (training = 0) passes the input through, as p = 0 does.
  if (p <= 0.0 || (a.ctx && !a.ctx->training)) {
    if (y != x) {
#pragma omp parallel for num_threads(threads) if (parallel : n > kGrainCheap) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    }
    return;
  }
  const uint32_t key = static_cast<uint32_t>(a.attrs.geti("key", 0));
  const uint64_t seed = a.ctx ? a.ctx->seed : 0, step = a.ctx ? a.ctx->step : 0;
  const float pf = static_cast<float>(p);
  const double scale = 1.0 / (1.0 - p);
  constexpr int64_t kGroup = 4 * kPhiloxLanes;  // elements a group of blocks covers
  const int64_t groups = (n + kGroup - 1) / kGroup;
#pragma omp parallel for num_threads(threads) if (parallel : n > kGrainMath) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t words[kGroup];
    philox_lanes(static_cast<uint64_t>(g) * kPhiloxLanes, key, step, seed, words);
    const int64_t i0 = g * kGroup, m = std::min<int64_t>(kGroup, n - i0);
    dropout_group(x + i0, words, m, pf, scale, y + i0);
  }
}

void layernorm(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  const float* gamma = a.in[1].as<float>();
  const float* beta = a.in[2].as<float>();
  float* y = a.out[0].as<float>();
  float* mean_out = a.out[1].as<float>();
  float* rstd_out = a.out[2].as<float>();
  const int64_t B = a.in[0].rows(), D = a.in[0].cols();
  const double eps = a.attrs.get("eps", 1e-5);
  const double inv_d = D > 0 ? 1.0 / static_cast<double>(D) : 0.0;
#pragma omp parallel for num_threads(threads_of(a)) if (B * D > kGrainMath) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    const float* xr = x + b * D;
    float* yr = y + b * D;
    // Statistics in double and in two passes, as the reference: rows with a
    // large common offset keep their variance.
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(xr[d]);
    const double mean = s * inv_d;
    double v = 0.0;
#pragma omp simd reduction(+ : v)
    for (int64_t d = 0; d < D; ++d) {
      const double c = static_cast<double>(xr[d]) - mean;
      v += c * c;
    }
    const double rstd = 1.0 / std::sqrt(v * inv_d + eps);
    const float m = static_cast<float>(mean), rs = static_cast<float>(rstd);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - m) * rs * gamma[d] + beta[d];
    mean_out[b] = m;
    rstd_out[b] = rs;
  }
}

// dx = rstd·(g − mean_d(g) − xhat·mean_d(g·xhat)), g = dy·γ, xhat = (x − mean)·rstd;
// dγ = Σ_b dy·xhat, dβ = Σ_b dy.
void layernorm_grad(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  const float* gamma = a.in[2].as<float>();
  const float* mean = a.in[3].as<float>();
  const float* rstd = a.in[4].as<float>();
  float* dx = a.out[0].as<float>();
  float* dgamma = a.out[1].as<float>();
  float* dbeta = a.out[2].as<float>();
  const int64_t B = a.in[0].rows(), D = a.in[0].cols();
  const double inv_d = D > 0 ? 1.0 / static_cast<double>(D) : 0.0;
  const int64_t nblk = (D + kColBlock - 1) / kColBlock;
#pragma omp parallel num_threads(threads_of(a)) if (B * D > kGrainMath)
  {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < B; ++b) {
      const float* dyr = dy + b * D;
      const float* xr = x + b * D;
      float* dxr = dx + b * D;
      const float m = mean[b], rs = rstd[b];
      double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t d = 0; d < D; ++d) {
        const float g = dyr[d] * gamma[d];
        const float xhat = (xr[d] - m) * rs;
        sg += static_cast<double>(g);
        sgx += static_cast<double>(g) * static_cast<double>(xhat);
      }
      const float mg = static_cast<float>(sg * inv_d), mgx = static_cast<float>(sgx * inv_d);
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        const float g = dyr[d] * gamma[d];
        const float xhat = (xr[d] - m) * rs;
        dxr[d] = rs * (g - mg - xhat * mgx);
      }
    }
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t d0 = blk * kColBlock, nd = std::min(kColBlock, D - d0);
      double ag[kColBlock] = {}, ab[kColBlock] = {};
      for (int64_t b = 0; b < B; ++b) {
        const float* dyr = dy + b * D + d0;
        const float* xr = x + b * D + d0;
        const float m = mean[b], rs = rstd[b];
#pragma omp simd
        for (int64_t d = 0; d < nd; ++d) {
          const float xhat = (xr[d] - m) * rs;
          ag[d] += static_cast<double>(dyr[d]) * static_cast<double>(xhat);
          ab[d] += static_cast<double>(dyr[d]);
        }
      }
      for (int64_t d = 0; d < nd; ++d) {
        dgamma[d0 + d] = static_cast<float>(ag[d]);
        dbeta[d0 + d] = static_cast<float>(ab[d]);
      }
    }
  }
}

void add(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  const float* z = a.in[1].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  const int nt = threads_of(a);
#pragma omp parallel for simd num_threads(nt) if (parallel : n > kGrainCheap) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + z[i];
}

// reshape: the same bytes; a copy when the planner did not alias the two.
void reshape(const KernelArgs& a) {
  const auto* x = static_cast<const std::byte*>(a.in[0].data);
  auto* y = static_cast<std::byte*>(a.out[0].data);
  const int64_t bytes = a.in[0].numel() * static_cast<int64_t>(dtype_size(a.in[0].dtype));
  if (bytes == 0 || x == y) return;
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (bytes + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_of(a)) if (bytes > 4 * kGrainCheap) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b0 = c * kChunk;
    std::memcpy(y + b0, x + b0, static_cast<size_t>(std::min(kChunk, bytes - b0)));
  }
}

// transpose. When the last dimension keeps its place, each output row is a
// contiguous input row (a memcpy per row). Otherwise the output's last two
// dimensions are walked in square tiles: the tile's reads touch kTile input
// lines that stay in L1 while the tile's rows are written, instead of one
// line per element. Threads take whole tiles (or rows).
constexpr int64_t kTransposeTile = 32;

template <class E>
void transpose_elems(const KernelArgs& a) {
  const Permutation p = permutation_of(a);
  const E* x = a.in[0].as<const E>();
  E* y = a.out[0].as<E>();
  const int64_t n2 = p.shape[2], n3 = p.shape[3], s2 = p.stride[2], s3 = p.stride[3];
  const int64_t outer = p.shape[0] * p.shape[1];
  if (p.numel() == 0) return;
  const int nt = threads_of(a);
  if (s3 == 1) {
    const int64_t rows = outer * n2;
#pragma omp parallel for num_threads(nt) if (rows * n3 > kGrainCheap) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i2 = r % n2, i1 = r / n2 % p.shape[1], i0 = r / (n2 * p.shape[1]);
      std::memcpy(y + r * n3, x + i0 * p.stride[0] + i1 * p.stride[1] + i2 * s2,
                  static_cast<size_t>(n3) * sizeof(E));
    }
    return;
  }
  const int64_t t2 = (n2 + kTransposeTile - 1) / kTransposeTile;
  const int64_t t3 = (n3 + kTransposeTile - 1) / kTransposeTile;
  const int64_t tiles = outer * t2 * t3;
#pragma omp parallel for num_threads(nt) if (p.numel() > kGrainCheap) schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b3 = t % t3, b2 = t / t3 % t2, o = t / (t3 * t2);
    const int64_t i1 = o % p.shape[1], i0 = o / p.shape[1];
    const E* src = x + i0 * p.stride[0] + i1 * p.stride[1];
    E* dst = y + o * n2 * n3;
    const int64_t a2 = b2 * kTransposeTile, e2 = std::min(n2, a2 + kTransposeTile);
    const int64_t a3 = b3 * kTransposeTile, e3 = std::min(n3, a3 + kTransposeTile);
    for (int64_t i2 = a2; i2 < e2; ++i2)
      for (int64_t i3 = a3; i3 < e3; ++i3) dst[i2 * n3 + i3] = src[i2 * s2 + i3 * s3];
  }
}

// Elements move as unsigned integers of their size: any dtype.
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

// OpenBLAS takes blasint dimensions (32-bit unless built for ILP64).
bool fits_blasint(int64_t v) {
  return v >= 0 && v <= static_cast<int64_t>(std::numeric_limits<blasint>::max());
}

// linear: f32, and rows, inputs and outputs within OpenBLAS's integer type.
bool supports_linear(const KernelArgs& a) {
  return f32_operands(a) && fits_blasint(a.in[0].rows()) && fits_blasint(a.in[0].cols()) &&
         fits_blasint(a.in[1].dim(0)) && fits_blasint(a.in[1].dim(1));
}

// The gradient GEMMs: dy[..., O] against W[O, I] or x[..., I].
bool supports_linear_grad(const KernelArgs& a) {
  return f32_operands(a) && fits_blasint(a.in[0].rows()) && fits_blasint(a.in[0].cols()) &&
         fits_blasint(a.in[1].cols());
}

KernelVariant blas(const char* op, KernelFn fn, SupportsFn supports) {
  return KernelVariant{op, "blas", fn, nullptr, true, supports};
}
KernelVariant omp(const char* op, KernelFn fn, SupportsFn supports = f32_operands) {
  return KernelVariant{op, "omp", fn, nullptr, true, supports};
}
// An element-wise kernel over same-shaped operands: any layout, so long as
// all of them share it.
KernelVariant elementwise(const char* op, KernelFn fn, int n_in) {
  KernelVariant k = omp(op, fn);
  for (int i = 0; i < n_in; ++i) k.blocked |= in_bit(i);
  k.blocked |= out_bit(0);
  k.same_layout = true;
  return k;
}

}  // namespace

std::vector<KernelVariant> cpu_dense_kernels() {
  return {
      blas("linear", linear, supports_linear),
      blas("linear_grad_input", linear_grad_input, supports_linear_grad),
      blas("linear_grad_weight", linear_grad_weight, supports_linear_grad),
      elementwise("relu", relu, 1),
      elementwise("relu_grad", relu_grad, 2),
      omp("scale", scale),
      omp("gelu", gelu),
      omp("gelu_grad", gelu_grad),
      omp("dropout", dropout),
      omp("dropout_grad", dropout),
      omp("layernorm", layernorm),
      omp("layernorm_grad", layernorm_grad),
      elementwise("add", add, 2),
      // Any dtype: elements are moved, never computed with.
      omp("reshape", reshape, nullptr),
      omp("transpose", transpose, nullptr),
  };
}

}  // namespace pooch::kern
