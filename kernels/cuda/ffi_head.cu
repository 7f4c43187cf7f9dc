// CUDA kernels of the fused fixed fan-in output layer (ffi_loss,
// ffi_loss_grad, ffi_topk; runtime/core/ops/ffi_head_ops.cpp), f32.
//
// As on the CPU, no [B, L] logits exist. The input is transposed once to
// hT[H][Bp] (Bp: the batch rounded up to 4, the pad zero). The loss and its
// gradient use the unfused kernels' layout (sparse.cu, ffi_linear): a group
// of 8 lanes owns one label, each lane 4 batch rows of a 32-row chunk, so a
// connection's 32 rows are one 128-byte line read as a float4 per lane. Each
// logit turns at once into its loss term and gradient; dw[l,:] and db[l]
// are summed over the group's lanes in a fixed butterfly (one writer per
// label); dh is added by red.global into dhT, a group's 32 consecutive
// floats a request (not deterministic; the "label-slices" variant sums dh in
// fixed label slices instead). The first version gave a thread a label and
// walked the batch row by row, a warp's 32 loads then hitting 32 rows of hT:
// 43.3 of a 43.8 ms Amazon-670K step on an H200 (docs/BENCHMARKS.md).
// Targets: a row's labels are few, so a logit's target is looked up by a scan
// of its row's list.
//
// Softmax first needs each row's log-sum-exp over all labels: a block per row
// and range of labels (two passes: the maximum, then the sum), then a thread
// per row combines its ranges.
//
// ffi_loss_grad's loss output (with_loss) is summed by the gradient kernel
// from the logits it forms anyway, on ffi_loss's grid and in its order, so
// the two ops give the same bits and a train step forms its logits once.
//
// ffi_topk: a block per row and range of labels; each thread keeps its own
// top k (k at most kTopK) of the labels it strides over, thread 0 merges
// them into the range's candidates, and a thread per row merges its ranges.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>

#include "../common/supports.h"
#include "common.cuh"

namespace pooch::kern {
namespace cuda {
namespace {

constexpr int64_t kTopK = 16;
constexpr int kPartials = 1024;
// A label's group: 8 lanes, each 4 batch rows of a 32-row chunk.
constexpr int kGroup = 8;
constexpr int kChunk = 32;

struct Layer {
  const float* ht;  // [H][bp], rows bp > batch zero
  const void* index;
  bool i32;
  const float* w;
  const float* bias;
  int64_t batch, hidden, labels, fan_in;
  int64_t bp;  // batch rounded up to 4
};

int64_t padded_batch(int64_t batch) {
  return (batch + 3) / 4 * 4;
}

__device__ __forceinline__ int64_t index_at(const Layer& y, int64_t slot) {
  return y.i32 ? int64_t{static_cast<const int32_t*>(y.index)[slot]}
               : int64_t{static_cast<const uint16_t*>(y.index)[slot]};
}

__device__ __forceinline__ float logit(const Layer& y, int64_t l, int64_t r) {
  float acc = 0.0f;
  for (int64_t k = 0; k < y.fan_in; ++k)
    acc = fmaf(y.w[l * y.fan_in + k], y.ht[index_at(y, l * y.fan_in + k) * y.bp + r], acc);
  return acc + y.bias[l];
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// Label l's logits of batch rows b..b+3 (b < bp, a multiple of 4): the same
// products in the same order as logit(), so the same bits.
__device__ __forceinline__ float4 logits4(const Layer& y, int64_t l, int64_t b) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t base = l * y.fan_in;
#pragma unroll 4
  for (int64_t k = 0; k < y.fan_in; ++k) {
    const float wk = y.w[base + k];
    const float4 x = load4(y.ht + index_at(y, base + k) * y.bp + b);
    acc.x = fmaf(wk, x.x, acc.x);
    acc.y = fmaf(wk, x.y, acc.y);
    acc.z = fmaf(wk, x.z, acc.z);
    acc.w = fmaf(wk, x.w, acc.w);
  }
  const float bl = y.bias[l];
  return make_float4(acc.x + bl, acc.y + bl, acc.z + bl, acc.w + bl);
}

__device__ __forceinline__ float lane_of(const float4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ bool is_target(const int32_t* lptr, const int32_t* lidx, int64_t r,
                                          int64_t l) {
  for (int32_t j = lptr[r]; j < lptr[r + 1]; ++j)
    if (lidx[j] == l) return true;
  return false;
}

__device__ __forceinline__ float max0(float v) {
  return v < 0.0f ? 0.0f : v;
}

__device__ __forceinline__ float term(float x, float t, int kind) {
  if (kind == 0) return max0(x) - x * t + log1pf(expf(-fabsf(x)));
  const float m = max0(1.0f - (2.0f * t - 1.0f) * x);
  return m * m;
}

__device__ __forceinline__ float grad_of(float x, float t, int kind) {
  if (kind == 0) {
    const float e = expf(-fabsf(x));
    const float s = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return s - t;
  }
  return -2.0f * (2.0f * t - 1.0f) * max0(1.0f - (2.0f * t - 1.0f) * x);
}

// ht[u][r] = h[r][u], and 0 in the pad rows r >= batch.
__global__ void transpose_in(const float* h, int64_t batch, int64_t bp, int64_t hidden, float* ht) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bp * hidden;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / hidden, u = i % hidden;
    ht[u * bp + r] = r < batch ? h[i] : 0.0f;
  }
}

// ffi_topk and softmax's log-sum-exp split a row's labels into ranges, a
// block per row and range, so that a batch of 32 rows fills more than 32
// multiprocessors (one block per row before). A function of the label
// count alone, so the bits do not depend on the device.
constexpr int64_t kLabelsPerRange = 8192;
constexpr int64_t kMaxRanges = 64;

int64_t label_ranges(int64_t labels) {
  return std::clamp<int64_t>(ceil_div(labels, kLabelsPerRange), 1, kMaxRanges);
}

// Block (r, s): range s of row r's labels, threads striding over them, in
// two passes: the maximum (its shift: 0 where not finite), then Σ exp(x −
// shift), into shift[r·ranges + s] and sum[r·ranges + s].
__global__ void lse_ranges(Layer y, int64_t ranges, double* shifts, double* sums) {
  __shared__ double scratch[33];
  __shared__ double mx;
  const int64_t r = blockIdx.x, rs = blockIdx.y;
  const int64_t l0 = y.labels * rs / ranges, l1 = y.labels * (rs + 1) / ranges;
  double m = -INFINITY;
  for (int64_t l = l0 + threadIdx.x; l < l1; l += blockDim.x) m = fmax(m, double(logit(y, l, r)));
  // Block maximum through the sum helper's layout: a max tree of our own.
  for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_down_sync(kFullMask, m, o));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    double b = -INFINITY;
    for (int i = 0; i < int(blockDim.x >> 5); ++i) b = fmax(b, scratch[i]);
    mx = b;
  }
  __syncthreads();
  const double shift = isfinite(mx) ? mx : 0.0;
  double s = 0;
  for (int64_t l = l0 + threadIdx.x; l < l1; l += blockDim.x)
    s += exp(double(logit(y, l, r)) - shift);
  s = block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  // A range whose largest logit is +inf keeps that as its shift, so that the
  // merge gives the row +inf, as the CPU kernel and the reference do (its
  // sum, taken at a shift of 0, is inf or NaN).
  shifts[r * ranges + rs] = mx == INFINITY ? mx : shift;
  sums[r * ranges + rs] = s;
}

// lse[r] from its ranges (a thread per row, the ranges in order): +inf where
// a range's largest logit is +inf; else the largest shift of a range with a
// positive sum, M, and M + log Σ sum·exp(shift − M). No such range: log 0 =
// −inf; a NaN sum carries through. The grid may hold fewer threads than rows
// (grid_for caps it): each takes every grid-th row.
__global__ void lse_merge(int64_t rows, int64_t ranges, const double* shifts, const double* sums,
                          double* lse) {
  POOCH_GRID_STRIDE(r, rows) {
    const double* sh = shifts + r * ranges;
    const double* su = sums + r * ranges;
    double top = -INFINITY;
    bool infinite = false;
    for (int64_t i = 0; i < ranges; ++i) {
      infinite = infinite || sh[i] == INFINITY;
      if (su[i] > 0) top = fmax(top, sh[i]);
    }
    if (infinite) {
      lse[r] = INFINITY;
      continue;
    }
    if (!isfinite(top)) top = 0;
    double total = 0;
    for (int64_t i = 0; i < ranges; ++i)
      if (su[i] != 0) total += su[i] * exp(sh[i] - top);  // an empty range adds no 0·inf
    lse[r] = top + log(total);
  }
}

// A logit's part of the loss sum: its term (bce, squared hinge), or for
// softmax minus the logit of a target (the lse part is added per row).
__device__ __forceinline__ double loss_part(float x, bool t, int kind) {
  if (kind == 2) return t ? -double(x) : 0.0;
  return double(term(x, t ? 1.0f : 0.0f, kind));
}

// The scaled gradient of the loss with respect to logit x = (r, l), t
// whether l is one of row r's labels.
__device__ __forceinline__ float logit_grad(const int32_t* lptr, int kind, float scale,
                                            const double* lse, float x, bool t, int64_t r) {
  const float tf = t ? 1.0f : 0.0f;
  float g;
  if (kind == 2)
    g = float(exp(double(x) - lse[r]) * double(lptr[r + 1] - lptr[r])) - tf;
  else
    g = grad_of(x, tf, kind);
  return g * scale;
}

// The loss grid: label l belongs to group l mod (blocks · kThreads / kGroup);
// each lane adds its loss parts in label, chunk, row order. loss_grad runs on
// the same grid and adds the same parts in the same order.
int loss_blocks(int64_t labels) {
  return static_cast<int>(
      std::clamp<int64_t>(ceil_div(labels * kGroup, kThreads), 1, int64_t{kPartials}));
}

// This thread's group (one label at a time), the number of groups in the
// grid, its lane within the group and the group's shuffle mask.
struct GroupLane {
  int64_t group, groups;
  int gl;
  unsigned mask;
};

__device__ __forceinline__ GroupLane group_lane() {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int lane = static_cast<int>(threadIdx.x & 31);
  return {t / kGroup, int64_t{gridDim.x} * blockDim.x / kGroup, lane % kGroup,
          0xFFu << (lane / kGroup * kGroup)};
}

__device__ __forceinline__ float group_sum(float v, unsigned mask) {
  for (int o = kGroup / 2; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

// Per block: the sum of its labels' loss parts into partial[blockIdx.x].
__global__ void loss_partials(Layer y, const int32_t* lptr, const int32_t* lidx, int kind,
                              double* partial) {
  __shared__ double scratch[33];
  const GroupLane g = group_lane();
  double acc = 0;
  for (int64_t l = g.group; l < y.labels; l += g.groups)
    for (int64_t b = g.gl * 4; b < y.bp; b += kChunk) {
      const float4 x = logits4(y, l, b);
      for (int j = 0; j < 4 && b + j < y.batch; ++j) {
        const bool t = is_target(lptr, lidx, b + j, l);
        if (kind != 2 || t) acc += loss_part(lane_of(x, j), t, kind);
      }
    }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// The mean over the batch; softmax adds |targets| * lse for its lse_rows rows
// (0 when there are no labels, hence no logits).
__global__ void loss_total(const double* partial, int n, const double* lse, const int32_t* lptr,
                           int64_t lse_rows, int64_t batch, float* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0;
  for (int i = 0; i < n; ++i) s += partial[i];
  // Only rows with targets: 0·lse would be NaN where lse is not finite.
  for (int64_t r = 0; r < lse_rows; ++r)
    if (lptr[r + 1] > lptr[r]) s += double(lptr[r + 1] - lptr[r]) * lse[r];
  *out = batch > 0 ? float(s / double(batch)) : 0.0f;
}

// A group per label: dw[l,:] and db[l] summed over the group's lanes (one
// writer: lane k mod 8 writes dw[l,k]); dh by adds when dht is given (the
// deterministic variant computes dh apart, below). A row whose gradient is
// zero adds nothing (no 0·Inf), and a chunk where all are zero is skipped.
// With partial, each block also adds its labels' loss parts, as
// loss_partials does on the same grid (loss_blocks): the loss without a
// second pass over the logits.
__global__ void loss_grad(Layer y, const int32_t* lptr, const int32_t* lidx, int kind, float scale,
                          const double* lse, float* dht, float* dw, float* db, double* partial) {
  __shared__ double scratch[33];
  const GroupLane g = group_lane();
  // One pass even with no rows, so that dw is still written (zeros).
  const int64_t chunks = y.batch > 0 ? (y.batch + kChunk - 1) / kChunk : 1;
  double loss = 0;
  for (int64_t l = g.group; l < y.labels; l += g.groups) {
    const int64_t base = l * y.fan_in;
    float gb = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk + g.gl * 4;
      float gr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (b < y.bp) {
        const float4 x = logits4(y, l, b);
        for (int j = 0; j < 4 && b + j < y.batch; ++j) {
          const float xj = lane_of(x, j);
          const bool t = is_target(lptr, lidx, b + j, l);
          if (partial && (kind != 2 || t)) loss += loss_part(xj, t, kind);
          gr[j] = logit_grad(lptr, kind, scale, lse, xj, t, b + j);
        }
      }
      gb += (gr[0] + gr[1]) + (gr[2] + gr[3]);
      const bool live = gr[0] != 0.0f || gr[1] != 0.0f || gr[2] != 0.0f || gr[3] != 0.0f;
      if (!__any_sync(g.mask, live)) {
        if (c == 0)
          for (int64_t k = g.gl; k < y.fan_in; k += kGroup) dw[base + k] = 0.0f;
        continue;
      }
      for (int64_t k = 0; k < y.fan_in; ++k) {
        const int64_t u = index_at(y, base + k);
        float p = 0.0f;
        if (live) {
          const float4 x = load4(y.ht + u * y.bp + b);
          float* d = dht ? dht + u * y.bp + b : nullptr;
          const float wk = y.w[base + k];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (gr[j] == 0.0f) continue;
            p = fmaf(gr[j], lane_of(x, j), p);
            if (d) atomicAdd(d + j, gr[j] * wk);
          }
        }
        p = group_sum(p, g.mask);
        if (g.gl == (k & (kGroup - 1))) dw[base + k] = c == 0 ? p : dw[base + k] + p;
      }
    }
    gb = group_sum(gb, g.mask);
    if (g.gl == 0) db[l] = gb;
  }
  if (partial == nullptr) return;  // the same for the whole grid
  loss = block_sum(loss, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = loss;
}

// Deterministic dh, as the CPU kernel does it: the labels fall into
// `slices` fixed ranges; thread (s, r) walks slice s's labels in order for
// row r and adds into its own partial sums part[s][u][r] (one writer per
// cell); dh_sum then adds the slices in order. No atomics, so the same bits
// every run, at the price of recomputing the logits once more. The threads
// are slices × rows, so the slices must be many to fill the device: 8 (the
// first version) made 256 threads at batch 32, and the step of a 167 k-label
// head took 193 ms on an H200, 99.8% of it here. As many slices as
// kDhPartialBytes of partial sums allow, 8 to 1024: a function of the shape
// alone, so the bits do not depend on the device.
constexpr size_t kDhPartialBytes = size_t{64} << 20;

int64_t dh_slice_count(int64_t bp, int64_t hidden) {
  const int64_t per_slice = std::max<int64_t>(1, bp * hidden) * int64_t{sizeof(float)};
  return std::clamp<int64_t>(static_cast<int64_t>(kDhPartialBytes) / per_slice, 8, 1024);
}

__global__ void dh_slices(Layer y, const int32_t* lptr, const int32_t* lidx, int kind, float scale,
                          const double* lse, int64_t slices, float* part) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < slices * y.batch;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = i / y.batch, r = i % y.batch;
    const int64_t l0 = y.labels * s / slices, l1 = y.labels * (s + 1) / slices;
    float* p = part + s * y.hidden * y.bp;
    for (int64_t l = l0; l < l1; ++l) {
      const float g =
          logit_grad(lptr, kind, scale, lse, logit(y, l, r), is_target(lptr, lidx, r, l), r);
      if (g == 0.0f) continue;
      for (int64_t k = 0; k < y.fan_in; ++k)
        p[index_at(y, l * y.fan_in + k) * y.bp + r] += g * y.w[l * y.fan_in + k];
    }
  }
}

// dh[r, u] = the slices' partial sums, added in slice order.
__global__ void dh_sum(const float* part, int64_t slices, int64_t batch, int64_t bp, int64_t hidden,
                       float* dh) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < batch * hidden;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / hidden, u = i % hidden;
    float acc = 0.0f;
    for (int64_t s = 0; s < slices; ++s) acc += part[(s * hidden + u) * bp + r];
    dh[i] = acc;
  }
}

__global__ void transpose_out(const float* dht, int64_t batch, int64_t bp, int64_t hidden,
                              float* dh) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < batch * hidden;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / hidden, u = i % hidden;
    dh[i] = dht[u * bp + r];
  }
}

// topk's order: larger first, NaN after every number, ties by lower label.
__device__ __forceinline__ bool ranks_above(float u, int64_t iu, float v, int64_t iv) {
  const bool nu = isnan(u), nv = isnan(v);
  if (nu != nv) return nv;
  if (!nu && u != v) return u > v;
  return iu < iv;
}

__device__ __forceinline__ void insert(float v, int64_t l, float* bv, int32_t* bi, int& n, int k) {
  if (n == k && !ranks_above(v, l, bv[n - 1], bi[n - 1])) return;
  int p = n < k ? n++ : k - 1;
  while (p > 0 && ranks_above(v, l, bv[p - 1], bi[p - 1])) {
    bv[p] = bv[p - 1];
    bi[p] = bi[p - 1];
    --p;
  }
  bv[p] = v;
  bi[p] = int32_t(l);
}

// Block (r, s): each thread's own top k of range s in shared memory, merged
// by thread 0 into range s's candidates: cand_v/cand_i[(r·splits + s)·k + j],
// cand_n[r·splits + s] of them.
__global__ void topk_ranges(Layer y, int k, int64_t splits, float* cand_v, int32_t* cand_i,
                            int* cand_n) {
  extern __shared__ unsigned char smem[];
  float* sv = reinterpret_cast<float*>(smem);
  int32_t* si = reinterpret_cast<int32_t*>(sv + blockDim.x * k);
  int* sn = reinterpret_cast<int*>(si + blockDim.x * k);
  const int64_t r = blockIdx.x, s = blockIdx.y;
  const int64_t l0 = y.labels * s / splits, l1 = y.labels * (s + 1) / splits;
  float* bv = sv + threadIdx.x * k;
  int32_t* bi = si + threadIdx.x * k;
  int n = 0;
  for (int64_t l = l0 + threadIdx.x; l < l1; l += blockDim.x)
    insert(logit(y, l, r), l, bv, bi, n, k);
  sn[threadIdx.x] = n;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int64_t at = r * splits + s;
  float* best_v = cand_v + at * k;
  int32_t* best_i = cand_i + at * k;
  int m = 0;
  for (unsigned t = 0; t < blockDim.x; ++t)
    for (int j = 0; j < sn[t]; ++j) insert(sv[t * k + j], si[t * k + j], best_v, best_i, m, k);
  cand_n[at] = m;
}

// Row r (a thread each, every grid-th row where the grid is capped): its
// ranges' candidates merged into its top k.
__global__ void topk_merge(int64_t rows, int k, int64_t splits, const float* cand_v,
                           const int32_t* cand_i, const int* cand_n, float* values,
                           int32_t* indices) {
  POOCH_GRID_STRIDE(r, rows) {
    float best_v[kTopK];
    int32_t best_i[kTopK];
    int m = 0;
    for (int64_t s = 0; s < splits; ++s) {
      const int64_t at = r * splits + s;
      for (int j = 0; j < cand_n[at]; ++j)
        insert(cand_v[at * k + j], cand_i[at * k + j], best_v, best_i, m, k);
    }
    for (int j = 0; j < m; ++j) {
      values[r * k + j] = best_v[j];
      indices[r * k + j] = best_i[j];
    }
  }
}

Layer layer_of(const KernelArgs& a, const float* ht) {
  return {ht,
          a.in[1].data,
          a.in[1].dtype == DType::i32,
          a.in[2].as<float>(),
          a.in[3].as<float>(),
          a.in[0].shape[0],
          a.in[0].shape[1],
          a.in[1].shape[0],
          a.in[1].shape[1],
          padded_batch(a.in[0].shape[0])};
}

struct Scratch {
  float* ht;
  float* dht;
  double* lse;
  double* partial;
  double* lse_shifts;  // softmax: each row's ranges (lse_ranges)
  double* lse_sums;
};

// grad: 0 the loss, 1 the gradient with dh by adds, 2 the deterministic
// gradient (dht holds dh_slice_count partial dh).
Scratch carve(const KernelArgs& a, int grad, std::byte* base, size_t* bytes) {
  const int64_t B = a.in[0].shape[0], H = a.in[0].shape[1], Bp = padded_batch(B);
  Carve c{base};
  Scratch s{};
  s.ht = c.take<float>(static_cast<size_t>(Bp * H));
  s.dht = grad
              ? c.take<float>(static_cast<size_t>(Bp * H * (grad == 2 ? dh_slice_count(Bp, H) : 1)))
              : nullptr;
  s.lse = c.take<double>(static_cast<size_t>(B > 0 ? B : 1));
  s.partial = c.take<double>(kPartials);
  const auto range_cells =
      static_cast<size_t>(std::max<int64_t>(1, B) * label_ranges(a.in[1].shape[0]));
  s.lse_shifts = c.take<double>(range_cells);
  s.lse_sums = c.take<double>(range_cells);
  if (bytes) *bytes = c.used;
  return s;
}

size_t loss_ws(const KernelArgs& a) {
  size_t n = 0;
  carve(a, 0, nullptr, &n);
  return n;
}
size_t loss_grad_ws(const KernelArgs& a) {
  size_t n = 0;
  carve(a, 1, nullptr, &n);
  return n;
}
size_t loss_grad_det_ws(const KernelArgs& a) {
  size_t n = 0;
  carve(a, 2, nullptr, &n);
  return n;
}
// ffi_topk's workspace: hT, then the ranges' candidates.
struct TopkScratch {
  float* ht;
  float* cand_v;
  int32_t* cand_i;
  int* cand_n;
};

TopkScratch carve_topk(const KernelArgs& a, std::byte* base, size_t* bytes) {
  const int64_t B = a.in[0].shape[0], H = a.in[0].shape[1];
  const int64_t cands = B * label_ranges(a.in[1].shape[0]);
  const auto k = static_cast<size_t>(a.out[0].shape[1]);
  Carve c{base};
  TopkScratch t{};
  t.ht = c.take<float>(static_cast<size_t>(padded_batch(B) * H));
  t.cand_v = c.take<float>(static_cast<size_t>(cands) * k);
  t.cand_i = c.take<int32_t>(static_cast<size_t>(cands) * k);
  t.cand_n = c.take<int>(static_cast<size_t>(cands));
  if (bytes) *bytes = c.used;
  return t;
}

size_t topk_ws(const KernelArgs& a) {
  size_t n = 0;
  carve_topk(a, nullptr, &n);
  return n;
}

// The loss into out from the blocks' partial sums in s (and, for softmax,
// the rows' lse): ffi_loss's value, and ffi_loss_grad's last output.
bool launch_loss_total(const Layer& y, const Scratch& s, int kind, const int32_t* lptr,
                       cudaStream_t st, float* out, const char* what) {
  const int64_t lse_rows = kind == 2 && y.labels > 0 ? y.batch : 0;
  loss_total<<<1, 32, 0, st>>>(s.partial, loss_blocks(y.labels), s.lse, lptr, lse_rows, y.batch,
                               out);
  return launched(what);
}

// Each row's log-sum-exp over every label into s.lse (softmax).
bool launch_lse(const Layer& y, const Scratch& s, cudaStream_t st) {
  const int64_t ranges = label_ranges(y.labels);
  const dim3 grid(static_cast<unsigned>(y.batch), static_cast<unsigned>(ranges));
  lse_ranges<<<grid, kThreads, 0, st>>>(y, ranges, s.lse_shifts, s.lse_sums);
  if (!launched("ffi lse_ranges")) return false;
  lse_merge<<<grid_for(y.batch, kThreads), kThreads, 0, st>>>(y.batch, ranges, s.lse_shifts,
                                                              s.lse_sums, s.lse);
  return launched("ffi lse_merge");
}

// hT (and its zero pad rows) from the layer's input into y.ht.
bool launch_transpose_in(const KernelArgs& a, const Layer& y, cudaStream_t st, const char* what) {
  if (y.bp * y.hidden == 0) return true;
  transpose_in<<<grid_for(y.bp * y.hidden, kThreads), kThreads, 0, st>>>(
      a.in[0].as<float>(), y.batch, y.bp, y.hidden, const_cast<float*>(y.ht));
  return launched(what);
}

void ffi_loss(const KernelArgs& a) {
  if (!f32_only(a, "ffi_loss")) return;
  cudaStream_t st = stream_of(a);
  const Scratch s = carve(a, 0, static_cast<std::byte*>(a.workspace), nullptr);
  const Layer y = layer_of(a, s.ht);
  const int kind = static_cast<int>(a.attrs.geti("loss", 0));
  const auto* lptr = a.in[4].as<int32_t>();
  const auto* lidx = a.in[5].as<int32_t>();
  if (!launch_transpose_in(a, y, st, "ffi_loss transpose")) return;
  if (kind == 2 && y.batch > 0 && y.labels > 0 && !launch_lse(y, s, st)) return;
  loss_partials<<<loss_blocks(y.labels), kThreads, 0, st>>>(y, lptr, lidx, kind, s.partial);
  if (!launched("ffi_loss partials")) return;
  launch_loss_total(y, s, kind, lptr, st, a.out[0].as<float>(), "ffi_loss total");
}

// deterministic: dh from dh_slices + dh_sum instead of atomic adds.
void loss_grad_launch(const KernelArgs& a, bool deterministic) {
  if (!f32_only(a, "ffi_loss_grad")) return;
  cudaStream_t st = stream_of(a);
  const Scratch s = carve(a, deterministic ? 2 : 1, static_cast<std::byte*>(a.workspace), nullptr);
  const Layer y = layer_of(a, s.ht);
  const int kind = static_cast<int>(a.attrs.geti("loss", 0));
  const auto* lptr = a.in[4].as<int32_t>();
  const auto* lidx = a.in[5].as<int32_t>();
  const float scale =
      y.batch > 0 ? static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(y.batch))
                  : 0.0f;
  const size_t bh = static_cast<size_t>(y.bp * y.hidden) * sizeof(float);
  const int64_t slices = dh_slice_count(y.bp, y.hidden);
  if (bh > 0) {
    if (!launch_transpose_in(a, y, st, "ffi_loss_grad transpose")) return;
    if (!cuda_ok(
            cudaMemsetAsync(s.dht, 0, bh * static_cast<size_t>(deterministic ? slices : 1), st),
            "cudaMemsetAsync"))
      return;
  }
  if (kind == 2 && y.batch > 0 && y.labels > 0 && !launch_lse(y, s, st)) return;
  const bool with_loss = a.n_out > 3;
  if (y.labels > 0 || with_loss) {
    // With no labels, the loss grid's one block writes its zero partial.
    loss_grad<<<loss_blocks(y.labels), kThreads, 0, st>>>(
        y, lptr, lidx, kind, scale, s.lse, deterministic ? nullptr : s.dht, a.out[1].as<float>(),
        a.out[2].as<float>(), with_loss ? s.partial : nullptr);
    if (!launched("ffi_loss_grad")) return;
  }
  if (deterministic && bh > 0 && y.labels > 0) {
    dh_slices<<<grid_for(slices * y.batch, kThreads), kThreads, 0, st>>>(y, lptr, lidx, kind, scale,
                                                                         s.lse, slices, s.dht);
    if (!launched("ffi_loss_grad dh_slices")) return;
  }
  if (bh > 0 && deterministic) {
    dh_sum<<<grid_for(y.batch * y.hidden, kThreads), kThreads, 0, st>>>(
        s.dht, slices, y.batch, y.bp, y.hidden, a.out[0].as<float>());
    if (!launched("ffi_loss_grad dh_sum")) return;
  } else if (bh > 0) {
    transpose_out<<<grid_for(y.batch * y.hidden, kThreads), kThreads, 0, st>>>(
        s.dht, y.batch, y.bp, y.hidden, a.out[0].as<float>());
    if (!launched("ffi_loss_grad transpose back")) return;
  }
  if (with_loss)
    launch_loss_total(y, s, kind, lptr, st, a.out[3].as<float>(), "ffi_loss_grad loss total");
}

void ffi_loss_grad(const KernelArgs& a) {
  loss_grad_launch(a, false);
}
void ffi_loss_grad_det(const KernelArgs& a) {
  loss_grad_launch(a, true);
}

void ffi_topk(const KernelArgs& a) {
  if (!f32_only(a, "ffi_topk")) return;
  cudaStream_t st = stream_of(a);
  const TopkScratch t = carve_topk(a, static_cast<std::byte*>(a.workspace), nullptr);
  const Layer y = layer_of(a, t.ht);
  const int k = static_cast<int>(a.out[0].shape[1]);
  if (y.batch == 0) return;
  if (!launch_transpose_in(a, y, st, "ffi_topk transpose")) return;
  const int threads = 128;
  const size_t shared =
      static_cast<size_t>(threads) * (k * (sizeof(float) + sizeof(int32_t)) + sizeof(int));
  const int64_t splits = label_ranges(y.labels);
  const dim3 grid(static_cast<unsigned>(y.batch), static_cast<unsigned>(splits));
  topk_ranges<<<grid, threads, shared, st>>>(y, k, splits, t.cand_v, t.cand_i, t.cand_n);
  if (!launched("ffi_topk ranges")) return;
  topk_merge<<<grid_for(y.batch, kThreads), kThreads, 0, st>>>(
      y.batch, k, splits, t.cand_v, t.cand_i, t.cand_n, a.out[0].as<float>(),
      a.out[1].as<int32_t>());
  launched("ffi_topk merge");
}

bool supports(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype) && a.in[0].shape[0] <= INT_MAX;
}
bool supports_topk(const KernelArgs& a) {
  return supports(a) && a.out[0].shape[1] <= kTopK && a.in[1].shape[0] <= INT_MAX;
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_ffi_head_kernels() {
  using namespace cuda;
  return {
      {"ffi_loss", "label-group", ffi_loss, loss_ws, true, supports},
      {"ffi_loss_grad", "label-group", ffi_loss_grad, loss_grad_ws, false, supports},
      {"ffi_loss_grad", "label-slices", ffi_loss_grad_det, loss_grad_det_ws, true, supports},
      {"ffi_topk", "row-ranges", ffi_topk, topk_ws, true, supports_topk},
  };
}

}  // namespace pooch::kern
