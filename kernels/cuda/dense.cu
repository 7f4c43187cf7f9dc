// CUDA kernels of the dense family (docs/OPS.md, "Dense"), f32.
//
// GEMMs go to cuBLAS (full f32 math, no TF32), row-major through the usual
// transposition: a row-major [R,C] matrix is a column-major [C,R] one, so
// y = x·Wᵀ becomes yᵀ = W·xᵀ with W read transposed. cuBLAS GEMMs are
// bitwise reproducible on one GPU with a fixed workspace (the backend sets
// one). Everything else is a plain kernel; every reduction (bias and
// layernorm parameter gradients, layernorm statistics) is summed in double in
// a fixed order, so every kernel here is deterministic.
#include <climits>
#include <cmath>

#include "../common/permute.h"
#include "../common/philox.h"
#include "../common/supports.h"
#include "common.cuh"
#include "cuda_libs.h"

namespace pooch::kern {
namespace cuda {
namespace {

bool fits_int(int64_t v) {
  return v >= 0 && v <= INT_MAX;
}

cublasHandle_t cublas_handle(const char* op) {
  LaunchEnv* e = current_launch_env();
  if (e == nullptr || e->cublas == nullptr) {
    report("%s: no cuBLAS handle (launched outside a CUDA backend)", op);
    return nullptr;
  }
  return static_cast<cublasHandle_t>(e->cublas);
}

bool cublas_ok(cublasStatus_t st, const char* call) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  report("%s: %s", call, cuda_libs().cublasGetStatusString(st));
  return false;
}

// C[m×n] (column-major, ldc) = op(A)·op(B) (+ C when accumulate).
bool sgemm(const char* op, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
           int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
           bool accumulate, float* C, int64_t ldc) {
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
      !fits_int(ldc)) {
    report("%s: a GEMM dimension exceeds 2^31-1 (m=%lld n=%lld k=%lld)", op,
           static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
    return false;
  }
  const float one = 1.0f, zero = 0.0f;
  return cublas_ok(cuda_libs().cublasSgemm(h, ta, tb, static_cast<int>(m), static_cast<int>(n),
                                           static_cast<int>(k), &one, A, static_cast<int>(lda), B,
                                           static_cast<int>(ldb), accumulate ? &one : &zero, C,
                                           static_cast<int>(ldc)),
                   "cublasSgemm");
}

__global__ void broadcast_rows_kernel(const float* __restrict__ row, int64_t R, int64_t C,
                                      float* __restrict__ out) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = row[i % C];
}

bool zero_fill(float* p, int64_t n, cudaStream_t s) {
  if (n <= 0) return true;
  return cuda_ok(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), s),
                 "cudaMemsetAsync");
}

__global__ void column_sums_kernel(const float* __restrict__ m, int64_t R, int64_t C,
                                   float* __restrict__ out) {
  __shared__ double part[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  double acc = 0.0;
  if (c < C)
    for (int64_t r = threadIdx.y; r < R; r += 8) acc += static_cast<double>(m[r * C + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double s = 0.0;
    for (int j = 0; j < 8; ++j) s += part[j][threadIdx.x];
    out[c] = static_cast<float>(s);
  }
}

// ---- linear ----------------------------------------------------------------

// y[B,O] = x[B,I]·W[O,I]ᵀ (+ b): y is written with the bias first and the
// GEMM accumulates onto it.
void linear(const KernelArgs& a) {
  if (!f32_only(a, "linear")) return;
  const float* x = a.in[0].as<const float>();
  const float* w = a.in[1].as<const float>();
  const float* bias = a.n_in > 2 ? a.in[2].as<const float>() : nullptr;
  float* y = a.out[0].as<float>();
  // x[..., I]: the leading dimensions are B rows.
  const int64_t B = a.in[0].rows(), I = a.in[0].cols(), O = a.in[1].dim(0);
  if (B == 0 || O == 0) return;
  const cudaStream_t s = stream_of(a);
  if (bias) {
    broadcast_rows_kernel<<<grid_for(B * O, kThreads), kThreads, 0, s>>>(bias, B, O, y);
    if (!launched("broadcast_rows_kernel")) return;
  } else if (I == 0) {
    zero_fill(y, B * O, s);
  }
  if (I == 0) return;
  cublasHandle_t h = cublas_handle("linear");
  if (!h) return;
  sgemm("linear", h, CUBLAS_OP_T, CUBLAS_OP_N, O, B, I, w, I, x, I, bias != nullptr, y, O);
}

// dx[B,I] = dy[B,O]·W[O,I].
void linear_grad_input(const KernelArgs& a) {
  if (!f32_only(a, "linear_grad_input")) return;
  const float* dy = a.in[0].as<const float>();
  const float* w = a.in[1].as<const float>();
  float* dx = a.out[0].as<float>();
  const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].dim(1);
  if (B == 0 || I == 0) return;
  const cudaStream_t s = stream_of(a);
  if (O == 0) {
    zero_fill(dx, B * I, s);
    return;
  }
  cublasHandle_t h = cublas_handle("linear_grad_input");
  if (!h) return;
  sgemm("linear_grad_input", h, CUBLAS_OP_N, CUBLAS_OP_N, I, B, O, w, I, dy, O, false, dx, I);
}

// dW[O,I] = dy[B,O]ᵀ·x[B,I], db[O] = Σ_b dy.
void linear_grad_weight(const KernelArgs& a) {
  if (!f32_only(a, "linear_grad_weight")) return;
  const float* dy = a.in[0].as<const float>();
  const float* x = a.in[1].as<const float>();
  float* dw = a.out[0].as<float>();
  const int64_t B = a.in[0].rows(), O = a.in[0].cols(), I = a.in[1].cols();
  const cudaStream_t s = stream_of(a);
  if (O > 0 && I > 0) {
    if (B == 0) {
      if (!zero_fill(dw, O * I, s)) return;
    } else {
      cublasHandle_t h = cublas_handle("linear_grad_weight");
      if (!h) return;
      if (!sgemm("linear_grad_weight", h, CUBLAS_OP_N, CUBLAS_OP_T, I, O, B, x, I, dy, O, false, dw,
                 I))
        return;
    }
  }
  if (a.n_out > 1) column_sums(dy, B, O, a.out[1].as<float>(), s);
}

// ---- elementwise -----------------------------------------------------------

// `x < 0 ? 0 : x` keeps NaN as NaN, as the reference does.
__global__ void scale_kernel(const float* x, float* y, float s, int64_t n) {
  POOCH_GRID_STRIDE(i, n) {
    y[i] = x[i] * s;
  }
}

__global__ void relu_kernel(const float* x, float* y, int64_t n) {
  POOCH_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void relu_grad_kernel(const float* __restrict__ dy, const float* __restrict__ y,
                                 float* dx, int64_t n) {
  POOCH_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void gelu_kernel(const float* x, float* y, int64_t n) {
  POOCH_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v * normcdff(v);
  }
}

__global__ void gelu_grad_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                 float* dx, int64_t n) {
  POOCH_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float pdf = 0.39894228040143267794f * expf(-0.5f * v * v);
    dx[i] = dy[i] * (normcdff(v) + v * pdf);
  }
}

__global__ void add_kernel(const float* x, const float* z, float* y, int64_t n) {
  POOCH_GRID_STRIDE(i, n) y[i] = x[i] + z[i];
}

// One thread per Philox block of four elements: the same words
// philox_uniform(seed, step, key, i) uses for i = 4·blk .. 4·blk+3, compared
// with p in float and scaled in double, exactly as the CPU kernels do, so
// the masks and the values are bitwise the same on both backends.
__global__ void dropout_kernel(const float* x, float* y, int64_t n, uint64_t seed, uint64_t step,
                               uint32_t key, float pf, double scale) {
  const int64_t nblk = (n + 3) / 4;
  POOCH_GRID_STRIDE(blk, nblk) {
    const uint64_t ub = static_cast<uint64_t>(blk);
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(ub), static_cast<uint32_t>(ub >> 32), key,
                                    static_cast<uint32_t>(step), static_cast<uint32_t>(seed),
                                    static_cast<uint32_t>(seed >> 32));
    const int64_t i0 = blk * 4;
    const int m = n - i0 < 4 ? static_cast<int>(n - i0) : 4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < m) {
        const float u = static_cast<float>(r.v[j] >> 8) * (1.0f / 16777216.0f);
        y[i0 + j] = static_cast<float>(static_cast<double>(x[i0 + j]) * (u >= pf ? scale : 0.0));
      }
  }
}

template <class Kernel, class... Args>
void launch_elementwise(Kernel k, const char* name, int64_t n, cudaStream_t s, Args... args) {
  if (n <= 0) return;
  k<<<grid_for(n, kThreads), kThreads, 0, s>>>(args..., n);
  launched(name);
}

void relu(const KernelArgs& a) {
  if (!f32_only(a, "relu")) return;
  launch_elementwise(relu_kernel, "relu_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.out[0].as<float>());
}

void scale(const KernelArgs& a) {
  if (!f32_only(a, "scale")) return;
  launch_elementwise(scale_kernel, "scale_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.out[0].as<float>(),
                     static_cast<float>(a.attrs.get("s", 1.0)));
}

void relu_grad(const KernelArgs& a) {
  if (!f32_only(a, "relu_grad")) return;
  launch_elementwise(relu_grad_kernel, "relu_grad_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.in[1].as<const float>(), a.out[0].as<float>());
}

void gelu(const KernelArgs& a) {
  if (!f32_only(a, "gelu")) return;
  launch_elementwise(gelu_kernel, "gelu_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.out[0].as<float>());
}

void gelu_grad(const KernelArgs& a) {
  if (!f32_only(a, "gelu_grad")) return;
  launch_elementwise(gelu_grad_kernel, "gelu_grad_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.in[1].as<const float>(), a.out[0].as<float>());
}

void add(const KernelArgs& a) {
  if (!f32_only(a, "add")) return;
  launch_elementwise(add_kernel, "add_kernel", a.in[0].numel(), stream_of(a),
                     a.in[0].as<const float>(), a.in[1].as<const float>(), a.out[0].as<float>());
}

// dropout and dropout_grad: the context is a host pointer, read here.
void dropout(const KernelArgs& a) {
  if (!f32_only(a, "dropout")) return;
  const float* x = a.in[0].as<const float>();
  float* y = a.out[0].as<float>();
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  const cudaStream_t s = stream_of(a);
  const double p = a.attrs.get("p", 0.0);
  // Inference (training = 0) passes the input through, as p = 0 does.
  if (p <= 0.0 || (a.ctx != nullptr && !a.ctx->training)) {
    if (y != x)
      cuda_ok(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                              cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
    return;
  }
  const uint32_t key = static_cast<uint32_t>(a.attrs.geti("key", 0));
  const uint64_t seed = a.ctx ? a.ctx->seed : 0, step = a.ctx ? a.ctx->step : 0;
  const int64_t nblk = (n + 3) / 4;
  dropout_kernel<<<grid_for(nblk, kThreads), kThreads, 0, s>>>(
      x, y, n, seed, step, key, static_cast<float>(p), 1.0 / (1.0 - p));
  launched("dropout_kernel");
}

// ---- layernorm ---------------------------------------------------------------

// One block per row (grid-stride over rows). Statistics in double, two
// passes (mean, then squared deviations) as the reference; y in float from
// the float mean and rstd, as the CPU kernel.
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, float* __restrict__ y,
                                 float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                 int64_t B, int64_t D, double eps) {
  __shared__ double scratch[33];
  const double inv_d = D > 0 ? 1.0 / static_cast<double>(D) : 0.0;
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const float* xr = x + b * D;
    double s = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += static_cast<double>(xr[d]);
    const double mean = block_sum(s, scratch) * inv_d;
    double v = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double c = static_cast<double>(xr[d]) - mean;
      v += c * c;
    }
    const double rstd = 1.0 / sqrt(block_sum(v, scratch) * inv_d + eps);
    const float m = static_cast<float>(mean), rs = static_cast<float>(rstd);
    float* yr = y + b * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      yr[d] = (xr[d] - m) * rs * gamma[d] + beta[d];
    if (threadIdx.x == 0) {
      mean_out[b] = m;
      rstd_out[b] = rs;
    }
  }
}

// dx = rstd·(g − mean_d(g) − xhat·mean_d(g·xhat)), g = dy·γ, xhat = (x − mean)·rstd.
__global__ void layernorm_grad_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                         const float* __restrict__ gamma,
                                         const float* __restrict__ mean,
                                         const float* __restrict__ rstd, float* __restrict__ dx,
                                         int64_t B, int64_t D) {
  __shared__ double scratch[33];
  const double inv_d = D > 0 ? 1.0 / static_cast<double>(D) : 0.0;
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const float* dyr = dy + b * D;
    const float* xr = x + b * D;
    const float m = mean[b], rs = rstd[b];
    double sg = 0.0, sgx = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const float g = dyr[d] * gamma[d];
      const float xhat = (xr[d] - m) * rs;
      sg += static_cast<double>(g);
      sgx += static_cast<double>(g) * static_cast<double>(xhat);
    }
    const float mg = static_cast<float>(block_sum(sg, scratch) * inv_d);
    const float mgx = static_cast<float>(block_sum(sgx, scratch) * inv_d);
    float* dxr = dx + b * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const float g = dyr[d] * gamma[d];
      const float xhat = (xr[d] - m) * rs;
      dxr[d] = rs * (g - mg - xhat * mgx);
    }
  }
}

// dγ[d] = Σ_b dy·xhat, dβ[d] = Σ_b dy, as column_sums_kernel: 32 columns ×
// 8 row lanes per block, fixed order.
__global__ void layernorm_grad_params_kernel(const float* __restrict__ dy,
                                             const float* __restrict__ x,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd,
                                             float* __restrict__ dgamma, float* __restrict__ dbeta,
                                             int64_t B, int64_t D) {
  __shared__ double pg[8][33], pb[8][33];
  const int64_t d = blockIdx.x * int64_t{32} + threadIdx.x;
  double ag = 0.0, ab = 0.0;
  if (d < D)
    for (int64_t b = threadIdx.y; b < B; b += 8) {
      const float g = dy[b * D + d];
      const float xhat = (x[b * D + d] - mean[b]) * rstd[b];
      ag += static_cast<double>(g) * static_cast<double>(xhat);
      ab += static_cast<double>(g);
    }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && d < D) {
    double sg = 0.0, sb = 0.0;
    for (int j = 0; j < 8; ++j) {
      sg += pg[j][threadIdx.x];
      sb += pb[j][threadIdx.x];
    }
    dgamma[d] = static_cast<float>(sg);
    dbeta[d] = static_cast<float>(sb);
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, 65535)));
}

void layernorm(const KernelArgs& a) {
  if (!f32_only(a, "layernorm")) return;
  const int64_t B = a.in[0].rows(), D = a.in[0].cols();
  if (B == 0) return;
  layernorm_kernel<<<row_blocks(B), kThreads, 0, stream_of(a)>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), a.in[2].as<const float>(),
      a.out[0].as<float>(), a.out[1].as<float>(), a.out[2].as<float>(), B, D,
      a.attrs.get("eps", 1e-5));
  launched("layernorm_kernel");
}

void layernorm_grad(const KernelArgs& a) {
  if (!f32_only(a, "layernorm_grad")) return;
  const float* dy = a.in[0].as<const float>();
  const float* x = a.in[1].as<const float>();
  const float* gamma = a.in[2].as<const float>();
  const float* mean = a.in[3].as<const float>();
  const float* rstd = a.in[4].as<const float>();
  const int64_t B = a.in[0].rows(), D = a.in[0].cols();
  const cudaStream_t s = stream_of(a);
  if (B > 0 && D > 0) {
    layernorm_grad_dx_kernel<<<row_blocks(B), kThreads, 0, s>>>(dy, x, gamma, mean, rstd,
                                                                a.out[0].as<float>(), B, D);
    if (!launched("layernorm_grad_dx_kernel")) return;
  }
  if (D > 0) {
    layernorm_grad_params_kernel<<<static_cast<unsigned>(ceil_div(D, 32)), dim3(32, 8), 0, s>>>(
        dy, x, mean, rstd, a.out[1].as<float>(), a.out[2].as<float>(), B, D);
    launched("layernorm_grad_params_kernel");
  }
}

// ---- reshape, transpose ------------------------------------------------------

// reshape: the same bytes; a copy when the planner did not alias the two.
void reshape(const KernelArgs& a) {
  const size_t bytes = static_cast<size_t>(a.in[0].numel()) * dtype_size(a.in[0].dtype);
  if (bytes == 0 || a.out[0].data == a.in[0].data) return;
  cuda_ok(
      cudaMemcpyAsync(a.out[0].data, a.in[0].data, bytes, cudaMemcpyDeviceToDevice, stream_of(a)),
      "cudaMemcpyAsync");
}

// One thread per output element (grid-stride, coalesced writes): its four
// indices from the flat output position, the source from the input strides.
template <class E>
__global__ void transpose_kernel(const E* __restrict__ x, E* __restrict__ y, Permutation p,
                                 int64_t n) {
  POOCH_GRID_STRIDE(o, n) {
    int64_t r = o;
    const int64_t i3 = r % p.shape[3];
    r /= p.shape[3];
    const int64_t i2 = r % p.shape[2];
    r /= p.shape[2];
    const int64_t i1 = r % p.shape[1];
    const int64_t i0 = r / p.shape[1];
    y[o] = x[i0 * p.stride[0] + i1 * p.stride[1] + i2 * p.stride[2] + i3 * p.stride[3]];
  }
}

template <class E>
void transpose_t(const KernelArgs& a) {
  const Permutation p = permutation_of(a);
  launch_elementwise(transpose_kernel<E>, "transpose_kernel", p.numel(), stream_of(a),
                     a.in[0].as<const E>(), a.out[0].as<E>(), p);
}

// Elements move as unsigned integers of their size: any dtype.
void transpose(const KernelArgs& a) {
  switch (dtype_size(a.in[0].dtype)) {
    case 1:
      return transpose_t<uint8_t>(a);
    case 2:
      return transpose_t<uint16_t>(a);
    case 4:
      return transpose_t<uint32_t>(a);
    default:
      return transpose_t<uint64_t>(a);
  }
}

__global__ void probe_kernel() {}

// ---- supports ----------------------------------------------------------------

// cuBLAS takes int dimensions: f32, and the rows and both widths within int.
bool supports_linear(const KernelArgs& a) {
  return f32_operands(a) && fits_int(a.in[0].rows()) && fits_int(a.in[0].cols()) &&
         fits_int(a.in[1].dim(0)) && fits_int(a.in[1].dim(1));
}
// The gradient GEMMs: dy[..., O] against W[O, I] or x[..., I].
bool supports_linear_grad(const KernelArgs& a) {
  return f32_operands(a) && fits_int(a.in[0].rows()) && fits_int(a.in[0].cols()) &&
         fits_int(a.in[1].cols());
}

KernelVariant cublas(const char* op, KernelFn fn, SupportsFn supports) {
  return KernelVariant{op, "cublas", fn, nullptr, true, supports};
}
KernelVariant plain(const char* op, KernelFn fn, SupportsFn supports = f32_operands) {
  return KernelVariant{op, "cuda", fn, nullptr, true, supports};
}

}  // namespace

bool column_sums(const float* m, int64_t R, int64_t C, float* out, cudaStream_t s) {
  if (C <= 0) return true;
  column_sums_kernel<<<static_cast<unsigned>(ceil_div(C, 32)), dim3(32, 8), 0, s>>>(m, R, C, out);
  return launched("column_sums_kernel");
}

int kernel_image_status() {
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
  return static_cast<int>(e);
}

}  // namespace cuda

std::vector<KernelVariant> cuda_dense_kernels() {
  using namespace cuda;
  return {
      cublas("linear", linear, supports_linear),
      cublas("linear_grad_input", linear_grad_input, supports_linear_grad),
      cublas("linear_grad_weight", linear_grad_weight, supports_linear_grad),
      plain("relu", relu),
      plain("relu_grad", relu_grad),
      plain("scale", scale),
      plain("gelu", gelu),
      plain("gelu_grad", gelu_grad),
      plain("dropout", dropout),
      plain("dropout_grad", dropout),
      plain("layernorm", layernorm),
      plain("layernorm_grad", layernorm_grad),
      plain("add", add),
      // Any dtype: elements are moved, never computed with.
      plain("reshape", reshape, nullptr),
      plain("transpose", transpose, nullptr),
  };
}

}  // namespace pooch::kern
