// CUDA kernels of the convolutional family (docs/OPS.md, "Convolutional")
// through cuDNN 9 (loaded on first use, cudnn_lib.h), NCHW f32.
//
// Everything a call needs from cuDNN (a handle for the device, tensor,
// filter, convolution and pooling descriptors, the convolution algorithm and
// its workspace size) is made when the schedule is planned: the kernel's
// workspace query builds it, keyed by the call's shapes and attributes
// (../common/call_key.h), and the launch only looks it up. Convolutions use
// FMA math (no TF32: results stay comparable with the CPU's) and come in two
// variants: `cudnn`, cuDNN's fastest algorithm for the shapes, and
// `cudnn_det`, the fastest of its deterministic ones, which the planner takes
// when determinism is asked for; either among those whose workspace is
// within workspace_cap (below). Pooling uses cuDNN's deterministic max
// pooling. Batch normalisation in training forms its statistics and moves
// the running averages (unbiased variance, as PyTorch) in kernels of its own
// and normalises with them itself (below); inference and the backward are
// cuDNN's spatial mode.
#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../common/call_key.h"
#include "../common/conv_geom.h"
#include "../common/supports.h"
#include "common.cuh"
#include "cudnn_lib.h"

namespace pooch::kern {
namespace cuda {
namespace {

// ---- handles and prepared calls ---------------------------------------------------

struct HandleSlot {
  cudnnHandle_t h = nullptr;
  std::mutex mu;  // one launch at a time binds it to its stream
};

int device_of(const KernelArgs& a) {
  if (a.device) return static_cast<const LaunchEnv*>(a.device)->device;
  const LaunchEnv* e = current_launch_env();
  return e ? e->device : 0;
}

// The device's cuDNN handle, created on first request (normally while
// planning); null (and *why) when cuDNN cannot create one.
HandleSlot* handle_for(int device, std::string* why) {
  static std::mutex mu;
  static auto* slots = new std::unordered_map<int, std::unique_ptr<HandleSlot>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = slots->find(device);
  if (it != slots->end()) return it->second.get();
  if (!load_cudnn(why)) return nullptr;
  int before = 0;
  cudaGetDevice(&before);
  cudaSetDevice(device);
  auto slot = std::make_unique<HandleSlot>();
  const cudnnStatus_t st = cudnn().cudnnCreate(&slot->h);
  cudaSetDevice(before);
  if (st != CUDNN_STATUS_SUCCESS) {
    if (why) *why = std::string("cudnnCreate: ") + cudnn().cudnnGetErrorString(st);
    return nullptr;
  }
  HandleSlot* p = slot.get();
  slots->emplace(device, std::move(slot));
  return p;
}

struct Prepared {
  bool ok = false;
  char why[240] = {};
  cudnnTensorDescriptor_t a = nullptr, b = nullptr, c = nullptr;  // roles per op (below)
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;
  int algo = 0;
  size_t ws = 0;
};

using Builder = void (*)(const KernelArgs&, cudnnHandle_t, bool det, Prepared&);

bool check(cudnnStatus_t st, const char* call, Prepared& p) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  if (p.why[0] == 0)
    std::snprintf(p.why, sizeof p.why, "%s: %s", call, cudnn().cudnnGetErrorString(st));
  return false;
}

// The prepared call for these operands (built on first sight).
Prepared& prepared(const char* op, bool det, const KernelArgs& a, Builder build) {
  static std::mutex mu;
  // An ordered map: its transparent lookup by string_view is C++14 (the
  // CUDA sources are C++17; unordered_map's is C++20).
  static auto* cache = new std::map<std::string, std::unique_ptr<Prepared>, std::less<>>();
  CallKey k = call_key(op, a);
  k.add("|det=%d|dev=%d", det ? 1 : 0, device_of(a));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k.view());
  if (it != cache->end()) return *it->second;
  auto p = std::make_unique<Prepared>();
  std::string why;
  if (HandleSlot* slot = handle_for(device_of(a), &why)) {
    p->ok = true;
    build(a, slot->h, det, *p);
  } else {
    std::snprintf(p->why, sizeof p->why, "%s", why.c_str());
  }
  Prepared& ref = *p;
  cache->emplace(std::string(k.view()), std::move(p));
  return ref;
}

cudnnTensorDescriptor_t tensor4(const int64_t* s, int rank, Prepared& p) {
  cudnnTensorDescriptor_t d = nullptr;
  if (!check(cudnn().cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor", p))
    return nullptr;
  const int n = static_cast<int>(s[0]), c = static_cast<int>(s[1]);
  const int h = rank == 4 ? static_cast<int>(s[2]) : 1, w = rank == 4 ? static_cast<int>(s[3]) : 1;
  p.ok = p.ok && check(cudnn().cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n,
                                                          c, h, w),
                       "cudnnSetTensor4dDescriptor", p);
  return d;
}
cudnnTensorDescriptor_t tensor4(const TensorView& t, Prepared& p) {
  return tensor4(t.shape, t.ndim, p);
}

// Runs `body(handle)` with the device's handle bound to the launch's stream;
// reports a failure through the launch environment.
template <class F>
void with_handle(const KernelArgs& a, const char* op, const Prepared& p, F&& body) {
  if (!p.ok) {
    report("%s: %s", op, p.why[0] ? p.why : "cuDNN could not prepare the call");
    return;
  }
  HandleSlot* slot = handle_for(device_of(a), nullptr);
  if (!slot) {
    report("%s: no cuDNN handle", op);
    return;
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  cudnnStatus_t st = cudnn().cudnnSetStream(slot->h, stream_of(a));
  if (st == CUDNN_STATUS_SUCCESS) st = body(slot->h);
  if (st != CUDNN_STATUS_SUCCESS) report("%s: %s", op, cudnn().cudnnGetErrorString(st));
}

const float kOne = 1.0f, kZero = 0.0f;

// ---- convolution -----------------------------------------------------------------

// The convolution descriptor and the filter of w[O, C/g, KH, KW].
void conv_descs(const KernelArgs& a, const TensorView& w, Prepared& p) {
  const Window win = window_of(a.attrs);
  p.ok = p.ok && check(cudnn().cudnnCreateFilterDescriptor(&p.w), "cudnnCreateFilterDescriptor", p);
  p.ok = p.ok && check(cudnn().cudnnSetFilter4dDescriptor(
                           p.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(w.shape[0]),
                           static_cast<int>(w.shape[1]), static_cast<int>(w.shape[2]),
                           static_cast<int>(w.shape[3])),
                       "cudnnSetFilter4dDescriptor", p);
  p.ok = p.ok && check(cudnn().cudnnCreateConvolutionDescriptor(&p.conv),
                       "cudnnCreateConvolutionDescriptor", p);
  p.ok = p.ok &&
         check(cudnn().cudnnSetConvolution2dDescriptor(
                   p.conv, static_cast<int>(win.ph), static_cast<int>(win.pw),
                   static_cast<int>(win.sh), static_cast<int>(win.sw), static_cast<int>(win.dh),
                   static_cast<int>(win.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
               "cudnnSetConvolution2dDescriptor", p);
  p.ok = p.ok && check(cudnn().cudnnSetConvolutionGroupCount(p.conv, static_cast<int>(win.groups)),
                       "cudnnSetConvolutionGroupCount", p);
  // FMA math: no TF32 on Ampere and later.
  p.ok = p.ok && check(cudnn().cudnnSetConvolutionMathType(p.conv, CUDNN_FMA_MATH),
                       "cudnnSetConvolutionMathType", p);
}

// The most workspace a convolution may ask for: its largest operand, or
// 16 MiB where every operand is smaller. cuDNN's heuristics rank algorithms
// by speed alone, and some (FFT, non-fused Winograd) ask for workspaces many
// times their operands; the workspace is planned in the arena for its launch,
// so one such pick can keep a program from a budget its tensors fit. (On an
// H200, ResNet-50 at 128 pixels, batch 32, was refused at a third of its
// arena, needing 332 MiB where the CPU plans the same layout's programs in
// 244; the workspaces are the part that differs; not yet confirmed on the
// card.) A cap that depends on the shapes alone, not on
// the budget, keeps the same algorithm, and so the same bits, at every
// budget.
size_t workspace_cap(const KernelArgs& a) {
  int64_t largest = 0;
  for (int i = 0; i < a.n_in; ++i) largest = std::max(largest, a.in[i].numel());
  for (int i = 0; i < a.n_out; ++i) largest = std::max(largest, a.out[i].numel());
  return std::max(static_cast<size_t>(largest) * sizeof(float), size_t{16} << 20);
}

// The first algorithm cuDNN ranks that works (and, `det`, is deterministic)
// whose workspace (`ws_of(algo, &bytes)`) is within `cap`; where none is, the
// one of those with the smallest workspace. Sets p.algo and p.ws.
template <class Perf, class WsOf>
bool pick(const Perf* perf, int n, bool det, size_t cap, WsOf ws_of, Prepared& p) {
  int fallback = -1;
  size_t fallback_ws = 0;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS ||
        (det && perf[i].determinism != CUDNN_DETERMINISTIC))
      continue;
    size_t ws = 0;
    if (ws_of(perf[i].algo, &ws) != CUDNN_STATUS_SUCCESS) continue;
    if (ws <= cap) {
      p.algo = static_cast<int>(perf[i].algo);
      p.ws = ws;
      return true;
    }
    if (fallback < 0 || ws < fallback_ws) {
      fallback = static_cast<int>(perf[i].algo);
      fallback_ws = ws;
    }
  }
  if (fallback >= 0) {
    p.algo = fallback;
    p.ws = fallback_ws;
    return true;
  }
  std::snprintf(p.why, sizeof p.why, "cuDNN offers no %salgorithm for these shapes",
                det ? "deterministic " : "");
  return false;
}

// a = x, b = y, c = bias [1, O, 1, 1].
void build_conv(const KernelArgs& a, cudnnHandle_t h, bool det, Prepared& p) {
  p.a = tensor4(a.in[0], p);
  p.b = tensor4(a.out[0], p);
  const int64_t bias_shape[4] = {1, a.in[1].shape[0], 1, 1};
  p.c = tensor4(bias_shape, 4, p);
  conv_descs(a, a.in[1], p);
  if (!p.ok) return;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  auto ws_of = [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
    return cudnn().cudnnGetConvolutionForwardWorkspaceSize(h, p.a, p.w, p.conv, p.b, algo, bytes);
  };
  p.ok = check(cudnn().cudnnGetConvolutionForwardAlgorithm_v7(
                   h, p.a, p.w, p.conv, p.b, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf),
               "cudnnGetConvolutionForwardAlgorithm_v7", p) &&
         pick(perf, n, det, workspace_cap(a), ws_of, p);
}

// a = dx, b = dy.
void build_conv_grad_input(const KernelArgs& a, cudnnHandle_t h, bool det, Prepared& p) {
  p.a = tensor4(a.out[0], p);
  p.b = tensor4(a.in[0], p);
  conv_descs(a, a.in[1], p);
  if (!p.ok) return;
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int n = 0;
  auto ws_of = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
    return cudnn().cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.b, p.conv, p.a, algo,
                                                                bytes);
  };
  p.ok = check(cudnn().cudnnGetConvolutionBackwardDataAlgorithm_v7(
                   h, p.w, p.b, p.conv, p.a, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf),
               "cudnnGetConvolutionBackwardDataAlgorithm_v7", p) &&
         pick(perf, n, det, workspace_cap(a), ws_of, p);
}

// a = x, b = dy, c = db [1, O, 1, 1]; the filter is dw's.
void build_conv_grad_weight(const KernelArgs& a, cudnnHandle_t h, bool det, Prepared& p) {
  p.a = tensor4(a.in[1], p);
  p.b = tensor4(a.in[0], p);
  const int64_t bias_shape[4] = {1, a.out[0].shape[0], 1, 1};
  p.c = tensor4(bias_shape, 4, p);
  conv_descs(a, a.out[0], p);
  if (!p.ok) return;
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int n = 0;
  auto ws_of = [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
    return cudnn().cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.a, p.b, p.conv, p.w, algo,
                                                                  bytes);
  };
  p.ok = check(cudnn().cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                   h, p.a, p.b, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
               "cudnnGetConvolutionBackwardFilterAlgorithm_v7", p) &&
         pick(perf, n, det, workspace_cap(a), ws_of, p);
}

template <bool Det>
void conv2d(const KernelArgs& a) {
  const Prepared& p = prepared("conv2d", Det, a, build_conv);
  with_handle(a, "conv2d", p, [&](cudnnHandle_t h) {
    cudnnStatus_t st =
        cudnn().cudnnConvolutionForward(h, &kOne, p.a, a.in[0].data, p.w, a.in[1].data, p.conv,
                                        static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), a.workspace,
                                        p.ws, &kZero, p.b, a.out[0].data);
    if (st == CUDNN_STATUS_SUCCESS && a.n_in > 2)
      st = cudnn().cudnnAddTensor(h, &kOne, p.c, a.in[2].data, &kOne, p.b, a.out[0].data);
    return st;
  });
}

template <bool Det>
void conv2d_grad_input(const KernelArgs& a) {
  const Prepared& p = prepared("conv2d_grad_input", Det, a, build_conv_grad_input);
  with_handle(a, "conv2d_grad_input", p, [&](cudnnHandle_t h) {
    return cudnn().cudnnConvolutionBackwardData(h, &kOne, p.w, a.in[1].data, p.b, a.in[0].data,
                                                p.conv,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo),
                                                a.workspace, p.ws, &kZero, p.a, a.out[0].data);
  });
}

template <bool Det>
void conv2d_grad_weight(const KernelArgs& a) {
  const Prepared& p = prepared("conv2d_grad_weight", Det, a, build_conv_grad_weight);
  with_handle(a, "conv2d_grad_weight", p, [&](cudnnHandle_t h) {
    cudnnStatus_t st = cudnn().cudnnConvolutionBackwardFilter(
        h, &kOne, p.a, a.in[1].data, p.b, a.in[0].data, p.conv,
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), a.workspace, p.ws, &kZero, p.w,
        a.out[0].data);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnn().cudnnConvolutionBackwardBias(h, &kOne, p.b, a.in[0].data, &kZero, p.c,
                                                a.out[1].data);
    return st;
  });
}

template <bool Det, void (*Build)(const KernelArgs&, cudnnHandle_t, bool, Prepared&)>
size_t prepared_workspace(const KernelArgs& a, const char* op) {
  const Prepared& p = prepared(op, Det, a, Build);
  return p.ok ? p.ws : 0;
}

template <bool Det>
size_t conv2d_ws(const KernelArgs& a) {
  return prepared_workspace<Det, build_conv>(a, "conv2d");
}
template <bool Det>
size_t conv2d_grad_input_ws(const KernelArgs& a) {
  return prepared_workspace<Det, build_conv_grad_input>(a, "conv2d_grad_input");
}
template <bool Det>
size_t conv2d_grad_weight_ws(const KernelArgs& a) {
  return prepared_workspace<Det, build_conv_grad_weight>(a, "conv2d_grad_weight");
}

// ---- batch normalisation ----------------------------------------------------------

// a = x (and y, dy, dx: one shape), b = the per-channel [1, C, 1, 1].
void build_bn(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  const TensorView& x = a.in[0];
  p.a = tensor4(x, p);
  p.ok = p.ok && check(cudnn().cudnnCreateTensorDescriptor(&p.b), "cudnnCreateTensorDescriptor", p);
  p.ok = p.ok && check(cudnn().cudnnDeriveBNTensorDescriptor(p.b, p.a, CUDNN_BATCHNORM_SPATIAL),
                       "cudnnDeriveBNTensorDescriptor", p);
}

// cuDNN's training-mode statistics are one f32 pass (E[x²] − E[x]²), which
// cancels where the mean is large against the spread: 3% off at x ≈ 100 ±
// 0.01 on an H200 (docs/BENCHMARKS.md). So the batch statistics are ours, as
// the reference forms them: per channel (block c) the mean, then Σ (x −
// mean)², both in double through a fixed tree (the same bits every run);
// cuDNN's backward takes them as the saved statistics. The normalisation is
// ours too, as the CPU's: y = (x − mean_f)·scale_f + shift, mean_f the mean
// rounded to float and shift = β − (mean − mean_f)·scale in double. cuDNN's
// inference mode given the float mean would have lost that rounding (up to
// 3.8e-6 at 100) times scale (116 in the checker's case): 15 times its
// tolerance, worked out on the CPU from the case's inputs.
constexpr int kBnThreads = 512;

// The per-channel terms of the normalisation: y = (x − fmean)·fscale + shift.
struct BnApply {
  float* fmean;
  float* fscale;
  float* shift;
};

// x[N, C, S] (S = H·W, 1 for [N, C]): mean[c] and the biased var[c], and
// the normalisation's terms from γ, β and eps; with rmean, the running
// averages move toward them (the variance's unbiased estimate, PyTorch's
// rule; one value has none and the batch's stands in).
__global__ void bn_batch_stats(const float* x, int64_t N, int64_t C, int64_t S, double mom,
                               const float* gamma, const float* beta, double eps, float* rmean,
                               float* rvar, float* mean, float* var, BnApply norm) {
  __shared__ double scratch[33];
  const int64_t c = blockIdx.x;
  // count <= INT_MAX (supports_cudnn), so 32-bit division finds (n, p).
  const uint32_t count = static_cast<uint32_t>(N * S), s32 = static_cast<uint32_t>(S);
  const auto at = [&](uint32_t j) { return x[(int64_t{j / s32} * C + c) * S + j % s32]; };
  double sum = 0;
  for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) sum += double(at(j));
  const double mu = block_sum(sum, scratch) / double(count > 0 ? count : 1);
  double sq = 0;
  for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) {
    const double d = double(at(j)) - mu;
    sq += d * d;
  }
  sq = block_sum(sq, scratch);
  if (threadIdx.x != 0) return;
  const double v = sq / double(count > 0 ? count : 1);
  mean[c] = float(mu);
  var[c] = float(v);
  const double scale = double(gamma[c]) / sqrt(v + eps);
  const float fmean = float(mu);
  norm.fmean[c] = fmean;
  norm.fscale[c] = float(scale);
  norm.shift[c] = float(double(beta[c]) - (mu - double(fmean)) * scale);
  if (rmean == nullptr) return;
  const double unbiased = count > 1 ? sq / double(count - 1) : v;
  rmean[c] = float((1 - mom) * double(rmean[c]) + mom * mu);
  rvar[c] = float((1 - mom) * double(rvar[c]) + mom * unbiased);
}

// y = (x − fmean[c])·fscale[c] + shift[c], c the channel of element i.
__global__ void bn_apply(const float* x, int64_t total, int64_t C, int64_t S, BnApply norm,
                         float* y) {
  POOCH_GRID_STRIDE(i, total) {
    const int64_t c = i / S % C;
    y[i] = (x[i] - norm.fmean[c]) * norm.fscale[c] + norm.shift[c];
  }
}

// The saved statistic cuDNN's backward wants: 1/√(var + eps).
__global__ void var_to_inv_std(const float* var, int64_t n, double eps, float* inv_std) {
  POOCH_GRID_STRIDE(i, n) inv_std[i] = float(1.0 / sqrt(double(var[i]) + eps));
}

// y from x and the per-channel mean and var (cuDNN's inference mode, for the
// running averages, which are floats already).
cudnnStatus_t bn_normalise(cudnnHandle_t h, const KernelArgs& a, const Prepared& p,
                           const void* mean, const void* var, double eps) {
  return cudnn().cudnnBatchNormalizationForwardInference(
      h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, p.a, a.in[0].data, p.a, a.out[0].data, p.b,
      a.in[1].data, a.in[2].data, mean, var, eps);
}

// The normalisation's terms, 3·C floats of the workspace at `at`.
BnApply bn_terms(float* at, int64_t C) {
  return {at, at + C, at + 2 * C};
}

// Training-mode y: the batch statistics of x into mean and var (and the
// running averages when given), then x normalised with them; false when a
// launch failed (reported).
bool launch_bn_train(const KernelArgs& a, double mom, double eps, float* rmean, float* rvar,
                     float* mean, float* var, BnApply norm) {
  const TensorView& x = a.in[0];
  const int64_t N = x.shape[0], C = x.shape[1], S = x.ndim == 4 ? x.shape[2] * x.shape[3] : 1;
  if (C == 0) return true;  // no channels: nothing to launch (a grid of 0 blocks is an error)
  bn_batch_stats<<<static_cast<unsigned>(C), kBnThreads, 0, stream_of(a)>>>(
      x.as<float>(), N, C, S, mom, a.in[1].as<float>(), a.in[2].as<float>(), eps, rmean, rvar, mean,
      var, norm);
  if (!launched("bn_batch_stats")) return false;
  const int64_t total = N * C * S;
  if (total == 0) return true;
  bn_apply<<<grid_for(total, 256), 256, 0, stream_of(a)>>>(x.as<float>(), total, C, S, norm,
                                                           a.out[0].as<float>());
  return launched("bn_apply");
}

void batchnorm(const KernelArgs& a) {
  const Prepared& p = prepared("batchnorm", false, a, build_bn);
  const double eps = a.attrs.get("eps", 1e-5), mom = a.attrs.get("momentum", 0.1);
  const bool training = !a.ctx || a.ctx->training;
  const int64_t C = a.in[0].shape[1];
  with_handle(a, "batchnorm", p, [&](cudnnHandle_t h) {
    // The statistics (and the running averages) only once the call is known
    // to be possible, so that a refused call changes nothing.
    if (training)
      return launch_bn_train(a, mom, eps, a.in[3].as<float>(), a.in[4].as<float>(),
                             a.out[1].as<float>(), a.out[2].as<float>(),
                             bn_terms(static_cast<float*>(a.workspace), C))
                 ? CUDNN_STATUS_SUCCESS
                 : CUDNN_STATUS_EXECUTION_FAILED;
    const cudnnStatus_t st = bn_normalise(h, a, p, a.in[3].data, a.in[4].data, eps);
    cuda_ok(cudaMemcpyAsync(a.out[1].data, a.in[3].data, static_cast<size_t>(C) * 4,
                            cudaMemcpyDeviceToDevice, stream_of(a)),
            "cudaMemcpyAsync");
    cuda_ok(cudaMemcpyAsync(a.out[2].data, a.in[4].data, static_cast<size_t>(C) * 4,
                            cudaMemcpyDeviceToDevice, stream_of(a)),
            "cudaMemcpyAsync");
    return st;
  });
}

// batchnorm's training output again, for a recompute: the same statistics
// kernel and the same normalisation, the statistics in the workspace and
// the running averages untouched, so nothing of the session changes and y
// has the forward pass's bits.
void batchnorm_replay(const KernelArgs& a) {
  const double eps = a.attrs.get("eps", 1e-5);
  const int64_t C = a.in[0].shape[1];
  float* mean = static_cast<float*>(a.workspace);
  float* var = mean + C;
  launch_bn_train(a, 0.0, eps, nullptr, nullptr, mean, var, bn_terms(var + C, C));
}

// dx, dγ, dβ with the forward's saved mean and variance (cuDNN would
// otherwise form its own one-pass statistics again).
void batchnorm_grad(const KernelArgs& a) {
  const Prepared& p = prepared("batchnorm_grad", false, a, build_bn);
  const double eps = a.attrs.get("eps", 1e-5);
  const int64_t C = a.in[0].shape[1];
  float* inv_std = static_cast<float*>(a.workspace);
  var_to_inv_std<<<grid_for(C, 256), 256, 0, stream_of(a)>>>(a.in[4].as<float>(), C, eps, inv_std);
  if (!launched("var_to_inv_std")) return;
  with_handle(a, "batchnorm_grad", p, [&](cudnnHandle_t h) {
    return cudnn().cudnnBatchNormalizationBackward(
        h, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, p.a, a.in[1].data, p.a,
        a.in[0].data, p.a, a.out[0].data, p.b, a.in[2].data, a.out[1].data, a.out[2].data, eps,
        a.in[3].data, inv_std);
  });
}

// batchnorm: the normalisation's terms (3·C floats); the replay: its
// statistics too (2·C more).
size_t bn_ws(const KernelArgs& a) {
  (void)prepared("batchnorm", false, a, build_bn);
  return 3 * static_cast<size_t>(a.in[0].shape[1]) * sizeof(float);
}
size_t bn_replay_ws(const KernelArgs& a) {
  (void)prepared("batchnorm", false, a, build_bn);
  return 5 * static_cast<size_t>(a.in[0].shape[1]) * sizeof(float);
}
size_t bn_grad_ws(const KernelArgs& a) {
  (void)prepared("batchnorm_grad", false, a, build_bn);
  return static_cast<size_t>(a.in[0].shape[1]) * sizeof(float);
}

// ---- pooling ---------------------------------------------------------------------

// a = the image (x or dx), b = the pooled (y or dy).
void build_pool(const KernelArgs& a, const TensorView& img, const TensorView& pooled,
                cudnnPoolingMode_t mode, const Window& w, Prepared& p) {
  p.a = tensor4(img, p);
  const int64_t ps[4] = {pooled.shape[0], pooled.shape[1], pooled.ndim == 4 ? pooled.shape[2] : 1,
                         pooled.ndim == 4 ? pooled.shape[3] : 1};
  p.b = tensor4(ps, 4, p);
  (void)a;
  p.ok = p.ok &&
         check(cudnn().cudnnCreatePoolingDescriptor(&p.pool), "cudnnCreatePoolingDescriptor", p);
  p.ok = p.ok && check(cudnn().cudnnSetPooling2dDescriptor(
                           p.pool, mode, CUDNN_PROPAGATE_NAN, static_cast<int>(w.kh),
                           static_cast<int>(w.kw), static_cast<int>(w.ph), static_cast<int>(w.pw),
                           static_cast<int>(w.sh), static_cast<int>(w.sw)),
                       "cudnnSetPooling2dDescriptor", p);
}

cudnnPoolingMode_t avg_mode(const KernelArgs& a) {
  return a.attrs.geti("count_include_pad", 1) ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                              : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
}

Window whole(const TensorView& img) {
  Window w;
  w.kh = img.shape[2];
  w.kw = img.shape[3];
  return w;
}

void build_maxpool(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.in[0], a.out[0], CUDNN_POOLING_MAX_DETERMINISTIC, window_of(a.attrs), p);
}
void build_maxpool_grad(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.in[1], a.in[0], CUDNN_POOLING_MAX_DETERMINISTIC, window_of(a.attrs), p);
}
void build_avgpool(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.in[0], a.out[0], avg_mode(a), window_of(a.attrs), p);
}
void build_avgpool_grad(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.out[0], a.in[0], avg_mode(a), window_of(a.attrs), p);
}
void build_gap(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.in[0], a.out[0], CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, whole(a.in[0]), p);
}
void build_gap_grad(const KernelArgs& a, cudnnHandle_t, bool, Prepared& p) {
  build_pool(a, a.out[0], a.in[0], CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, whole(a.out[0]), p);
}

// Forward pooling: y from x.
template <const char* Op, void (*Build)(const KernelArgs&, cudnnHandle_t, bool, Prepared&)>
void pool_fwd(const KernelArgs& a) {
  const Prepared& p = prepared(Op, false, a, Build);
  with_handle(a, Op, p, [&](cudnnHandle_t h) {
    return cudnn().cudnnPoolingForward(h, p.pool, &kOne, p.a, a.in[0].data, &kZero, p.b,
                                       a.out[0].data);
  });
}

// Average pooling backward: dx from dy (cuDNN reads y and x but an average
// does not depend on them: dy and dx stand in).
template <const char* Op, void (*Build)(const KernelArgs&, cudnnHandle_t, bool, Prepared&)>
void avg_bwd(const KernelArgs& a) {
  const Prepared& p = prepared(Op, false, a, Build);
  with_handle(a, Op, p, [&](cudnnHandle_t h) {
    return cudnn().cudnnPoolingBackward(h, p.pool, &kOne, p.b, a.in[0].data, p.b, a.in[0].data, p.a,
                                        a.out[0].data, &kZero, p.a, a.out[0].data);
  });
}

constexpr char kMaxPool[] = "maxpool2d";
constexpr char kAvgPool[] = "avgpool2d";
constexpr char kAvgPoolGrad[] = "avgpool2d_grad";
constexpr char kGap[] = "global_avgpool";
constexpr char kGapGrad[] = "global_avgpool_grad";

void maxpool_grad(const KernelArgs& a) {
  const Prepared& p = prepared("maxpool2d_grad", false, a, build_maxpool_grad);
  with_handle(a, "maxpool2d_grad", p, [&](cudnnHandle_t h) {
    return cudnn().cudnnPoolingBackward(h, p.pool, &kOne, p.b, a.in[2].data, p.b, a.in[0].data, p.a,
                                        a.in[1].data, &kZero, p.a, a.out[0].data);
  });
}

template <const char* Op, void (*Build)(const KernelArgs&, cudnnHandle_t, bool, Prepared&)>
size_t prep_only(const KernelArgs& a) {
  (void)prepared(Op, false, a, Build);
  return 0;
}
constexpr char kMaxPoolGrad[] = "maxpool2d_grad";

// ---- what the kernels take -------------------------------------------------------

// f32, no empty operand (cuDNN rejects zero dimensions), every size within
// cuDNN's int, and cuDNN present.
bool supports_cudnn(const KernelArgs& a) {
  if (!f32_operands(a)) return false;
  for (int i = 0; i < a.n_in; ++i)
    for (int d = 0; d < a.in[i].ndim; ++d)
      if (a.in[i].shape[d] <= 0 || a.in[i].shape[d] > INT_MAX || a.in[i].numel() > INT_MAX)
        return false;
  for (int i = 0; i < a.n_out; ++i)
    for (int d = 0; d < a.out[i].ndim; ++d)
      if (a.out[i].shape[d] <= 0 || a.out[i].numel() > INT_MAX) return false;
  return load_cudnn(nullptr);
}

// cuDNN's batch normalisation takes eps >= CUDNN_BN_MIN_EPSILON.
bool supports_bn(const KernelArgs& a) {
  return supports_cudnn(a) && a.attrs.get("eps", 1e-5) >= CUDNN_BN_MIN_EPSILON;
}

KernelVariant var(const char* op, const char* name, KernelFn fn, WorkspaceFn ws, bool det,
                  SupportsFn s = supports_cudnn) {
  return KernelVariant{op, name, fn, ws, det, s};
}

}  // namespace
}  // namespace cuda

std::vector<KernelVariant> cuda_conv_kernels() {
  using namespace cuda;
  return {
      var("conv2d", "cudnn", conv2d<false>, conv2d_ws<false>, false),
      var("conv2d", "cudnn_det", conv2d<true>, conv2d_ws<true>, true),
      var("conv2d_grad_input", "cudnn", conv2d_grad_input<false>, conv2d_grad_input_ws<false>,
          false),
      var("conv2d_grad_input", "cudnn_det", conv2d_grad_input<true>, conv2d_grad_input_ws<true>,
          true),
      var("conv2d_grad_weight", "cudnn", conv2d_grad_weight<false>, conv2d_grad_weight_ws<false>,
          false),
      var("conv2d_grad_weight", "cudnn_det", conv2d_grad_weight<true>, conv2d_grad_weight_ws<true>,
          true),
      var("batchnorm", "cudnn", batchnorm, bn_ws, true, supports_bn),
      var("batchnorm_replay", "cudnn", batchnorm_replay, bn_replay_ws, true, supports_bn),
      var("batchnorm_grad", "cudnn", batchnorm_grad, bn_grad_ws, true, supports_bn),
      var("maxpool2d", "cudnn", pool_fwd<kMaxPool, build_maxpool>,
          prep_only<kMaxPool, build_maxpool>, true),
      var("maxpool2d_grad", "cudnn", maxpool_grad, prep_only<kMaxPoolGrad, build_maxpool_grad>,
          true),
      var("avgpool2d", "cudnn", pool_fwd<kAvgPool, build_avgpool>,
          prep_only<kAvgPool, build_avgpool>, true),
      var("avgpool2d_grad", "cudnn", avg_bwd<kAvgPoolGrad, build_avgpool_grad>,
          prep_only<kAvgPoolGrad, build_avgpool_grad>, true),
      var("global_avgpool", "cudnn", pool_fwd<kGap, build_gap>, prep_only<kGap, build_gap>, true),
      var("global_avgpool_grad", "cudnn", avg_bwd<kGapGrad, build_gap_grad>,
          prep_only<kGapGrad, build_gap_grad>, true),
  };
}

}  // namespace pooch::kern
