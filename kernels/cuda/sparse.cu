// CUDA kernels of the sparse family (docs/OPS.md, "Sparse"), f32.
//
// None of them reads device data on the host: counts that live on the device
// (a CSR batch's nnz = ptr[B] - ptr[0], the distinct features of a batch)
// stay there, and kernels are launched for the capacity with the surplus
// threads idle. Entries of a CSR batch outside [ptr[0], ptr[B]) are junk
// (invalid ids, NaN values) and are never used.
//
// sparse_linear          cuSPARSE SpMM (CSR × row-major dense, CSR_ALG2), on
//                        a consistent copy of the batch whose junk tail is an
//                        extra, zeroed row; and a plain row-wise kernel.
// sparse_linear_grad_weight  entries sorted by feature (CUB radix sort, stable,
//                        so each feature's entries stay in entry order), then
//                        one writer per output element: deterministic.
// ffi_linear             gather, x transposed to [H][B] in the workspace so a
//                        group of 8 lanes reads one 128-byte line of 32 batch
//                        rows per slot (float4 per lane), index and weights
//                        loaded 4 slots at a time.
// ffi_grad_input         "atomic": red.global scatter into dx transposed (not
//                        deterministic); "deterministic": the index inverted
//                        by a stable sort (slots of each hidden unit in
//                        ascending (l,k) order), then a gather with one writer.
// ffi_grad_weight        SDDMM-shaped, same layout as the forward, labels whose
//                        dy is zero in every row skipped.
// topk                   radix select over (value, position) keys per row in
//                        one block, then a bitonic sort of the k winners; for
//                        k above 1024 a segmented radix sort of whole rows.
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <type_traits>

#include "../common/float_ops.h"
#include "../common/supports.h"
#include "common.cuh"
#include "cuda_libs.h"

namespace pooch::kern {
namespace cuda {
namespace {

// The device a workspace function sizes for: the one the call is planned on
// (KernelArgs::device), or none (null: the caller returns a bound).
const LaunchEnv* planned_env(const KernelArgs& a) {
  return static_cast<const LaunchEnv*>(a.device);
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  POOCH_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// out[c·ldo + r] = in[r·ldi + c] for c < C and r < Rp, 0 where r >= R: an
// [R, C] matrix (row stride ldi) transposed into [C][ldo], its rows padded
// with zeros to Rp. 32×32 tiles through shared memory, both sides coalesced.
__global__ void transpose_pad_kernel(const float* __restrict__ in, int64_t R, int64_t C,
                                     int64_t ldi, float* __restrict__ out, int64_t Rp,
                                     int64_t ldo) {
  __shared__ float tile[32][33];
  const int64_t ctiles = (C + 31) / 32, rtiles = (Rp + 31) / 32;
  for (int64_t t = blockIdx.x; t < ctiles * rtiles; t += gridDim.x) {
    const int64_t c0 = (t % ctiles) * 32, r0 = (t / ctiles) * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      tile[j][threadIdx.x] = r < R && c < C ? in[r * ldi + c] : 0.0f;
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (c < C && r < Rp) out[c * ldo + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

bool transpose_pad(const float* in, int64_t R, int64_t C, int64_t ldi, float* out, int64_t Rp,
                   int64_t ldo, cudaStream_t s) {
  if (C <= 0 || Rp <= 0) return true;
  const int64_t tiles = ceil_div(C, 32) * ceil_div(Rp, 32);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, int64_t{sm_count()} * 64));
  transpose_pad_kernel<<<grid, dim3(32, 8), 0, s>>>(in, R, C, ldi, out, Rp, ldo);
  return launched("transpose_pad_kernel");
}

// ---- sparse_linear -----------------------------------------------------------

// y[r, o] = Σ_j val[j]·W[idx[j], o] over the row's entries in order, then
// + b[o] (the order of the CPU kernel). Threads over columns, blocks over
// column tiles (x) and rows (y).
__global__ void sparse_linear_rows_kernel(const int32_t* __restrict__ ptr,
                                          const int32_t* __restrict__ idx,
                                          const float* __restrict__ val,
                                          const float* __restrict__ w,
                                          const float* __restrict__ bias, float* __restrict__ y,
                                          int64_t B, int64_t O) {
  for (int64_t r = blockIdx.y; r < B; r += gridDim.y) {
    const int32_t j0 = ptr[r], j1 = ptr[r + 1];
    for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < O;
         o += int64_t{gridDim.x} * blockDim.x) {
      float acc = 0.0f;
      for (int32_t j = j0; j < j1; ++j) acc = fused_ma(val[j], w[int64_t{idx[j]} * O + o], acc);
      y[r * O + o] = acc + bias[o];
    }
  }
}

void sparse_linear_rows(const KernelArgs& a) {
  const int64_t B = a.out[0].shape[0], O = a.out[0].shape[1];
  if (B == 0 || O == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(O, 128), 4096)),
                  static_cast<unsigned>(std::min<int64_t>(B, 65535)));
  sparse_linear_rows_kernel<<<grid, 128, 0, stream_of(a)>>>(
      a.in[0].as<const int32_t>(), a.in[1].as<const int32_t>(), a.in[2].as<const float>(),
      a.in[3].as<const float>(), a.in[4].as<const float>(), a.out[0].as<float>(), B, O);
  launched("sparse_linear_rows_kernel");
}

void sparse_linear_rowwise(const KernelArgs& a) {
  if (!f32_only(a, "sparse_linear")) return;
  sparse_linear_rows(a);
}

// The batch as a CSR matrix that is consistent for cuSPARSE, which is told
// nnz = cap (the real count, ptr[B] - ptr[0], is on the device): rows 0..B-1
// hold the valid entries, shifted to start at 0, and one extra row B holds the
// tail, its entries replaced by (0, 0), so that ptr2[B+1] = cap as the format
// requires. A CSR whose last offset is below its nnz is not a valid matrix
// (load balancing by nnz may give the tail to a row past the end). Row B of
// the product goes to a scratch row and is never copied out.
__global__ void sanitize_csr_kernel(const int32_t* __restrict__ ptr, int64_t B,
                                    const int32_t* __restrict__ idx, const float* __restrict__ val,
                                    int64_t cap, int32_t* __restrict__ ptr2,
                                    int32_t* __restrict__ idx2, float* __restrict__ val2) {
  const int64_t first = ptr[0], last = ptr[B];
  POOCH_GRID_STRIDE(j, cap) {
    const int64_t src = j + first;
    const bool in = src < last;
    idx2[j] = in ? idx[src] : 0;
    val2[j] = in ? val[src] : 0.0f;
  }
  POOCH_GRID_STRIDE(r, B + 2) ptr2[r] = static_cast<int32_t>(r <= B ? ptr[r] - first : cap);
}

__global__ void broadcast_rows_kernel(const float* __restrict__ row, int64_t R, int64_t C,
                                      float* __restrict__ out) {
  POOCH_GRID_STRIDE(i, R * C) out[i] = row[i % C];
}

bool cusparse_ok(cusparseStatus_t st, const char* call) {
  if (st == CUSPARSE_STATUS_SUCCESS) return true;
  report("%s: %s", call, cuda_libs().cusparseGetErrorString(st));
  return false;
}

// The SpMM descriptors of one sparse_linear call; destroyed with the object.
struct SpmmDescs {
  cusparseSpMatDescr_t A = nullptr;
  cusparseDnMatDescr_t W = nullptr, Y = nullptr;
  bool ok = false;
  SpmmDescs(int64_t B, int64_t F, int64_t O, int64_t cap, void* ptr, void* idx, void* val, void* w,
            void* y) {
    const CudaLibs& lib = cuda_libs();
    ok =
        cusparse_ok(lib.cusparseCreateCsr(&A, B, F, cap, ptr, idx, val, CUSPARSE_INDEX_32I,
                                          CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F),
                    "cusparseCreateCsr") &&
        cusparse_ok(lib.cusparseCreateDnMat(&W, F, O, O, w, CUDA_R_32F, CUSPARSE_ORDER_ROW),
                    "cusparseCreateDnMat") &&
        cusparse_ok(lib.cusparseCreateDnMat(&Y, B, O, O, y, CUDA_R_32F, CUSPARSE_ORDER_ROW),
                    "cusparseCreateDnMat");
  }
  ~SpmmDescs() {
    if (A) cuda_libs().cusparseDestroySpMat(A);
    if (W) cuda_libs().cusparseDestroyDnMat(W);
    if (Y) cuda_libs().cusparseDestroyDnMat(Y);
  }
  SpmmDescs(const SpmmDescs&) = delete;
  SpmmDescs& operator=(const SpmmDescs&) = delete;
};

constexpr cusparseSpMMAlg_t kSpmmAlg = CUSPARSE_SPMM_CSR_ALG2;

// When no device can be asked (planning without a backend): generous, and a
// launch that finds it too small runs the row-wise kernel instead.
size_t spmm_fallback_bound(int64_t B, int64_t cap) {
  return (size_t{8} << 20) + 16 * static_cast<size_t>(cap) + 16 * static_cast<size_t>(B + 1);
}

// cusparseSpMM_bufferSize for these shapes, with the given pointers (the
// workspace function has none: it passes distinct aligned placeholders that
// are never dereferenced).
bool spmm_buffer_size(cusparseHandle_t h, int64_t B, int64_t F, int64_t O, int64_t cap, void* ptr,
                      void* idx, void* val, void* w, void* y, size_t* bytes) {
  SpmmDescs d(B, F, O, cap, ptr, idx, val, w, y);
  if (!d.ok) return false;
  const float one = 1.0f;
  // Reported (inside a launch) so that a launcher never returns quietly
  // without writing its output.
  return cusparse_ok(cuda_libs().cusparseSpMM_bufferSize(
                         h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                         &one, d.A, d.W, &one, d.Y, CUDA_R_32F, kSpmmAlg, bytes),
                     "cusparseSpMM_bufferSize");
}

struct SpmmShape {
  int64_t B, F, O, cap;
};
SpmmShape spmm_shape(const KernelArgs& a) {
  return {a.out[0].shape[0], a.in[3].shape[0], a.out[0].shape[1], a.in[1].shape[0]};
}

// The launcher's workspace: the consistent CSR copy (B+1 rows, see
// sanitize_csr_kernel), the [B+1, O] product, then cuSPARSE's buffer.
struct SpmmLayout {
  int32_t* ptr2;
  int32_t* idx2;
  float* val2;
  float* y2;
  size_t used;  // bytes before cuSPARSE's buffer
};
SpmmLayout spmm_layout(std::byte* base, const SpmmShape& s) {
  Carve c{base};
  SpmmLayout L{};
  L.ptr2 = c.take<int32_t>(static_cast<size_t>(s.B + 2));
  L.idx2 = c.take<int32_t>(static_cast<size_t>(s.cap));
  L.val2 = c.take<float>(static_cast<size_t>(s.cap));
  L.y2 = c.take<float>(static_cast<size_t>((s.B + 1) * s.O));
  L.used = c.used;
  return L;
}

size_t sparse_linear_cusparse_ws(const KernelArgs& a) {
  const SpmmShape s = spmm_shape(a);
  if (s.B == 0 || s.O == 0 || s.F == 0 || s.cap == 0) return 0;  // no SpMM: bias alone
  const size_t used = spmm_layout(nullptr, s).used;
  size_t bytes = 0;
  bool known = false;
  const LaunchEnv* e = planned_env(a);
  if (e != nullptr && e->cusparse != nullptr) {
    auto* h = static_cast<cusparseHandle_t>(e->cusparse);
    auto fake = [](uintptr_t k) { return reinterpret_cast<void*>(k << 12); };
    known = device_query(e, [&] {
      return spmm_buffer_size(h, s.B + 1, s.F, s.O, s.cap, fake(1), fake(2), fake(3), fake(4),
                              fake(5), &bytes)
                 ? cudaSuccess
                 : cudaErrorInvalidValue;
    });
  }
  if (!known) bytes = spmm_fallback_bound(s.B + 1, s.cap);
  return used + align_up(bytes);
}

void sparse_linear_cusparse(const KernelArgs& a) {
  if (!f32_only(a, "sparse_linear")) return;
  const SpmmShape s = spmm_shape(a);
  if (s.B == 0 || s.O == 0) return;
  const cudaStream_t st = stream_of(a);
  LaunchEnv* e = current_launch_env();
  if (e == nullptr || e->cusparse == nullptr) {
    report("sparse_linear: no cuSPARSE handle (launched outside a CUDA backend)");
    return;
  }
  auto* h = static_cast<cusparseHandle_t>(e->cusparse);
  float* y = a.out[0].as<float>();
  void* w = a.in[3].data;
  const float* bias = a.in[4].as<const float>();
  // Nothing to multiply: y is the bias alone.
  if (s.F == 0 || s.cap == 0) {
    broadcast_rows_kernel<<<grid_for(s.B * s.O, kThreads), kThreads, 0, st>>>(bias, s.B, s.O, y);
    launched("broadcast_rows_kernel");
    return;
  }
  if (s.cap >= INT_MAX || s.B + 1 >= INT_MAX) {
    report("sparse_linear: capacity %lld or batch %lld exceeds 32-bit CSR offsets",
           static_cast<long long>(s.cap), static_cast<long long>(s.B));
    return;
  }
  const SpmmLayout L = spmm_layout(static_cast<std::byte*>(a.workspace), s);
  size_t need = 0;
  if (a.workspace != nullptr && L.used <= a.workspace_bytes &&
      !spmm_buffer_size(h, s.B + 1, s.F, s.O, s.cap, L.ptr2, L.idx2, L.val2, w, L.y2, &need))
    return;
  if (a.workspace == nullptr || L.used > a.workspace_bytes || need > a.workspace_bytes - L.used) {
    // The plan sized the workspace without a device to ask; the row-wise
    // kernel gives the same result without cuSPARSE's buffer.
    sparse_linear_rows(a);
    return;
  }
  sanitize_csr_kernel<<<grid_for(std::max(s.cap, s.B + 2), kThreads), kThreads, 0, st>>>(
      a.in[0].as<const int32_t>(), s.B, a.in[1].as<const int32_t>(), a.in[2].as<const float>(),
      s.cap, L.ptr2, L.idx2, L.val2);
  if (!launched("sanitize_csr_kernel")) return;
  broadcast_rows_kernel<<<grid_for((s.B + 1) * s.O, kThreads), kThreads, 0, st>>>(bias, s.B + 1,
                                                                                  s.O, L.y2);
  if (!launched("broadcast_rows_kernel")) return;
  SpmmDescs d(s.B + 1, s.F, s.O, s.cap, L.ptr2, L.idx2, L.val2, w, L.y2);
  if (!d.ok) return;
  const float one = 1.0f;
  if (!cusparse_ok(cuda_libs().cusparseSpMM(
                       h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one,
                       d.A, d.W, &one, d.Y, CUDA_R_32F, kSpmmAlg,
                       need ? static_cast<std::byte*>(a.workspace) + L.used : nullptr),
                   "cusparseSpMM"))
    return;
  cuda_ok(cudaMemcpyAsync(y, L.y2, static_cast<size_t>(s.B * s.O) * sizeof(float),
                          cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync");
}

// ---- sparse_linear_grad_weight -------------------------------------------------

// Per entry j: its row (binary search in ptr; -1 outside [ptr[0], ptr[B]))
// and its sort key, the feature, or F (sorts last) for junk.
__global__ void entry_keys_kernel(const int32_t* __restrict__ ptr, int64_t B,
                                  const int32_t* __restrict__ idx, int64_t cap, int32_t F,
                                  int32_t* __restrict__ row_of, uint32_t* __restrict__ keys,
                                  int32_t* __restrict__ vals) {
  const int32_t first = ptr[0], last = ptr[B];
  POOCH_GRID_STRIDE(j, cap) {
    int32_t r = -1;
    if (j >= first && j < last) {
      // The last row r with ptr[r] <= j (empty rows have ptr[r] = ptr[r+1]).
      int64_t lo = 0, hi = B;  // ptr[lo] <= j < ptr[hi]
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (ptr[mid] <= j)
          lo = mid;
        else
          hi = mid;
      }
      r = static_cast<int32_t>(lo);
    }
    row_of[j] = r;
    keys[j] = r >= 0 ? static_cast<uint32_t>(idx[j]) : static_cast<uint32_t>(F);
    vals[j] = static_cast<int32_t>(j);
  }
}

__global__ void segment_heads_kernel(const uint32_t* __restrict__ keys, int64_t cap, uint32_t F,
                                     int32_t* __restrict__ flags) {
  POOCH_GRID_STRIDE(t, cap) {
    const uint32_t k = keys[t];
    flags[t] = k != F && (t == 0 || keys[t - 1] != k) ? 1 : 0;
  }
}

// rows[1+i] and start[i] for each segment head; rows[0] = n and start[n] = m
// (the valid entries, which sort before the junk).
__global__ void segment_table_kernel(const uint32_t* __restrict__ keys,
                                     const int32_t* __restrict__ flags,
                                     const int32_t* __restrict__ seg, int64_t cap,
                                     const int32_t* __restrict__ ptr, int64_t B,
                                     int32_t* __restrict__ rows, int32_t* __restrict__ start) {
  POOCH_GRID_STRIDE(t, cap) {
    if (flags[t]) {
      const int32_t i = seg[t] - 1;
      rows[1 + i] = static_cast<int32_t>(keys[t]);
      start[i] = static_cast<int32_t>(t);
    }
    if (t == cap - 1) {
      const int32_t n = seg[t];
      rows[0] = n;
      start[n] = ptr[B] - ptr[0];
    }
  }
}

// dWr[i, o] = Σ over the segment's entries, in entry order, of val·dy[row, o].
__global__ void segment_sums_kernel(const int32_t* __restrict__ rows,
                                    const int32_t* __restrict__ start,
                                    const int32_t* __restrict__ order,
                                    const int32_t* __restrict__ row_of,
                                    const float* __restrict__ val, const float* __restrict__ dy,
                                    float* __restrict__ dwr, int64_t O) {
  const int32_t n = rows[0];
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int32_t t0 = start[i], t1 = start[i + 1];
    for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < O;
         o += int64_t{gridDim.x} * blockDim.x) {
      float acc = 0.0f;
      for (int32_t t = t0; t < t1; ++t) {
        const int32_t j = order[t];
        acc = fused_ma(val[j], dy[int64_t{row_of[j]} * O + o], acc);
      }
      dwr[i * O + o] = acc;
    }
  }
}

// db[o] = Σ_r dy[r, o] in float, the rows in order: the CPU kernel's sum, so
// that the layer's gradient made on the host (out of core, where the layer's
// update runs there) has the in-core bits. (column_sums, in double, rounds
// once, and its bits differ.) Unrolled so that a thread has several rows'
// loads in flight while its adds wait on each other.
__global__ void column_sums_in_order_kernel(const float* __restrict__ m, int64_t R, int64_t C,
                                            float* __restrict__ out) {
  POOCH_GRID_STRIDE(c, C) {
    float s = 0.0f;
#pragma unroll 8
    for (int64_t r = 0; r < R; ++r) s += m[r * C + c];
    out[c] = s;
  }
}

__global__ void set_int_kernel(int32_t* p, int32_t v) {
  *p = v;
}

struct GradWeightLayout {
  int32_t* row_of;
  uint32_t* keys[2];
  int32_t* vals[2];
  int32_t* flags;
  int32_t* seg;
  int32_t* start;
  void* temp;
  size_t temp_bytes;
  size_t total;
};

size_t sort_scan_fallback(int64_t n) {
  return (size_t{2} << 20) + 16 * static_cast<size_t>(n);
}

// CUB scratch for the feature sort and the segment scan (the larger of the two).
bool grad_weight_temp(const LaunchEnv* e, int64_t cap, int end_bit, size_t* bytes) {
  size_t sort = 0, scan = 0;
  const int n = static_cast<int>(cap);
  const bool ok = device_query(e, [&] {
    cub::DoubleBuffer<uint32_t> k(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> v(nullptr, nullptr);
    cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, sort, k, v, n, 0, end_bit);
    if (e != cudaSuccess) return e;
    return cub::DeviceScan::InclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr),
                                         static_cast<int32_t*>(nullptr), n);
  });
  *bytes = std::max(sort, scan);
  return ok;
}

GradWeightLayout grad_weight_layout(std::byte* base, int64_t cap, size_t temp_bytes) {
  Carve c{base};
  GradWeightLayout L{};
  const auto n = static_cast<size_t>(cap);
  L.row_of = c.take<int32_t>(n);
  L.keys[0] = c.take<uint32_t>(n);
  L.keys[1] = c.take<uint32_t>(n);
  L.vals[0] = c.take<int32_t>(n);
  L.vals[1] = c.take<int32_t>(n);
  L.flags = c.take<int32_t>(n);
  L.seg = c.take<int32_t>(n);
  L.start = c.take<int32_t>(n + 1);
  L.temp = c.take<std::byte>(temp_bytes);
  L.temp_bytes = temp_bytes;
  L.total = c.used;
  return L;
}

// The feature count bounds the sort keys (and gives the junk key, F, that
// sorts last). Without the attribute, any non-negative int32 id is possible.
int64_t features_of(const KernelArgs& a) {
  const int64_t F = a.attrs.geti("features", 0);
  return F > 0 ? F : int64_t{INT_MAX} - 1;
}

size_t sparse_linear_grad_weight_ws(const KernelArgs& a) {
  const int64_t cap = a.in[1].shape[0], F = features_of(a);
  size_t temp = 0;
  if (cap > 0 && (cap >= INT_MAX || !grad_weight_temp(planned_env(a), cap, bits_for(F), &temp)))
    temp = sort_scan_fallback(cap);
  return grad_weight_layout(nullptr, cap, temp).total;
}

void sparse_linear_grad_weight(const KernelArgs& a) {
  if (!f32_only(a, "sparse_linear_grad_weight")) return;
  const int32_t* ptr = a.in[0].as<const int32_t>();
  const int32_t* idx = a.in[1].as<const int32_t>();
  const float* val = a.in[2].as<const float>();
  const float* dy = a.in[3].as<const float>();
  int32_t* rows = a.out[0].as<int32_t>();
  float* dwr = a.out[1].as<float>();
  float* db = a.out[2].as<float>();
  const int64_t B = a.in[3].shape[0], O = a.in[3].shape[1], cap = a.in[1].shape[0];
  const int64_t F = features_of(a);
  const cudaStream_t s = stream_of(a);
  if (cap >= INT_MAX || F >= INT_MAX) {
    report("sparse_linear_grad_weight: capacity %lld or features %lld exceeds 2^31-1",
           static_cast<long long>(cap), static_cast<long long>(F));
    return;
  }
  if (O > 0) {
    column_sums_in_order_kernel<<<grid_for(O, kThreads), kThreads, 0, s>>>(dy, B, O, db);
    if (!launched("column_sums_in_order_kernel")) return;
  }
  if (cap == 0) {
    set_int_kernel<<<1, 1, 0, s>>>(rows, 0);
    launched("set_int_kernel");
    return;
  }
  const int end_bit = bits_for(F);
  size_t temp = 0;
  if (!grad_weight_temp(launch_env_of(a), cap, end_bit, &temp)) {
    report("sparse_linear_grad_weight: CUB could not size its scratch on this device");
    return;
  }
  const GradWeightLayout L = grad_weight_layout(static_cast<std::byte*>(a.workspace), cap, temp);
  if (L.total > a.workspace_bytes) {
    report("sparse_linear_grad_weight: needs %zu workspace bytes, has %zu", L.total,
           a.workspace_bytes);
    return;
  }
  const unsigned grid = grid_for(cap, kThreads);
  entry_keys_kernel<<<grid, kThreads, 0, s>>>(ptr, B, idx, cap, static_cast<int32_t>(F), L.row_of,
                                              L.keys[0], L.vals[0]);
  if (!launched("entry_keys_kernel")) return;
  // Radix sort is stable: equal features keep their entry order.
  cub::DoubleBuffer<uint32_t> keys(L.keys[0], L.keys[1]);
  cub::DoubleBuffer<int32_t> vals(L.vals[0], L.vals[1]);
  size_t tb = L.temp_bytes;
  if (!cuda_ok(cub::DeviceRadixSort::SortPairs(L.temp, tb, keys, vals, static_cast<int>(cap), 0,
                                               end_bit, s),
               "cub::DeviceRadixSort::SortPairs"))
    return;
  segment_heads_kernel<<<grid, kThreads, 0, s>>>(keys.Current(), cap, static_cast<uint32_t>(F),
                                                 L.flags);
  if (!launched("segment_heads_kernel")) return;
  tb = L.temp_bytes;
  if (!cuda_ok(cub::DeviceScan::InclusiveSum(L.temp, tb, L.flags, L.seg, static_cast<int>(cap), s),
               "cub::DeviceScan::InclusiveSum"))
    return;
  segment_table_kernel<<<grid, kThreads, 0, s>>>(keys.Current(), L.flags, L.seg, cap, ptr, B, rows,
                                                 L.start);
  if (!launched("segment_table_kernel")) return;
  const int64_t R = a.out[1].shape[0];  // min(F, N): the most rows the batch can touch
  if (O == 0 || R == 0) return;
  const dim3 g(static_cast<unsigned>(std::min<int64_t>(ceil_div(O, 128), 1024)),
               static_cast<unsigned>(std::min<int64_t>(R, 65535)));
  segment_sums_kernel<<<g, 128, 0, s>>>(rows, L.start, vals.Current(), L.row_of, val, dy, dwr, O);
  launched("segment_sums_kernel");
}

// ---- ffi: shared layout -------------------------------------------------------

// x (or dy) transposed into [rows][Bp] with Bp = B rounded up to 4 and the
// pad zero, so a lane's float4 of 4 batch rows is one aligned load. Lanes
// work in groups of 8 covering 32 batch rows (a chunk).
constexpr int kGroup = 8;
constexpr int kChunk = 32;

int64_t padded_batch(int64_t B) {
  return (B + 3) / 4 * 4;
}

// Four consecutive index entries; the vector path needs 4 | K and a base
// aligned to 4 entries.
template <class I, bool kVec>
__device__ __forceinline__ void load_index4(const I* p, uint32_t (&h)[4]) {
  if constexpr (kVec && sizeof(I) == 2) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    h[0] = u.x & 0xFFFFu;
    h[1] = u.x >> 16;
    h[2] = u.y & 0xFFFFu;
    h[3] = u.y >> 16;
  } else if constexpr (kVec) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    h[0] = u.x;
    h[1] = u.y;
    h[2] = u.z;
    h[3] = u.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = static_cast<uint32_t>(p[j]);
  }
}

template <bool kVec>
__device__ __forceinline__ float4 load_w4(const float* p) {
  if constexpr (kVec) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    return make_float4(p[0], p[1], p[2], p[3]);
  }
}

__device__ __forceinline__ void fma4(float4& acc, const float4 x, float w) {
  acc.x = fmaf(x.x, w, acc.x);
  acc.y = fmaf(x.y, w, acc.y);
  acc.z = fmaf(x.z, w, acc.z);
  acc.w = fmaf(x.w, w, acc.w);
}

template <class I>
bool vector_ok(const I* index, const float* w, int64_t K) {
  return K % 4 == 0 && reinterpret_cast<uintptr_t>(index) % (4 * sizeof(I)) == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

unsigned label_tile_blocks(int64_t L, int warps_per_block) {
  const int64_t tiles = ceil_div(L, 32);
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(ceil_div(tiles, warps_per_block), int64_t{sm_count()} * 16)));
}

// ---- ffi_linear --------------------------------------------------------------

constexpr int kFfiWarps = 8;

// Each warp takes tiles of 32 labels; its four 8-lane groups take four labels
// at a time, each lane 4 batch rows of a 32-row chunk. Results go through a
// shared [32 rows][32 labels] tile so y is written a 128-byte row segment at
// a time. Each output sums its K products in slot order, then adds the bias.
template <class I, bool kVec>
__global__ void __launch_bounds__(kFfiWarps * 32)
    ffi_linear_kernel(const float* __restrict__ xt, const I* __restrict__ index,
                      const float* __restrict__ w, const float* __restrict__ bias,
                      float* __restrict__ y, int64_t B, int64_t Bp, int64_t L, int64_t K) {
  __shared__ float tile[kFfiWarps][kChunk][33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane / kGroup, gl = lane % kGroup;
  const int64_t stride = int64_t{gridDim.x} * kFfiWarps * 32;
  for (int64_t l0 = (int64_t{blockIdx.x} * kFfiWarps + warp) * 32; l0 < L; l0 += stride) {
    for (int64_t b0 = 0; b0 < B; b0 += kChunk) {
      const int64_t b = b0 + gl * 4;
      const bool active = b < Bp;
      for (int round = 0; round < 8; ++round) {
        const int ll = round * 4 + group;
        const int64_t l = l0 + ll;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (active && l < L) {
          const I* il = index + l * K;
          const float* wl = w + l * K;
          int64_t k = 0;
          for (; k + 4 <= K; k += 4) {
            uint32_t h[4];
            load_index4<I, kVec>(il + k, h);
            const float4 wk = load_w4<kVec>(wl + k);
            const float4 x0 = *reinterpret_cast<const float4*>(xt + int64_t{h[0]} * Bp + b);
            const float4 x1 = *reinterpret_cast<const float4*>(xt + int64_t{h[1]} * Bp + b);
            const float4 x2 = *reinterpret_cast<const float4*>(xt + int64_t{h[2]} * Bp + b);
            const float4 x3 = *reinterpret_cast<const float4*>(xt + int64_t{h[3]} * Bp + b);
            fma4(acc, x0, wk.x);
            fma4(acc, x1, wk.y);
            fma4(acc, x2, wk.z);
            fma4(acc, x3, wk.w);
          }
          for (; k < K; ++k) {
            const float4 xv = *reinterpret_cast<const float4*>(
                xt + int64_t{static_cast<uint32_t>(il[k])} * Bp + b);
            fma4(acc, xv, wl[k]);
          }
          const float bl = bias[l];
          acc.x += bl;
          acc.y += bl;
          acc.z += bl;
          acc.w += bl;
        }
        tile[warp][gl * 4 + 0][ll] = acc.x;
        tile[warp][gl * 4 + 1][ll] = acc.y;
        tile[warp][gl * 4 + 2][ll] = acc.z;
        tile[warp][gl * 4 + 3][ll] = acc.w;
      }
      __syncwarp();
      const int64_t rows = B - b0 < kChunk ? B - b0 : kChunk;
      if (l0 + lane < L)
        for (int r = 0; r < rows; ++r) y[(b0 + r) * L + l0 + lane] = tile[warp][r][lane];
      __syncwarp();
    }
  }
}

size_t ffi_xt_bytes(int64_t B, int64_t H) {
  return align_up(static_cast<size_t>(H * padded_batch(B)) * sizeof(float));
}

size_t ffi_linear_ws(const KernelArgs& a) {
  return ffi_xt_bytes(a.in[0].shape[0], a.in[0].shape[1]);
}

template <class I>
void ffi_linear_t(const KernelArgs& a) {
  const float* x = a.in[0].as<const float>();
  const I* index = a.in[1].as<const I>();
  const float* w = a.in[2].as<const float>();
  const float* bias = a.in[3].as<const float>();
  float* y = a.out[0].as<float>();
  const int64_t B = a.in[0].shape[0], H = a.in[0].shape[1];
  const int64_t L = a.in[1].shape[0], K = a.in[1].shape[1];
  if (B == 0 || L == 0) return;
  const cudaStream_t s = stream_of(a);
  const int64_t Bp = padded_batch(B);
  float* xt = static_cast<float*>(a.workspace);
  if (K > 0 && !transpose_pad(x, B, H, H, xt, Bp, Bp, s)) return;
  const unsigned grid = label_tile_blocks(L, kFfiWarps);
  if (vector_ok(index, w, K))
    ffi_linear_kernel<I, true><<<grid, kFfiWarps * 32, 0, s>>>(xt, index, w, bias, y, B, Bp, L, K);
  else
    ffi_linear_kernel<I, false><<<grid, kFfiWarps * 32, 0, s>>>(xt, index, w, bias, y, B, Bp, L, K);
  launched("ffi_linear_kernel");
}

void ffi_linear(const KernelArgs& a) {
  if (!f32_only(a, "ffi_linear")) return;
  if (a.in[1].dtype == DType::u16) return ffi_linear_t<uint16_t>(a);
  if (a.in[1].dtype == DType::i32) return ffi_linear_t<int32_t>(a);
  report("ffi_linear: index dtype %s (u16 or i32 expected)", dtype_name(a.in[1].dtype));
}

// ---- ffi_grad_weight -----------------------------------------------------------

// The forward's layout: a group of 8 lanes per label, each lane 4 batch rows
// per 32-row chunk. dw[l,k] = Σ_b dy[b,l]·x[b, index[l,k]]: each lane sums
// its rows (chunk by chunk, in order), then the group adds its 8 partial sums
// in a fixed butterfly. A label whose dy is zero in every row gets dw = 0
// without reading x (as the CPU kernel, this drops 0·Inf terms).
template <class I>
__global__ void __launch_bounds__(kFfiWarps * 32)
    ffi_grad_weight_kernel(const float* __restrict__ dy, const float* __restrict__ xt,
                           const I* __restrict__ index, float* __restrict__ dw,
                           float* __restrict__ db, int64_t B, int64_t Bp, int64_t L, int64_t K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane / kGroup, gl = lane % kGroup;
  const unsigned gmask = 0xFFu << (group * kGroup);
  const int64_t stride = int64_t{gridDim.x} * kFfiWarps * 32;
  const int64_t chunks = (B + kChunk - 1) / kChunk;
  for (int64_t l0 = (int64_t{blockIdx.x} * kFfiWarps + warp) * 32; l0 < L; l0 += stride) {
    for (int round = 0; round < 8; ++round) {
      const int64_t l = l0 + round * 4 + group;
      if (l >= L) continue;  // the whole group skips together
      // The lane's dy values of chunk 0 stay in registers; later chunks are
      // read again where needed (they are in L1 by then).
      float d0[4];
      bool any = false;
      double dsum = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t b = c * kChunk + gl * 4 + j;
          const float v = b < B ? dy[b * L + l] : 0.0f;
          if (c == 0) d0[j] = v;
          any |= v != 0.0f;
          dsum += static_cast<double>(v);
        }
      }
      for (int o = 4; o > 0; o >>= 1) dsum += __shfl_xor_sync(gmask, dsum, o);
      if (gl == 0) db[l] = static_cast<float>(dsum);
      any = __any_sync(gmask, any);
      float* dwl = dw + l * K;
      if (!any) {
        for (int64_t k = gl; k < K; k += kGroup) dwl[k] = 0.0f;
        continue;
      }
      const I* il = index + l * K;
      const int64_t bl = gl * 4;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t h = static_cast<uint32_t>(il[k]);
        const float* xh = xt + h * Bp;
        float p = 0.0f;
        if (bl < Bp) {
          const float4 xv = *reinterpret_cast<const float4*>(xh + bl);
          p = fmaf(d0[0], xv.x, p);
          p = fmaf(d0[1], xv.y, p);
          p = fmaf(d0[2], xv.z, p);
          p = fmaf(d0[3], xv.w, p);
        }
        for (int64_t c = 1; c < chunks; ++c) {
          const int64_t b = c * kChunk + bl;
          if (b >= Bp) break;
          const float4 xv = *reinterpret_cast<const float4*>(xh + b);
          const float e0 = dy[b * L + l];
          const float e1 = b + 1 < B ? dy[(b + 1) * L + l] : 0.0f;
          const float e2 = b + 2 < B ? dy[(b + 2) * L + l] : 0.0f;
          const float e3 = b + 3 < B ? dy[(b + 3) * L + l] : 0.0f;
          p = fmaf(e0, xv.x, p);
          p = fmaf(e1, xv.y, p);
          p = fmaf(e2, xv.z, p);
          p = fmaf(e3, xv.w, p);
        }
        for (int o = 4; o > 0; o >>= 1) p += __shfl_xor_sync(gmask, p, o);
        if (gl == (k & (kGroup - 1))) dwl[k] = p;
      }
    }
  }
}

size_t ffi_grad_weight_ws(const KernelArgs& a) {
  return ffi_xt_bytes(a.in[1].shape[0], a.in[1].shape[1]);
}

template <class I>
void ffi_grad_weight_t(const KernelArgs& a) {
  const float* dy = a.in[0].as<const float>();
  const float* x = a.in[1].as<const float>();
  const I* index = a.in[2].as<const I>();
  float* dw = a.out[0].as<float>();
  float* db = a.out[1].as<float>();
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1];
  const int64_t H = a.in[1].shape[1], K = a.in[2].shape[1];
  if (L == 0) return;
  const cudaStream_t s = stream_of(a);
  const int64_t Bp = padded_batch(B);
  float* xt = static_cast<float*>(a.workspace);
  if (K > 0 && B > 0 && !transpose_pad(x, B, H, H, xt, Bp, Bp, s)) return;
  ffi_grad_weight_kernel<I><<<label_tile_blocks(L, kFfiWarps), kFfiWarps * 32, 0, s>>>(
      dy, xt, index, dw, db, B, Bp, L, K);
  launched("ffi_grad_weight_kernel");
}

void ffi_grad_weight(const KernelArgs& a) {
  if (!f32_only(a, "ffi_grad_weight")) return;
  if (a.in[2].dtype == DType::u16) return ffi_grad_weight_t<uint16_t>(a);
  if (a.in[2].dtype == DType::i32) return ffi_grad_weight_t<int32_t>(a);
  report("ffi_grad_weight: index dtype %s (u16 or i32 expected)", dtype_name(a.in[2].dtype));
}

// ---- ffi_grad_input: atomic ----------------------------------------------------

// Each warp stages a [32 rows][32 labels] tile of dy (coalesced), then for
// each label its lanes (one batch row each) add dy·w into dxt[h][b] for the
// label's K slots: 32 lanes, 32 consecutive floats, one reduction request.
// Labels whose dy is zero in all 32 rows are skipped.
constexpr int kAtomicWarps = 8;

template <class I>
__global__ void __launch_bounds__(kAtomicWarps * 32)
    ffi_scatter_kernel(const float* __restrict__ dy, const I* __restrict__ index,
                       const float* __restrict__ w, float* __restrict__ dxt, int64_t B, int64_t Bp,
                       int64_t L, int64_t K) {
  __shared__ float tile[kAtomicWarps][kChunk][33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t stride = int64_t{gridDim.x} * kAtomicWarps * 32;
  for (int64_t l0 = (int64_t{blockIdx.x} * kAtomicWarps + warp) * 32; l0 < L; l0 += stride) {
    for (int64_t b0 = 0; b0 < B; b0 += kChunk) {
      const int rows = B - b0 < kChunk ? static_cast<int>(B - b0) : kChunk;
      for (int r = 0; r < kChunk; ++r)
        tile[warp][r][lane] = r < rows && l0 + lane < L ? dy[(b0 + r) * L + l0 + lane] : 0.0f;
      __syncwarp();
      const int64_t b = b0 + lane;
      for (int ll = 0; ll < 32 && l0 + ll < L; ++ll) {
        const float g = tile[warp][lane][ll];
        if (!__any_sync(kFullMask, g != 0.0f)) continue;
        const int64_t l = l0 + ll;
        const I* il = index + l * K;
        const float* wl = w + l * K;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t h = static_cast<uint32_t>(il[k]);
          if (g != 0.0f && b < Bp) atomicAdd(dxt + h * Bp + b, g * wl[k]);
        }
      }
      __syncwarp();
    }
  }
}

size_t ffi_grad_input_atomic_ws(const KernelArgs& a) {
  return ffi_xt_bytes(a.in[0].shape[0], a.out[0].shape[1]);
}

template <class I>
void ffi_grad_input_atomic_t(const KernelArgs& a) {
  const float* dy = a.in[0].as<const float>();
  const I* index = a.in[1].as<const I>();
  const float* w = a.in[2].as<const float>();
  float* dx = a.out[0].as<float>();
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1];
  const int64_t K = a.in[1].shape[1], H = a.out[0].shape[1];
  if (B == 0 || H == 0) return;
  const cudaStream_t s = stream_of(a);
  const int64_t Bp = padded_batch(B);
  float* dxt = static_cast<float*>(a.workspace);
  if (!cuda_ok(cudaMemsetAsync(dxt, 0, static_cast<size_t>(H * Bp) * sizeof(float), s),
               "cudaMemsetAsync"))
    return;
  if (L > 0 && K > 0) {
    ffi_scatter_kernel<I><<<label_tile_blocks(L, kAtomicWarps), kAtomicWarps * 32, 0, s>>>(
        dy, index, w, dxt, B, Bp, L, K);
    if (!launched("ffi_scatter_kernel")) return;
  }
  transpose_pad(dxt, H, B, Bp, dx, H, H, s);
}

void ffi_grad_input_atomic(const KernelArgs& a) {
  if (!f32_only(a, "ffi_grad_input")) return;
  if (a.in[1].dtype == DType::u16) return ffi_grad_input_atomic_t<uint16_t>(a);
  if (a.in[1].dtype == DType::i32) return ffi_grad_input_atomic_t<int32_t>(a);
  report("ffi_grad_input: index dtype %s (u16 or i32 expected)", dtype_name(a.in[1].dtype));
}

// ---- ffi_grad_input: deterministic ---------------------------------------------

// start[h] = the first sorted slot whose hidden unit is >= h.
template <class K>
__global__ void bucket_starts_kernel(const K* __restrict__ sorted, int64_t S, int64_t H,
                                     int32_t* __restrict__ start) {
  POOCH_GRID_STRIDE(h, H + 1) {
    int64_t lo = 0, hi = S;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(sorted[mid]) < h)
        lo = mid + 1;
      else
        hi = mid;
    }
    start[h] = static_cast<int32_t>(lo);
  }
}

// One warp per hidden unit h, its lanes over batch rows: dx[b,h] sums
// dy[b, l]·w[l,k] over h's slots in ascending (l,k) order, reading dy
// transposed ([L][Bp]) so each slot is one coalesced line. One writer per
// element, a fixed order: deterministic.
__global__ void ffi_gather_grad_kernel(const int32_t* __restrict__ start,
                                       const int32_t* __restrict__ slots,
                                       const float* __restrict__ dyt, const float* __restrict__ w,
                                       float* __restrict__ dx, int64_t B, int64_t Bp, int64_t H,
                                       int64_t K) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t h = blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5); h < H; h += warps) {
    const int32_t t0 = start[h], t1 = start[h + 1];
    for (int64_t b0 = 0; b0 < B; b0 += 32) {
      const int64_t b = b0 + lane;
      float acc = 0.0f;
      if (b < Bp)
        for (int32_t t = t0; t < t1; ++t) {
          const int64_t slot = slots[t];
          acc = fmaf(dyt[(slot / K) * Bp + b], w[slot], acc);
        }
      if (b < B) dx[b * H + h] = acc;
    }
  }
}

template <class I>
struct DetLayout {
  I* keys[2];
  int32_t* vals[2];
  int32_t* start;
  float* dyt;
  void* temp;
  size_t temp_bytes;
  size_t total;
};

template <class I>
DetLayout<I> det_layout(std::byte* base, int64_t S, int64_t H, int64_t L, int64_t Bp, size_t temp) {
  Carve c{base};
  DetLayout<I> d{};
  const auto n = static_cast<size_t>(S);
  d.keys[0] = c.take<I>(n);
  d.keys[1] = c.take<I>(n);
  d.vals[0] = c.take<int32_t>(n);
  d.vals[1] = c.take<int32_t>(n);
  d.start = c.take<int32_t>(static_cast<size_t>(H + 1));
  d.dyt = c.take<float>(static_cast<size_t>(L * Bp));
  d.temp = c.take<std::byte>(temp);
  d.temp_bytes = temp;
  d.total = c.used;
  return d;
}

// Keys as unsigned: the index is non-negative, and so sorts on its low bits.
template <class I>
using SortKey = std::conditional_t<sizeof(I) == 2, uint16_t, uint32_t>;

// Sort bits for hidden units 0..H-1, at most the key's width (a u16 index
// cannot name a unit past 65535, whatever H is).
template <class I>
int det_end_bit(int64_t H) {
  return std::min(bits_for(H > 0 ? H - 1 : 0), static_cast<int>(8 * sizeof(SortKey<I>)));
}

template <class I>
bool det_temp(const LaunchEnv* e, int64_t S, int end_bit, size_t* bytes) {
  return device_query(e, [&] {
    cub::DoubleBuffer<SortKey<I>> k(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> v(nullptr, nullptr);
    return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, k, v, static_cast<int>(S), 0, end_bit);
  });
}

template <class I>
size_t ffi_grad_input_det_ws_t(const KernelArgs& a) {
  const int64_t B = a.in[0].shape[0], L = a.in[1].shape[0], K = a.in[1].shape[1];
  const int64_t H = a.out[0].shape[1], S = L * K;
  size_t temp = 0;
  if (S > 0 && (S > INT_MAX || !det_temp<I>(planned_env(a), S, det_end_bit<I>(H), &temp)))
    temp = sort_scan_fallback(S);
  return det_layout<SortKey<I>>(nullptr, S, H, L, padded_batch(B), temp).total;
}

size_t ffi_grad_input_det_ws(const KernelArgs& a) {
  return a.in[1].dtype == DType::u16 ? ffi_grad_input_det_ws_t<uint16_t>(a)
                                     : ffi_grad_input_det_ws_t<int32_t>(a);
}

template <class I>
void ffi_grad_input_det_t(const KernelArgs& a) {
  using Key = SortKey<I>;
  const float* dy = a.in[0].as<const float>();
  const I* index = a.in[1].as<const I>();
  const float* w = a.in[2].as<const float>();
  float* dx = a.out[0].as<float>();
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1];
  const int64_t K = a.in[1].shape[1], H = a.out[0].shape[1], S = L * K;
  if (B == 0 || H == 0) return;
  const cudaStream_t s = stream_of(a);
  if (S == 0) {
    cuda_ok(cudaMemsetAsync(dx, 0, static_cast<size_t>(B * H) * sizeof(float), s),
            "cudaMemsetAsync");
    return;
  }
  if (S > INT_MAX || H >= INT_MAX) {
    report("ffi_grad_input: %lld slots or %lld hidden units exceed 2^31-1",
           static_cast<long long>(S), static_cast<long long>(H));
    return;
  }
  const int end_bit = det_end_bit<I>(H);
  size_t temp = 0;
  if (!det_temp<I>(launch_env_of(a), S, end_bit, &temp)) {
    report("ffi_grad_input: CUB could not size its scratch on this device");
    return;
  }
  const int64_t Bp = padded_batch(B);
  const DetLayout<Key> d = det_layout<Key>(static_cast<std::byte*>(a.workspace), S, H, L, Bp, temp);
  if (d.total > a.workspace_bytes) {
    report("ffi_grad_input: needs %zu workspace bytes, has %zu", d.total, a.workspace_bytes);
    return;
  }
  // The slots (l,k) sorted by hidden unit; a stable sort keeps each unit's
  // slots in ascending order.
  if (!cuda_ok(cudaMemcpyAsync(d.keys[0], index, static_cast<size_t>(S) * sizeof(Key),
                               cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync"))
    return;
  iota_kernel<<<grid_for(S, kThreads), kThreads, 0, s>>>(d.vals[0], S);
  if (!launched("iota_kernel")) return;
  cub::DoubleBuffer<Key> keys(d.keys[0], d.keys[1]);
  cub::DoubleBuffer<int32_t> vals(d.vals[0], d.vals[1]);
  size_t tb = d.temp_bytes;
  if (!cuda_ok(cub::DeviceRadixSort::SortPairs(d.temp, tb, keys, vals, static_cast<int>(S), 0,
                                               end_bit, s),
               "cub::DeviceRadixSort::SortPairs"))
    return;
  bucket_starts_kernel<Key>
      <<<grid_for(H + 1, kThreads), kThreads, 0, s>>>(keys.Current(), S, H, d.start);
  if (!launched("bucket_starts_kernel")) return;
  if (!transpose_pad(dy, B, L, L, d.dyt, Bp, Bp, s)) return;
  const int warps = 8;
  const unsigned grid = static_cast<unsigned>(
      std::max<int64_t>(1, std::min(ceil_div(H, warps), int64_t{sm_count()} * 32)));
  ffi_gather_grad_kernel<<<grid, warps * 32, 0, s>>>(d.start, vals.Current(), d.dyt, w, dx, B, Bp,
                                                     H, K);
  launched("ffi_gather_grad_kernel");
}

void ffi_grad_input_det(const KernelArgs& a) {
  if (!f32_only(a, "ffi_grad_input")) return;
  if (a.in[1].dtype == DType::u16) return ffi_grad_input_det_t<uint16_t>(a);
  if (a.in[1].dtype == DType::i32) return ffi_grad_input_det_t<int32_t>(a);
  report("ffi_grad_input: index dtype %s (u16 or i32 expected)", dtype_name(a.in[1].dtype));
}

// ---- topk --------------------------------------------------------------------

// A 64-bit key whose unsigned order is the contract's order: the value's
// bits mapped to an increasing unsigned (NaN below -inf, -0 as +0) in the
// high word, the complement of the position in the low word (lower position
// ranks above on ties). Keys of one row are distinct.
__device__ __forceinline__ uint64_t rank_key(float v, int64_t i) {
  uint32_t u;
  if (v != v) {
    u = 0;
  } else {
    const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    u = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<uint64_t>(u) << 32) |
         static_cast<uint32_t>(0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ int64_t key_position(uint64_t key) {
  return static_cast<int64_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

constexpr int kTopkThreads = 1024;
constexpr int kTopkMaxK = 1024;  // winners sorted in shared memory

// One block per row: radix select (8 bits a pass, most significant first) of
// the k-th largest key, then the keys at or above it (exactly k) collected
// and bitonic-sorted descending.
__global__ void __launch_bounds__(kTopkThreads)
    topk_select_kernel(const float* __restrict__ x, float* __restrict__ values,
                       int32_t* __restrict__ indices, int64_t B, int64_t L, int k) {
  __shared__ int hist[256];
  __shared__ uint64_t cand[kTopkMaxK];
  __shared__ uint64_t s_prefix, s_mask;
  __shared__ int s_krem, s_done, s_count;
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const float* row = x + b * L;
    if (threadIdx.x == 0) {
      s_prefix = 0;
      s_mask = 0;
      s_krem = k;
      s_done = 0;
      s_count = 0;
    }
    __syncthreads();
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint64_t prefix = s_prefix, mask = s_mask;
      for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
        const uint64_t key = rank_key(row[i], i);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int krem = s_krem, above = 0, sel = 0;
        for (int d = 255; d >= 0; --d) {
          if (above + hist[d] >= krem) {
            sel = d;
            break;
          }
          above += hist[d];
        }
        krem -= above;
        s_prefix = prefix | (static_cast<uint64_t>(sel) << shift);
        s_mask = mask | (uint64_t{0xFF} << shift);
        s_done = hist[sel] == krem;
        s_krem = krem;
      }
      __syncthreads();
      if (s_done) break;
    }
    const uint64_t prefix = s_prefix, mask = s_mask;
    for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
      const uint64_t key = rank_key(row[i], i);
      if ((key & mask) >= prefix) {
        const int at = atomicAdd(&s_count, 1);
        if (at < kTopkMaxK) cand[at] = key;
      }
    }
    __syncthreads();
    int n = 1;
    while (n < k) n <<= 1;
    for (int i = k + threadIdx.x; i < n; i += blockDim.x) cand[i] = 0;  // below every key
    __syncthreads();
    // Bitonic sort, descending.
    for (int size = 2; size <= n; size <<= 1)
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
          const int j = i ^ stride;
          if (j > i) {
            const bool desc = (i & size) == 0;
            const uint64_t u = cand[i], v = cand[j];
            if (desc ? u < v : u > v) {
              cand[i] = v;
              cand[j] = u;
            }
          }
        }
        __syncthreads();
      }
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
      const int64_t pos = key_position(cand[r]);
      values[b * k + r] = row[pos];
      indices[b * k + r] = static_cast<int32_t>(pos);
    }
    __syncthreads();
  }
}

__global__ void topk_keys_kernel(const float* __restrict__ x, int64_t B, int64_t L,
                                 uint64_t* __restrict__ keys, int32_t* __restrict__ offsets) {
  POOCH_GRID_STRIDE(i, B * L) keys[i] = rank_key(x[i], i % L);
  POOCH_GRID_STRIDE(r, B + 1) offsets[r] = static_cast<int32_t>(r * L);
}

__global__ void topk_extract_kernel(const float* __restrict__ x,
                                    const uint64_t* __restrict__ sorted, int64_t B, int64_t L,
                                    int64_t k, float* __restrict__ values,
                                    int32_t* __restrict__ indices) {
  POOCH_GRID_STRIDE(i, B * k) {
    const int64_t b = i / k, r = i % k;
    const int64_t pos = key_position(sorted[b * L + r]);
    values[i] = x[b * L + pos];
    indices[i] = static_cast<int32_t>(pos);
  }
}

struct TopkLayout {
  uint64_t* keys[2];
  int32_t* offsets;
  void* temp;
  size_t temp_bytes;
  size_t total;
};

TopkLayout topk_layout(std::byte* base, int64_t B, int64_t L, size_t temp) {
  Carve c{base};
  TopkLayout t{};
  t.keys[0] = c.take<uint64_t>(static_cast<size_t>(B * L));
  t.keys[1] = c.take<uint64_t>(static_cast<size_t>(B * L));
  t.offsets = c.take<int32_t>(static_cast<size_t>(B + 1));
  t.temp = c.take<std::byte>(temp);
  t.temp_bytes = temp;
  t.total = c.used;
  return t;
}

bool topk_temp(const LaunchEnv* e, int64_t B, int64_t L, size_t* bytes) {
  return device_query(e, [&] {
    cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
    return cub::DeviceSegmentedRadixSort::SortKeysDescending(
        nullptr, *bytes, k, static_cast<int>(B * L), static_cast<int>(B),
        static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
  });
}

size_t topk_ws(const KernelArgs& a) {
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1], k = a.out[0].shape[1];
  if (k <= kTopkMaxK || B == 0 || B * L > INT_MAX) return 0;
  size_t temp = 0;
  if (!topk_temp(planned_env(a), B, L, &temp)) temp = sort_scan_fallback(B * L);
  return topk_layout(nullptr, B, L, temp).total;
}

void topk(const KernelArgs& a) {
  if (!f32_only(a, "topk")) return;
  const float* x = a.in[0].as<const float>();
  float* values = a.out[0].as<float>();
  int32_t* indices = a.out[1].as<int32_t>();
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1], k = a.out[0].shape[1];
  if (B == 0 || k == 0) return;
  const cudaStream_t s = stream_of(a);
  if (L > INT_MAX) {
    report("topk: %lld labels exceed 2^31-1", static_cast<long long>(L));
    return;
  }
  if (k <= kTopkMaxK) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(B, 65535));
    topk_select_kernel<<<grid, kTopkThreads, 0, s>>>(x, values, indices, B, L, static_cast<int>(k));
    launched("topk_select_kernel");
    return;
  }
  if (B * L > INT_MAX) {
    report("topk: k = %lld needs a full sort of %lld elements (at most 2^31-1)",
           static_cast<long long>(k), static_cast<long long>(B * L));
    return;
  }
  size_t temp = 0;
  if (!topk_temp(launch_env_of(a), B, L, &temp)) {
    report("topk: CUB could not size its scratch on this device");
    return;
  }
  const TopkLayout t = topk_layout(static_cast<std::byte*>(a.workspace), B, L, temp);
  if (t.total > a.workspace_bytes) {
    report("topk: needs %zu workspace bytes, has %zu", t.total, a.workspace_bytes);
    return;
  }
  topk_keys_kernel<<<grid_for(B * L, kThreads), kThreads, 0, s>>>(x, B, L, t.keys[0], t.offsets);
  if (!launched("topk_keys_kernel")) return;
  cub::DoubleBuffer<uint64_t> keys(t.keys[0], t.keys[1]);
  size_t tb = t.temp_bytes;
  if (!cuda_ok(cub::DeviceSegmentedRadixSort::SortKeysDescending(
                   t.temp, tb, keys, static_cast<int>(B * L), static_cast<int>(B),
                   static_cast<const int32_t*>(t.offsets),
                   static_cast<const int32_t*>(t.offsets + 1), 0, 64, s),
               "cub::DeviceSegmentedRadixSort::SortKeysDescending"))
    return;
  topk_extract_kernel<<<grid_for(B * k, kThreads), kThreads, 0, s>>>(x, keys.Current(), B, L, k,
                                                                     values, indices);
  launched("topk_extract_kernel");
}

// ---- scatter_add_rows ---------------------------------------------------------
//
// out = dense (a device copy unless in place), then out[rows[1+i]] += g[i]
// for i < n = rows[0], read on the device: blocks are launched for the
// capacity R and those past n return at once. The ids are distinct (the
// producer lists each row once), so no two threads add into one element; a
// count outside [0, R] is clamped and an id outside [0, F) skipped.

__global__ void scatter_add_rows_kernel(float* __restrict__ out, const int32_t* __restrict__ rows,
                                        int64_t cap, const float* __restrict__ g, int64_t F,
                                        int64_t O) {
  const int64_t c = rows[0];
  const int64_t n = c < 0 ? 0 : (c > cap ? cap : c);
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const int64_t r = rows[1 + i];
    if (r < 0 || r >= F) continue;
    for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < O;
         o += int64_t{gridDim.x} * blockDim.x)
      out[r * O + o] += g[i * O + o];
  }
}

void scatter_add_rows(const KernelArgs& a) {
  if (!f32_only(a, "scatter_add_rows")) return;
  const TensorView& dv = a.in[0];
  const int64_t F = dv.ndim == 2 ? dv.shape[0] : 0;
  const int64_t O = dv.ndim == 2 ? dv.shape[1] : 0;
  const cudaStream_t s = stream_of(a);
  float* out = a.out[0].as<float>();
  const float* dense = dv.as<const float>();
  const size_t bytes = static_cast<size_t>(F * O) * sizeof(float);
  if (out != dense && bytes > 0 &&
      !cuda_ok(cudaMemcpyAsync(out, dense, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"))
    return;
  const int64_t cap = a.in[1].numel() - 1;
  if (cap <= 0 || F == 0 || O == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(O, kThreads), 1024)),
                  static_cast<unsigned>(std::min<int64_t>(cap, 65535)));
  scatter_add_rows_kernel<<<grid, kThreads, 0, s>>>(out, a.in[1].as<const int32_t>(), cap,
                                                    a.in[2].as<const float>(), F, O);
  launched("scatter_add_rows_kernel");
}

// ---- supports ------------------------------------------------------------------

// cuSPARSE is given 32-bit CSR offsets for the capacity and B + 1 rows.
bool supports_sparse_linear_cusparse(const KernelArgs& a) {
  const SpmmShape s = spmm_shape(a);
  return f32_operands(a) && s.cap < INT_MAX && s.B + 1 < INT_MAX;
}
// Entries, features and segment starts are sorted and counted in 32 bits.
bool supports_sparse_grad_weight(const KernelArgs& a) {
  return f32_operands(a) && a.in[1].shape[0] < INT_MAX && features_of(a) < INT_MAX;
}
bool supports_ffi_linear(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype);
}
bool supports_ffi_grad_input_atomic(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype);
}
// The slot sort runs over int-sized counts.
bool supports_ffi_grad_input_det(const KernelArgs& a) {
  return supports_ffi_grad_input_atomic(a) && a.in[1].numel() <= INT_MAX &&
         a.out[0].shape[1] < INT_MAX;
}
bool supports_ffi_grad_weight(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[2].dtype);
}
// Positions are int32; above kTopkMaxK the whole [B, L] is one CUB sort.
bool supports_topk(const KernelArgs& a) {
  const int64_t B = a.in[0].shape[0], L = a.in[0].shape[1], k = a.out[0].shape[1];
  return f32_operands(a) && L <= INT_MAX && (k <= kTopkMaxK || B * L <= INT_MAX);
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_sparse_kernels() {
  using namespace cuda;
  std::vector<KernelVariant> v = {
      // Not bitwise reproducible: two runs of CUSPARSE_SPMM_CSR_ALG2 at batch
      // 32, 135909 features, width 512 differed on an H200 (cuSPARSE 13,
      // pooch-bench-cuda, 2026-12-04); deterministic sessions take rowwise,
      // which was twice as fast there anyway (0.010 against 0.020 ms).
      {"sparse_linear", "cusparse", sparse_linear_cusparse, sparse_linear_cusparse_ws, false,
       supports_sparse_linear_cusparse},
      {"sparse_linear", "rowwise", sparse_linear_rowwise, nullptr, true, f32_operands},
      {"sparse_linear_grad_weight", "sort", sparse_linear_grad_weight, sparse_linear_grad_weight_ws,
       true, supports_sparse_grad_weight},
      {"ffi_linear", "gather", ffi_linear, ffi_linear_ws, true, supports_ffi_linear},
      {"ffi_grad_input", "atomic", ffi_grad_input_atomic, ffi_grad_input_atomic_ws, false,
       supports_ffi_grad_input_atomic},
      {"ffi_grad_input", "deterministic", ffi_grad_input_det, ffi_grad_input_det_ws, true,
       supports_ffi_grad_input_det},
      {"ffi_grad_weight", "sddmm", ffi_grad_weight, ffi_grad_weight_ws, true,
       supports_ffi_grad_weight},
      {"topk", "select", topk, topk_ws, true, supports_topk},
      {"scatter_add_rows", "cuda", scatter_add_rows, nullptr, true, f32_operands},
  };
  // The fused output layer's kernels (ffi_head.cu) belong to this family.
  for (const KernelVariant& f : cuda_ffi_head_kernels()) v.push_back(f);
  return v;
}

}  // namespace pooch::kern
