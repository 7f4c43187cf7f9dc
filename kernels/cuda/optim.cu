// CUDA optimizer updates (docs/OPS.md, "Optimizer updates"), f32, in place.
// The scalars (learning rate × the context's lr_scale, bias corrections at
// t = the context's step) are formed on the host in double and rounded once,
// and each element follows the CPU kernels' float sequence (torch.optim's).
// Elements are independent: deterministic.
//
// The *_rows variants read the row count rows[0] on the device: blocks are
// launched for the capacity R and those past n return at once.
#include <cmath>

#include "../common/optim_params.h"
#include "../common/supports.h"
#include "common.cuh"

namespace pooch::kern {
namespace cuda {
namespace {

using Sgd = SgdParams;
using Adam = AdamParams;

// One element, as the CPU kernels update it (optim_params.h): the same bits.
// `c`: the gradient's clipping factor (1: none; x·1 is exact).
__device__ __forceinline__ void sgd_one(const Sgd& p, float c, float* w, const float* g,
                                        float* mom) {
  sgd_element(p, c, *w, *g, p.momentum == 0.0f ? nullptr : mom);
}

__device__ __forceinline__ void adam_one(const Adam& p, float c, float* w, const float* g, float* m,
                                         float* v) {
  adam_element(p, c, *w, *g, *m, *v);
}

// sumsq: ‖g‖² on the device when the update clips (null: no clipping).
__device__ __forceinline__ float clip_factor(const float* sumsq, double max_norm) {
  return sumsq ? clip_coef(*sumsq, max_norm) : 1.0f;
}

__global__ void sgd_kernel(Sgd p, const float* sumsq, double max_norm, float* w, const float* g,
                           float* mom, int64_t n) {
  const float c = clip_factor(sumsq, max_norm);
  POOCH_GRID_STRIDE(i, n) sgd_one(p, c, w + i, g + i, mom + i);
}

__global__ void adam_kernel(Adam p, const float* sumsq, double max_norm, float* w, const float* g,
                            float* m, float* v, int64_t n) {
  const float c = clip_factor(sumsq, max_norm);
  POOCH_GRID_STRIDE(i, n) adam_one(p, c, w + i, g + i, m + i, v + i);
}

// out = acc + Σ g², deterministic without atomics: partial_blocks(n) blocks
// each sum a grid-stride share in double (block_sum's fixed tree) into the
// workspace, then one block adds the partials in index order. (One block
// over the whole gradient, as at first, read a 500 MB gradient at one SM's
// bandwidth: milliseconds a step.)
__global__ void grad_sumsq_partials_kernel(const float* __restrict__ g, int64_t n,
                                           double* __restrict__ partial) {
  __shared__ double scratch[33];
  double s = 0.0;
  POOCH_GRID_STRIDE(i, n) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void grad_sumsq_finish_kernel(const double* __restrict__ partial, int64_t blocks,
                                         const float* acc, float* out) {
  __shared__ double scratch[33];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = static_cast<float>((acc ? static_cast<double>(*acc) : 0.0) + s);
}

// rows[0] = n, clamped to [0, cap]; ids outside [0, F) are skipped (the
// producer guarantees neither happens; a kernel must not write out of bounds).
__device__ __forceinline__ int64_t listed_rows(const int32_t* rows, int64_t cap) {
  const int64_t n = rows[0];
  return n < 0 ? 0 : (n > cap ? cap : n);
}

__global__ void sgd_rows_kernel(Sgd p, float* w, const int32_t* rows, int64_t cap, const float* g,
                                float* mom, int64_t F, int64_t O) {
  const int64_t n = listed_rows(rows, cap);
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t r = rows[1 + i];
    if (r < 0 || r >= F) continue;
    for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < O;
         o += int64_t{gridDim.x} * blockDim.x)
      sgd_one(p, 1.0f, w + r * O + o, g + i * O + o, mom + r * O + o);
  }
}

__global__ void adam_rows_kernel(Adam p, float* w, const int32_t* rows, int64_t cap, const float* g,
                                 float* m, float* v, int64_t F, int64_t O) {
  const int64_t n = listed_rows(rows, cap);
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t r = rows[1 + i];
    if (r < 0 || r >= F) continue;
    for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < O;
         o += int64_t{gridDim.x} * blockDim.x)
      adam_one(p, 1.0f, w + r * O + o, g + i * O + o, m + r * O + o, v + r * O + o);
  }
}

void sgd_dense(const KernelArgs& a) {
  if (!f32_only(a, "sgd_update")) return;
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  sgd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(a)>>>(
      sgd_params(a.attrs, a.ctx), a.n_in > 3 ? a.in[3].as<const float>() : nullptr,
      a.attrs.get("max_norm", 1.0), a.in[0].as<float>(), a.in[1].as<const float>(),
      a.in[2].as<float>(), n);
  launched("sgd_kernel");
}

void adam_dense(const KernelArgs& a) {
  if (!f32_only(a, "adam_update")) return;
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  adam_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(a)>>>(
      adam_params(a.attrs, a.ctx), a.n_in > 4 ? a.in[4].as<const float>() : nullptr,
      a.attrs.get("max_norm", 1.0), a.in[0].as<float>(), a.in[1].as<const float>(),
      a.in[2].as<float>(), a.in[3].as<float>(), n);
  launched("adam_kernel");
}

size_t grad_sumsq_ws(const KernelArgs& a) {
  return static_cast<size_t>(partial_blocks(a.in[0].numel())) * sizeof(double);
}

void grad_sumsq(const KernelArgs& a) {
  if (!f32_only(a, "grad_sumsq")) return;
  const int64_t n = a.in[0].numel(), blocks = partial_blocks(n);
  auto* partial = static_cast<double*>(a.workspace);
  const cudaStream_t s = stream_of(a);
  grad_sumsq_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      a.in[0].as<const float>(), n, partial);
  if (!launched("grad_sumsq_partials_kernel")) return;
  grad_sumsq_finish_kernel<<<1, kThreads, 0, s>>>(
      partial, blocks, a.n_in > 1 ? a.in[1].as<const float>() : nullptr, a.out[0].as<float>());
  launched("grad_sumsq_finish_kernel");
}

struct RowsShape {
  int64_t F, O, cap;
};
RowsShape rows_shape(const KernelArgs& a) {
  const bool two = a.in[0].ndim == 2;
  return {two ? a.in[0].shape[0] : 0, two ? a.in[0].shape[1] : 0, a.in[1].numel() - 1};
}

dim3 rows_grid(const RowsShape& s) {
  return dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(s.O, kThreads), 1024)),
              static_cast<unsigned>(std::min<int64_t>(s.cap, 65535)));
}

void sgd_rows(const KernelArgs& a) {
  if (!f32_only(a, "sgd_update_rows")) return;
  const RowsShape s = rows_shape(a);
  if (s.cap <= 0 || s.O == 0 || s.F == 0) return;
  sgd_rows_kernel<<<rows_grid(s), kThreads, 0, stream_of(a)>>>(
      sgd_params(a.attrs, a.ctx), a.in[0].as<float>(), a.in[1].as<const int32_t>(), s.cap,
      a.in[2].as<const float>(), a.in[3].as<float>(), s.F, s.O);
  launched("sgd_rows_kernel");
}

void adam_rows(const KernelArgs& a) {
  if (!f32_only(a, "adam_update_rows")) return;
  const RowsShape s = rows_shape(a);
  if (s.cap <= 0 || s.O == 0 || s.F == 0) return;
  adam_rows_kernel<<<rows_grid(s), kThreads, 0, stream_of(a)>>>(
      adam_params(a.attrs, a.ctx), a.in[0].as<float>(), a.in[1].as<const int32_t>(), s.cap,
      a.in[2].as<const float>(), a.in[3].as<float>(), a.in[4].as<float>(), s.F, s.O);
  launched("adam_rows_kernel");
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_optim_kernels() {
  using namespace cuda;
  return {
      {"grad_sumsq", "cuda", grad_sumsq, grad_sumsq_ws, true, f32_operands},
      {"sgd_update", "cuda", sgd_dense, nullptr, true, f32_operands},
      {"adam_update", "cuda", adam_dense, nullptr, true, f32_operands},
      {"sgd_update_rows", "cuda", sgd_rows, nullptr, true, f32_operands},
      {"adam_update_rows", "cuda", adam_rows, nullptr, true, f32_operands},
  };
}

}  // namespace pooch::kern
