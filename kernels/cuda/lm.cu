// CUDA kernels of the language-model family (docs/OPS.md, "Language
// models"), f32, all deterministic.
//
// Embedding gradients sort the positions by token id (CUB's radix sort is
// stable, so each id's positions stay in order) and sum each id's run of
// rows in that order: no atomics. Attention is flash-attention-style: one
// warp per query (or key) row, K/V (or Q/dY) tiles of 32 rows in shared
// memory, each lane scoring one row of the tile, an online softmax, so no
// T×T matrix is ever in memory; the backward pass recomputes the
// probabilities from the saved log-sum-exp, one kernel for dQ and one for
// dK and dV (each row accumulated by its own warp in a fixed order). The lm
// head runs cuBLAS GEMMs over [rows block × vocabulary chunk] tiles with the
// softmax statistics updated chunk by chunk.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "../common/supports.h"
#include "common.cuh"
#include "cuda_libs.h"

namespace pooch::kern {
namespace cuda {
namespace {

cublasHandle_t cublas_handle(const char* op) {
  LaunchEnv* e = current_launch_env();
  if (e == nullptr || e->cublas == nullptr) {
    report("%s: no cuBLAS handle (launched outside a CUDA backend)", op);
    return nullptr;
  }
  return static_cast<cublasHandle_t>(e->cublas);
}

// C[m×n] (column-major, ldc) = op(A)·op(B) (+ C when accumulate).
bool sgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
           int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, bool accumulate,
           float* C, int64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  // cuBLAS refuses a leading dimension below 1 even where the matrix is
  // empty (k = 0: C is then 0, or left as it is when accumulating).
  lda = std::max<int64_t>(lda, 1);
  ldb = std::max<int64_t>(ldb, 1);
  ldc = std::max<int64_t>(ldc, 1);
  const cublasStatus_t st = cuda_libs().cublasSgemm(
      h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, A,
      static_cast<int>(lda), B, static_cast<int>(ldb), accumulate ? &one : &zero, C,
      static_cast<int>(ldc));
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  report("cublasSgemm: %s", cuda_libs().cublasGetStatusString(st));
  return false;
}

__device__ __forceinline__ bool valid_id(int32_t id, int64_t V) {
  return id >= 0 && id < V;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// ---- embeddings ---------------------------------------------------------------

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const float* __restrict__ w,
                                 int64_t N, int64_t V, int64_t C, float* __restrict__ y) {
  POOCH_GRID_STRIDE(i, N * C) {
    const int32_t id = ids[i / C];
    y[i] = valid_id(id, V) ? w[id * C + i % C] : 0.0f;
  }
}

void embedding(const KernelArgs& a) {
  if (!f32_only(a, "embedding")) return;
  const int64_t N = a.in[0].numel(), V = a.in[1].dim(0), C = a.in[1].dim(1);
  if (N * C == 0) return;
  embedding_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream_of(a)>>>(
      a.in[0].as<const int32_t>(), a.in[1].as<const float>(), N, V, C, a.out[0].as<float>());
  launched("embedding_kernel");
}

struct EmbedLayout {
  int32_t* slot;  // [V]: the row of the gradient each id goes to (-1: none)
  uint32_t* keys[2];
  int32_t* vals[2];
  void* temp;
  size_t temp_bytes;
  size_t total;
};

size_t sort_temp_bytes(const LaunchEnv* e, int64_t n, int end_bit) {
  size_t bytes = 0;
  if (n > 0 && n < INT_MAX && device_query(e, [&] {
        cub::DoubleBuffer<uint32_t> k(nullptr, nullptr);
        cub::DoubleBuffer<int32_t> v(nullptr, nullptr);
        return cub::DeviceRadixSort::SortPairs(nullptr, bytes, k, v, static_cast<int>(n), 0,
                                               end_bit);
      }))
    return bytes;
  return (size_t{2} << 20) + 16 * static_cast<size_t>(n);  // a bound when no device answers
}

EmbedLayout embed_layout(std::byte* base, int64_t V, int64_t N, size_t temp) {
  Carve c{base};
  EmbedLayout L{};
  L.slot = c.take<int32_t>(static_cast<size_t>(V));
  for (int i = 0; i < 2; ++i) L.keys[i] = c.take<uint32_t>(static_cast<size_t>(N));
  for (int i = 0; i < 2; ++i) L.vals[i] = c.take<int32_t>(static_cast<size_t>(N));
  L.temp = c.take<std::byte>(temp);
  L.temp_bytes = temp;
  L.total = c.used;
  return L;
}

int64_t vocab_of(const KernelArgs& a) {
  return a.attrs.geti("vocab", 0);
}

size_t embedding_grad_ws(const KernelArgs& a) {
  const int64_t N = a.in[0].numel(), V = vocab_of(a);
  const LaunchEnv* e = static_cast<const LaunchEnv*>(a.device);
  return embed_layout(nullptr, V, N, sort_temp_bytes(e, N, bits_for(V))).total;
}

bool embedding_grad_supported(const KernelArgs& a) {
  return f32_operands(a) && a.in[0].numel() < INT_MAX && vocab_of(a) < INT_MAX;
}

__global__ void sort_keys_kernel(const int32_t* __restrict__ ids, int64_t N, int64_t V,
                                 uint32_t* __restrict__ keys, int32_t* __restrict__ vals) {
  POOCH_GRID_STRIDE(p, N) {
    const int32_t id = ids[p];
    keys[p] = valid_id(id, V) ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
    vals[p] = static_cast<int32_t>(p);
  }
}

__global__ void mark_kernel(const int32_t* __restrict__ ids, int64_t N, int64_t V,
                            int32_t* __restrict__ slot) {
  POOCH_GRID_STRIDE(p, N) {
    if (valid_id(ids[p], V)) slot[ids[p]] = 1;
  }
}

// One block numbers the marked ids in ascending order: slot[v] becomes the
// row (or -1), rows[1 + row] = v, rows[0] = the count.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads)
    number_rows_kernel(int32_t* __restrict__ slot, int64_t V, int32_t* __restrict__ rows) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int32_t base;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int64_t v0 = 0; v0 < V; v0 += kScanThreads) {
    const int64_t v = v0 + threadIdx.x;
    const int32_t flag = v < V && slot[v] == 1 ? 1 : 0;
    int32_t pos = 0, total = 0;
    Scan(tmp).ExclusiveSum(flag, pos, total);
    if (v < V) {
      slot[v] = flag ? base + pos : -1;
      if (flag) rows[1 + base + pos] = static_cast<int32_t>(v);
    }
    __syncthreads();
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) rows[0] = base;
}

// Block b handles sorted position b when it starts a run of one id: sums
// dy over the run, in position order, into its row (slot[id], or id itself
// when slot is null). Every listed row holds at least one position, so
// every row [0, n) of a row-sparse gradient is written here.
__global__ void run_sums_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ vals,
                                int64_t N, int64_t V, int64_t C, const int32_t* __restrict__ slot,
                                const float* __restrict__ dy, float* __restrict__ g) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (key >= V || (i > 0 && keys[i - 1] == key)) continue;
    const int64_t row = slot ? slot[key] : static_cast<int64_t>(key);
    int64_t end = i + 1;
    while (end < N && keys[end] == key) ++end;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = i; j < end; ++j) acc += dy[static_cast<int64_t>(vals[j]) * C + c];
      g[row * C + c] = acc;
    }
  }
}

void embedding_grad(const KernelArgs& a, bool sparse) {
  const char* op = sparse ? "embedding_grad_rows" : "embedding_grad_dense";
  if (!f32_only(a, op)) return;
  const int32_t* ids = a.in[0].as<const int32_t>();
  const float* dy = a.in[1].as<const float>();
  const int64_t N = a.in[0].numel(), C = a.in[1].cols(), V = vocab_of(a);
  const cudaStream_t s = stream_of(a);
  const int end_bit = bits_for(V);
  const size_t temp = sort_temp_bytes(launch_env_of(a), N, end_bit);
  const EmbedLayout L = embed_layout(static_cast<std::byte*>(a.workspace), V, N, temp);
  if (L.total > a.workspace_bytes) {
    report("%s: needs %zu workspace bytes, has %zu", op, L.total, a.workspace_bytes);
    return;
  }
  int32_t* rows = sparse ? a.out[0].as<int32_t>() : nullptr;
  float* g = a.out[sparse ? 1 : 0].as<float>();
  if (sparse) {
    if (!cuda_ok(cudaMemsetAsync(L.slot, 0, static_cast<size_t>(V) * 4, s), "cudaMemsetAsync"))
      return;
    if (N > 0) {
      mark_kernel<<<grid_for(N, kThreads), kThreads, 0, s>>>(ids, N, V, L.slot);
      if (!launched("mark_kernel")) return;
    }
    number_rows_kernel<<<1, kScanThreads, 0, s>>>(L.slot, V, rows);
    if (!launched("number_rows_kernel")) return;
  } else if (V * C > 0) {
    if (!cuda_ok(cudaMemsetAsync(g, 0, static_cast<size_t>(V * C) * 4, s), "cudaMemsetAsync"))
      return;
  }
  if (N == 0 || C == 0) return;
  sort_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, s>>>(ids, N, V, L.keys[0], L.vals[0]);
  if (!launched("sort_keys_kernel")) return;
  cub::DoubleBuffer<uint32_t> keys(L.keys[0], L.keys[1]);
  cub::DoubleBuffer<int32_t> vals(L.vals[0], L.vals[1]);
  size_t tb = L.temp_bytes;
  if (!cuda_ok(cub::DeviceRadixSort::SortPairs(L.temp, tb, keys, vals, static_cast<int>(N), 0,
                                               end_bit, s),
               "cub::DeviceRadixSort::SortPairs"))
    return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(N, int64_t{sm_count()} * 64));
  run_sums_kernel<<<blocks, 128, 0, s>>>(keys.Current(), vals.Current(), N, V, C,
                                         sparse ? L.slot : nullptr, dy, g);
  launched("run_sums_kernel");
}

void embedding_grad_rows(const KernelArgs& a) {
  embedding_grad(a, true);
}
void embedding_grad_dense(const KernelArgs& a) {
  embedding_grad(a, false);
}

// ---- GELU, tanh form ------------------------------------------------------------

constexpr float kGeluK = 0.7978845608f;
constexpr float kGeluA = 0.044715f;

// 0.5·(1 + tanh(u)) is σ(2u), as the CPU kernel writes it: 1 + tanh(u) and
// 1 − tanh²(u) cancel for u below about −4 (float tanh within a few ulps of
// −1), where the gradient came out 5.5e-7 off in a host emulation of the
// tanh form against the checker's 3e-6.
__device__ __forceinline__ float gelu_sigmoid(float v) {
  return 1.0f / (1.0f + expf(-2.0f * kGeluK * (v + kGeluA * v * v * v)));
}

__global__ void gelu_tanh_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ y) {
  POOCH_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v * gelu_sigmoid(v);
  }
}

// With s = σ(2u) = 0.5·(1 + tanh u): 0.5·(1 − tanh² u) = 2·s·(1 − s).
__global__ void gelu_tanh_grad_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                      int64_t n, float* __restrict__ dx) {
  POOCH_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float s = gelu_sigmoid(v);
    dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * kGeluK * (1.0f + 3.0f * kGeluA * v * v));
  }
}

void gelu_tanh(const KernelArgs& a) {
  if (!f32_only(a, "gelu_tanh")) return;
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  gelu_tanh_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(a)>>>(a.in[0].as<const float>(),
                                                                         n, a.out[0].as<float>());
  launched("gelu_tanh_kernel");
}

void gelu_tanh_grad(const KernelArgs& a) {
  if (!f32_only(a, "gelu_tanh_grad")) return;
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  gelu_tanh_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(a)>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), n, a.out[0].as<float>());
  launched("gelu_tanh_grad_kernel");
}

// ---- causal attention, flash style -------------------------------------------------

constexpr int kWarps = 8;      // rows per block: one per warp
constexpr int kTile = 32;      // rows of the other side per shared tile: one per lane
constexpr int kMaxHead = 128;  // head widths up to 4 values per lane
constexpr int kPer = kMaxHead / 32;

struct AttnGeom {
  int64_t B, T, C, H, D;
  float scale;
};

AttnGeom attn_geom(const TensorView& qkv, const KernelAttrs& attrs) {
  AttnGeom g{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, attrs.geti("heads", 1), 0, 0};
  g.D = g.C / g.H;
  g.scale = 1.0f / sqrtf(static_cast<float>(g.D));
  return g;
}

bool attention_supported(const KernelArgs& a) {
  const int qkv = a.n_in == 1 ? 0 : 1;
  const AttnGeom g = attn_geom(a.in[qkv], a.attrs);
  return f32_operands(a) && g.D <= kMaxHead && g.B * g.H <= 65535 && g.T < INT_MAX / 2;
}

// Copies `rows` rows of width D starting at row t0 (stride ld between rows)
// into shared memory with row stride D+1 (no bank conflicts when lanes read
// down a column); rows past T are zero.
__device__ void load_tile(float* sh, const float* base, int64_t ld, int64_t t0, int rows, int64_t T,
                          int64_t D) {
  for (int64_t i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int64_t r = i / D, d = i % D;
    sh[r * (D + 1) + d] = t0 + r < T ? base[(t0 + r) * ld + d] : 0.0f;
  }
}

__device__ __forceinline__ float dot_sh(const float* a, const float* b, int64_t D) {
  float s = 0.0f;
  for (int64_t d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

// grid (ceil(T / kWarps), B·H); shared: own Q rows (kWarps) + K and V tiles.
__global__ void attn_fwd_kernel(const float* __restrict__ qkv, AttnGeom g, float* __restrict__ y,
                                float* __restrict__ lse) {
  extern __shared__ float sh[];
  const int64_t D = g.D, S = D + 1;
  float* sq = sh;
  float* sk = sq + kWarps * S;
  float* sv = sk + kTile * S;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t i0 = int64_t{blockIdx.x} * kWarps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = i0 + warp;
  const int64_t ld = 3 * g.C;
  const float* base = qkv + b * g.T * ld + h * g.D;
  load_tile(sq, base, ld, i0, kWarps, g.T, D);
  float m = -INFINITY, l = 0.0f, acc[kPer] = {};
  const int64_t last = min(i0 + kWarps, g.T);  // keys the block's rows can see: [0, last)
  for (int64_t j0 = 0; j0 < last; j0 += kTile) {
    __syncthreads();
    load_tile(sk, base + g.C, ld, j0, kTile, g.T, D);
    load_tile(sv, base + 2 * g.C, ld, j0, kTile, g.T, D);
    __syncthreads();
    if (i >= g.T) continue;
    const int64_t j = j0 + lane;
    const float s = j <= i ? dot_sh(sq + warp * S, sk + lane * S, D) * g.scale : -INFINITY;
    const float mn = fmaxf(m, warp_max(s));
    const float p = j <= i ? __expf(s - mn) : 0.0f;
    const float corr = __expf(m - mn);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int r = 0; r < kPer; ++r) acc[r] *= corr;
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int64_t d = lane + 32 * r;
        if (d < D) acc[r] = fmaf(pj, sv[jj * S + d], acc[r]);
      }
    }
    m = mn;
  }
  if (i >= g.T) return;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < D) y[(b * g.T + i) * g.C + h * D + d] = acc[r] / l;
  }
  if (lane == 0) lse[bh * g.T + i] = m + logf(l);
}

size_t attn_shared(int64_t D, int own, int tiles) {
  return static_cast<size_t>((own + tiles * kTile) * (D + 1)) * sizeof(float);
}

bool attn_launch_ok(const char* kernel, const void* fn, size_t shared) {
  if (shared > 48 * 1024 &&
      !cuda_ok(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)),
               kernel))
    return false;
  return true;
}

void causal_attention(const KernelArgs& a) {
  if (!f32_only(a, "causal_attention")) return;
  const AttnGeom g = attn_geom(a.in[0], a.attrs);
  if (g.B * g.T == 0) return;
  const size_t shared = attn_shared(g.D, kWarps, 2);
  if (!attn_launch_ok("attn_fwd_kernel", reinterpret_cast<const void*>(attn_fwd_kernel), shared))
    return;
  const dim3 grid(static_cast<unsigned>(ceil_div(g.T, kWarps)), static_cast<unsigned>(g.B * g.H));
  attn_fwd_kernel<<<grid, kWarps * 32, shared, stream_of(a)>>>(
      a.in[0].as<const float>(), g, a.out[0].as<float>(), a.out[1].as<float>());
  launched("attn_fwd_kernel");
}

// dQ for the block's query rows, and Δ_i = dY_i·Y_i into delta[] for the
// dK/dV kernel. Shared: own Q and dY rows, K and V tiles.
__global__ void attn_bwd_dq_kernel(const float* __restrict__ dy, const float* __restrict__ qkv,
                                   const float* __restrict__ y, const float* __restrict__ lse,
                                   AttnGeom g, float* __restrict__ dqkv,
                                   float* __restrict__ delta) {
  extern __shared__ float sh[];
  const int64_t D = g.D, S = D + 1;
  float* sq = sh;
  float* sdy = sq + kWarps * S;
  float* sk = sdy + kWarps * S;
  float* sv = sk + kTile * S;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t i0 = int64_t{blockIdx.x} * kWarps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = i0 + warp;
  const int64_t ld = 3 * g.C;
  const float* base = qkv + b * g.T * ld + h * D;
  load_tile(sq, base, ld, i0, kWarps, g.T, D);
  load_tile(sdy, dy + b * g.T * g.C + h * D, g.C, i0, kWarps, g.T, D);
  __syncthreads();
  float dlt = 0.0f, li = 0.0f;
  if (i < g.T) {
    float part = 0.0f;
    for (int64_t d = lane; d < D; d += 32)
      part = fmaf(sdy[warp * S + d], y[(b * g.T + i) * g.C + h * D + d], part);
    dlt = warp_sum(part);
    li = lse[bh * g.T + i];
    if (lane == 0) delta[bh * g.T + i] = dlt;
  }
  float acc[kPer] = {};
  const int64_t last = min(i0 + kWarps, g.T);
  for (int64_t j0 = 0; j0 < last; j0 += kTile) {
    __syncthreads();
    load_tile(sk, base + g.C, ld, j0, kTile, g.T, D);
    load_tile(sv, base + 2 * g.C, ld, j0, kTile, g.T, D);
    __syncthreads();
    if (i >= g.T) continue;
    const int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      const float p = __expf(dot_sh(sq + warp * S, sk + lane * S, D) * g.scale - li);
      ds = p * (dot_sh(sdy + warp * S, sv + lane * S, D) - dlt);
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float dj = __shfl_sync(kFullMask, ds, jj);
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int64_t d = lane + 32 * r;
        if (d < D) acc[r] = fmaf(dj, sk[jj * S + d], acc[r]);
      }
    }
  }
  if (i >= g.T) return;
  float* dq = dqkv + (b * g.T + i) * ld + h * D;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < D) dq[d] = acc[r] * g.scale;
  }
}

// dK and dV for the block's key rows: over query tiles from the block's
// first key on. Shared: own K and V rows, Q and dY tiles, their lse and Δ.
__global__ void attn_bwd_dkv_kernel(const float* __restrict__ dy, const float* __restrict__ qkv,
                                    const float* __restrict__ lse, const float* __restrict__ delta,
                                    AttnGeom g, float* __restrict__ dqkv) {
  extern __shared__ float sh[];
  const int64_t D = g.D, S = D + 1;
  float* sk = sh;
  float* sv = sk + kWarps * S;
  float* sq = sv + kWarps * S;
  float* sdy = sq + kTile * S;
  float* sl = sdy + kTile * S;  // lse, then Δ, of the query tile
  float* sd = sl + kTile;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t j0 = int64_t{blockIdx.x} * kWarps;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = j0 + warp;
  const int64_t ld = 3 * g.C;
  const float* base = qkv + b * g.T * ld + h * D;
  load_tile(sk, base + g.C, ld, j0, kWarps, g.T, D);
  load_tile(sv, base + 2 * g.C, ld, j0, kWarps, g.T, D);
  float dk[kPer] = {}, dv[kPer] = {};
  for (int64_t q0 = j0 / kTile * kTile; q0 < g.T; q0 += kTile) {
    __syncthreads();
    load_tile(sq, base, ld, q0, kTile, g.T, D);
    load_tile(sdy, dy + b * g.T * g.C + h * D, g.C, q0, kTile, g.T, D);
    if (threadIdx.x < kTile) {
      const int64_t q = q0 + threadIdx.x;
      sl[threadIdx.x] = q < g.T ? lse[bh * g.T + q] : 0.0f;
      sd[threadIdx.x] = q < g.T ? delta[bh * g.T + q] : 0.0f;
    }
    __syncthreads();
    if (j >= g.T) continue;
    const int64_t q = q0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (q >= j && q < g.T) {
      p = __expf(dot_sh(sq + lane * S, sk + warp * S, D) * g.scale - sl[lane]);
      ds = p * (dot_sh(sdy + lane * S, sv + warp * S, D) - sd[lane]);
    }
    for (int qq = 0; qq < kTile; ++qq) {
      const float pq = __shfl_sync(kFullMask, p, qq);
      const float dq = __shfl_sync(kFullMask, ds, qq);
#pragma unroll
      for (int r = 0; r < kPer; ++r) {
        const int64_t d = lane + 32 * r;
        if (d < D) {
          dv[r] = fmaf(pq, sdy[qq * S + d], dv[r]);
          dk[r] = fmaf(dq, sq[qq * S + d], dk[r]);
        }
      }
    }
  }
  if (j >= g.T) return;
  float* dkr = dqkv + (b * g.T + j) * ld + g.C + h * D;
  float* dvr = dkr + g.C;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int64_t d = lane + 32 * r;
    if (d < D) {
      dkr[d] = dk[r] * g.scale;
      dvr[d] = dv[r];
    }
  }
}

size_t attention_grad_ws(const KernelArgs& a) {
  const AttnGeom g = attn_geom(a.in[1], a.attrs);
  return static_cast<size_t>(g.B * g.H * g.T) * sizeof(float);  // Δ
}

void causal_attention_grad(const KernelArgs& a) {
  if (!f32_only(a, "causal_attention_grad")) return;
  const AttnGeom g = attn_geom(a.in[1], a.attrs);
  if (g.B * g.T == 0) return;
  auto* delta = static_cast<float*>(a.workspace);
  const cudaStream_t s = stream_of(a);
  const dim3 grid(static_cast<unsigned>(ceil_div(g.T, kWarps)), static_cast<unsigned>(g.B * g.H));
  const size_t sh_dq = attn_shared(g.D, 2 * kWarps, 2);
  if (!attn_launch_ok("attn_bwd_dq_kernel", reinterpret_cast<const void*>(attn_bwd_dq_kernel),
                      sh_dq))
    return;
  attn_bwd_dq_kernel<<<grid, kWarps * 32, sh_dq, s>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), a.in[2].as<const float>(),
      a.in[3].as<const float>(), g, a.out[0].as<float>(), delta);
  if (!launched("attn_bwd_dq_kernel")) return;
  const size_t sh_dkv = attn_shared(g.D, 2 * kWarps, 2) + 2 * kTile * sizeof(float);
  if (!attn_launch_ok("attn_bwd_dkv_kernel", reinterpret_cast<const void*>(attn_bwd_dkv_kernel),
                      sh_dkv))
    return;
  attn_bwd_dkv_kernel<<<grid, kWarps * 32, sh_dkv, s>>>(
      a.in[0].as<const float>(), a.in[1].as<const float>(), a.in[3].as<const float>(), delta, g,
      a.out[0].as<float>());
  launched("attn_bwd_dkv_kernel");
}

// One decoding step. Block (b, h) writes its head's slice of k and v into
// the cache at the token's position, scores the cached positions (one
// thread per position), and sums v in position order (one thread per
// channel): deterministic, and no block reads what another writes.
constexpr int kDecodeThreads = 128;

__device__ float block_reduce(float v, float* scratch, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(kFullMask, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.0f;
  for (int w = 0; w < warps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

__global__ void attention_decode_kernel(const float* __restrict__ qkv, float* __restrict__ cache,
                                        const int32_t* __restrict__ pos, int64_t C, int64_t P,
                                        int64_t H, float scale, float* __restrict__ y) {
  extern __shared__ float sh[];  // q (D), scores (P), reduction scratch (32)
  const int64_t b = blockIdx.y, h = blockIdx.x, D = C / H;
  float* sq = sh;
  float* sc = sq + D;
  float* scratch = sc + P;
  const int64_t p = pos[b];
  float* out = y + b * C + h * D;
  if (p < 0 || p >= P) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[d] = 0.0f;
    return;
  }
  const float* q = qkv + b * 3 * C + h * D;
  float* rows = cache + b * P * 2 * C;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    sq[d] = q[d];
    rows[p * 2 * C + h * D + d] = q[C + d];
    rows[p * 2 * C + C + h * D + d] = q[2 * C + d];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= p; j += blockDim.x) {
    const float* k = rows + j * 2 * C + h * D;
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc = fmaf(sq[d], k[d], acc);
    sc[j] = acc * scale;
    m = fmaxf(m, sc[j]);
  }
  m = block_reduce(m, scratch, true);
  float z = 0.0f;
  for (int64_t j = threadIdx.x; j <= p; j += blockDim.x) {
    sc[j] = __expf(sc[j] - m);
    z += sc[j];
  }
  z = block_reduce(z, scratch, false);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j <= p; ++j) acc = fmaf(sc[j], rows[j * 2 * C + C + h * D + d], acc);
    out[d] = acc / z;
  }
}

bool attention_decode_supported(const KernelArgs& a) {
  const int64_t C = a.in[0].dim(2) / 3, P = a.in[1].dim(1), H = a.attrs.geti("heads", 1);
  // q, the scores and the scratch in the 48 KiB of shared memory every device has.
  return f32_operands(a) && (C / H + P + 32) * 4 <= 48 * 1024 && a.in[0].dim(0) <= 65535 &&
         H < INT_MAX;
}

void attention_decode(const KernelArgs& a) {
  if (!f32_only(a, "attention_decode")) return;
  const int64_t B = a.in[0].dim(0), C = a.in[0].dim(2) / 3, P = a.in[1].dim(1);
  const int64_t H = a.attrs.geti("heads", 1);
  if (B == 0) return;
  const size_t shared = static_cast<size_t>(C / H + P + 32) * sizeof(float);
  attention_decode_kernel<<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(B)),
                            kDecodeThreads, shared, stream_of(a)>>>(
      a.in[0].as<const float>(), a.in[1].as<float>(), a.in[2].as<const int32_t>(), C, P, H,
      1.0f / sqrtf(static_cast<float>(C / H)), a.out[0].as<float>());
  launched("attention_decode_kernel");
}

// ---- output projection + softmax cross-entropy ------------------------------------

constexpr int64_t kHeadRows = 1024;
constexpr int64_t kHeadChunk = 8192;

struct HeadGeom {
  int64_t rows, V, C, rb, vc;
};

HeadGeom head_geom(const KernelArgs& a) {
  HeadGeom h{a.in[2].numel(), a.in[1].dim(0), a.in[1].dim(1), 0, 0};
  h.rb = std::max<int64_t>(1, std::min(h.rows, kHeadRows));
  h.vc = std::max<int64_t>(1, std::min(h.V, kHeadChunk));
  return h;
}

struct HeadLayout {
  float* S;       // [rb × vc] logit tile
  float* m;       // [rb] running max, then lse
  float* z;       // [rb] running Σ exp
  float* tgt;     // [rb] target logit
  double* terms;  // [rows] lse − target of each counted row (0 otherwise)
  double* scale;  // [1] the gradient's scale/n
  size_t total;
};

HeadLayout head_layout(std::byte* base, const HeadGeom& h) {
  Carve c{base};
  HeadLayout L{};
  L.S = c.take<float>(static_cast<size_t>(h.rb * h.vc));
  L.m = c.take<float>(static_cast<size_t>(h.rb));
  L.z = c.take<float>(static_cast<size_t>(h.rb));
  L.tgt = c.take<float>(static_cast<size_t>(h.rb));
  L.terms = c.take<double>(static_cast<size_t>(std::max<int64_t>(h.rows, 1)));
  L.scale = c.take<double>(1);
  L.total = c.used;
  return L;
}

size_t head_ws(const KernelArgs& a) {
  return head_layout(nullptr, head_geom(a)).total;
}

bool head_supported(const KernelArgs& a) {
  return f32_operands(a) && a.in[2].numel() < INT_MAX && a.in[1].dim(0) < INT_MAX &&
         a.in[1].dim(1) < INT_MAX;
}

__global__ void head_init_kernel(int64_t nr, float* m, float* z, float* tgt) {
  POOCH_GRID_STRIDE(r, nr) {
    m[r] = -INFINITY;
    z[r] = 0.0f;
    tgt[r] = 0.0f;
  }
}

// One warp per row of the tile: the online max and Σ exp, and the target's logit.
__global__ void head_stats_kernel(const float* __restrict__ S, int64_t nr, int64_t nv, int64_t v0,
                                  const int32_t* __restrict__ cls, float* m, float* z, float* tgt) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= nr) return;
  const float* s = S + r * nv;
  float mx = -INFINITY;
  for (int64_t j = lane; j < nv; j += 32) mx = fmaxf(mx, s[j]);
  mx = warp_max(mx);
  const float mn = fmaxf(m[r], mx);
  float part = 0.0f;
  for (int64_t j = lane; j < nv; j += 32) part += __expf(s[j] - mn);
  part = warp_sum(part);
  if (lane == 0) {
    z[r] = (m[r] == -INFINITY ? 0.0f : z[r] * __expf(m[r] - mn)) + part;
    m[r] = mn;
    const int32_t c = cls[r];
    if (c >= v0 && c < v0 + nv) tgt[r] = s[c - v0];
  }
}

// m becomes lse; terms[r] = lse − target on counted rows, and the lse into
// lse_out (0 on rows that do not count) for the backward pass.
__global__ void head_finish_kernel(int64_t nr, int64_t V, const int32_t* __restrict__ cls, float* m,
                                   const float* z, const float* tgt, double* terms,
                                   float* lse_out) {
  POOCH_GRID_STRIDE(r, nr) {
    m[r] += logf(z[r]);
    const bool counted = valid_id(cls[r], V);
    terms[r] = counted ? static_cast<double>(m[r]) - tgt[r] : 0.0;
    lse_out[r] = counted ? m[r] : 0.0f;
  }
}

// One block: out = Σ terms / max(n, 1) (as f32), or scale/max(n,1) into *scale.
__global__ void head_reduce_kernel(const double* __restrict__ terms,
                                   const int32_t* __restrict__ cls, int64_t rows, int64_t V,
                                   double scale, float* loss, double* grad_scale) {
  __shared__ double scratch[33];
  double s = 0.0, n = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (terms) s += terms[r];
    n += valid_id(cls[r], V) ? 1.0 : 0.0;
  }
  s = block_sum(s, scratch);
  n = block_sum(n, scratch);
  if (threadIdx.x == 0) {
    if (loss) *loss = static_cast<float>(n > 0 ? s / n : 0.0);
    if (grad_scale) *grad_scale = scale / (n > 0 ? n : 1.0);
  }
}

// G = scale·(softmax − onehot) on counted rows, 0 on the others.
__global__ void head_grad_kernel(float* __restrict__ S, int64_t nr, int64_t nv, int64_t v0,
                                 int64_t V, const int32_t* __restrict__ cls,
                                 const float* __restrict__ lse, const double* __restrict__ scale) {
  const float sc = static_cast<float>(*scale);
  POOCH_GRID_STRIDE(i, nr * nv) {
    const int64_t r = i / nv, j = i % nv;
    const int32_t c = cls[r];
    S[i] = valid_id(c, V) ? sc * (__expf(S[i] - lse[r]) - (c == v0 + j ? 1.0f : 0.0f)) : 0.0f;
  }
}

// The lse of rows [r0, r0 + nr) into L.m and lse_out[r0, r0 + nr) (and
// their loss terms).
bool head_block_lse(cublasHandle_t hd, const float* x, const float* w, const int32_t* cls,
                    const HeadGeom& h, int64_t r0, int64_t nr, const HeadLayout& L, float* lse_out,
                    cudaStream_t s) {
  head_init_kernel<<<grid_for(nr, kThreads), kThreads, 0, s>>>(nr, L.m, L.z, L.tgt);
  if (!launched("head_init_kernel")) return false;
  for (int64_t v0 = 0; v0 < h.V; v0 += h.vc) {
    const int64_t nv = std::min(h.vc, h.V - v0);
    if (!sgemm(hd, CUBLAS_OP_T, CUBLAS_OP_N, nv, nr, h.C, w + v0 * h.C, h.C, x + r0 * h.C, h.C,
               false, L.S, nv))
      return false;
    head_stats_kernel<<<static_cast<unsigned>(ceil_div(nr, 8)), 256, 0, s>>>(
        L.S, nr, nv, v0, cls + r0, L.m, L.z, L.tgt);
    if (!launched("head_stats_kernel")) return false;
  }
  head_finish_kernel<<<grid_for(nr, kThreads), kThreads, 0, s>>>(nr, h.V, cls + r0, L.m, L.z, L.tgt,
                                                                 L.terms + r0, lse_out + r0);
  return launched("head_finish_kernel");
}

bool head_prepare(const KernelArgs& a, const char* op, const HeadGeom& h, HeadLayout* L,
                  cublasHandle_t* hd) {
  if (!f32_only(a, op)) return false;
  *L = head_layout(static_cast<std::byte*>(a.workspace), h);
  if (L->total > a.workspace_bytes) {
    report("%s: needs %zu workspace bytes, has %zu", op, L->total, a.workspace_bytes);
    return false;
  }
  *hd = cublas_handle(op);
  return *hd != nullptr;
}

void linear_xent_index(const KernelArgs& a) {
  const HeadGeom h = head_geom(a);
  HeadLayout L;
  cublasHandle_t hd;
  if (!head_prepare(a, "linear_xent_index", h, &L, &hd)) return;
  const float* x = a.in[0].as<const float>();
  const float* w = a.in[1].as<const float>();
  const int32_t* cls = a.in[2].as<const int32_t>();
  const cudaStream_t s = stream_of(a);
  const bool any = h.rows > 0 && h.V > 0;
  if (any) {
    for (int64_t r0 = 0; r0 < h.rows; r0 += h.rb)
      if (!head_block_lse(hd, x, w, cls, h, r0, std::min(h.rb, h.rows - r0), L,
                          a.out[1].as<float>(), s))
        return;
  } else if (h.rows > 0) {  // no classes: each row's log-sum-exp is 0, as the reference's
    if (!cuda_ok(cudaMemsetAsync(a.out[1].data, 0, static_cast<size_t>(h.rows) * sizeof(float), s),
                 "cudaMemsetAsync"))
      return;
  }
  head_reduce_kernel<<<1, 256, 0, s>>>(any ? L.terms : nullptr, cls, h.rows, h.V, 1.0,
                                       a.out[0].as<float>(), nullptr);
  launched("head_reduce_kernel");
}

void linear_xent_index_grad(const KernelArgs& a) {
  const HeadGeom h = head_geom(a);
  HeadLayout L;
  cublasHandle_t hd;
  if (!head_prepare(a, "linear_xent_index_grad", h, &L, &hd)) return;
  const float* x = a.in[0].as<const float>();
  const float* w = a.in[1].as<const float>();
  const int32_t* cls = a.in[2].as<const int32_t>();
  const float* lse = a.in[3].as<const float>();  // the forward's, per row
  float* dx = a.out[0].as<float>();
  float* dw = a.out[1].as<float>();
  const cudaStream_t s = stream_of(a);
  const bool want_dw = a.out[1].numel() > 0;  // empty: W is frozen
  if (h.rows == 0 || h.C == 0 || h.V == 0) {
    if (want_dw && h.V * h.C > 0 &&
        !cuda_ok(cudaMemsetAsync(dw, 0, static_cast<size_t>(h.V * h.C) * 4, s), "cudaMemsetAsync"))
      return;
    if (h.rows * h.C > 0)
      cuda_ok(cudaMemsetAsync(dx, 0, static_cast<size_t>(h.rows * h.C) * 4, s), "cudaMemsetAsync");
    return;
  }
  head_reduce_kernel<<<1, 256, 0, s>>>(nullptr, cls, h.rows, h.V, a.attrs.get("scale", 1.0),
                                       nullptr, L.scale);
  if (!launched("head_reduce_kernel")) return;
  for (int64_t r0 = 0; r0 < h.rows; r0 += h.rb) {
    const int64_t nr = std::min(h.rb, h.rows - r0);
    for (int64_t v0 = 0; v0 < h.V; v0 += h.vc) {
      const int64_t nv = std::min(h.vc, h.V - v0);
      if (!sgemm(hd, CUBLAS_OP_T, CUBLAS_OP_N, nv, nr, h.C, w + v0 * h.C, h.C, x + r0 * h.C, h.C,
                 false, L.S, nv))
        return;
      head_grad_kernel<<<grid_for(nr * nv, kThreads), kThreads, 0, s>>>(
          L.S, nr, nv, v0, h.V, cls + r0, lse + r0, L.scale);
      if (!launched("head_grad_kernel")) return;
      // dx[block] (+)= G·W[chunk]; dW[chunk] (+)= Gᵀ·x[block].
      if (!sgemm(hd, CUBLAS_OP_N, CUBLAS_OP_N, h.C, nr, nv, w + v0 * h.C, h.C, L.S, nv, v0 > 0,
                 dx + r0 * h.C, h.C))
        return;
      if (want_dw && !sgemm(hd, CUBLAS_OP_N, CUBLAS_OP_T, h.C, nv, nr, x + r0 * h.C, h.C, L.S, nv,
                            r0 > 0, dw + v0 * h.C, h.C))
        return;
    }
  }
}

KernelVariant plain(const char* op, KernelFn fn, WorkspaceFn ws = nullptr,
                    SupportsFn supports = f32_operands) {
  return KernelVariant{op, "cuda", fn, ws, true, supports};
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_lm_kernels() {
  using namespace cuda;
  return {
      plain("embedding", embedding),
      KernelVariant{"embedding_grad_rows", "sort", embedding_grad_rows, embedding_grad_ws, true,
                    embedding_grad_supported},
      KernelVariant{"embedding_grad_dense", "sort", embedding_grad_dense, embedding_grad_ws, true,
                    embedding_grad_supported},
      plain("gelu_tanh", gelu_tanh),
      plain("gelu_tanh_grad", gelu_tanh_grad),
      KernelVariant{"causal_attention", "flash", causal_attention, nullptr, true,
                    attention_supported},
      KernelVariant{"causal_attention_grad", "flash", causal_attention_grad, attention_grad_ws,
                    true, attention_supported},
      KernelVariant{"attention_decode", "cuda", attention_decode, nullptr, true,
                    attention_decode_supported},
      KernelVariant{"linear_xent_index", "cublas", linear_xent_index, head_ws, true,
                    head_supported},
      KernelVariant{"linear_xent_index_grad", "cublas", linear_xent_index_grad, head_ws, true,
                    head_supported},
  };
}

}  // namespace pooch::kern
