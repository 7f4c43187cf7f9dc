// The calling convention every kernel implements, on every backend.
//
// Kernels sit at the bottom of the stack: they see raw pointers, shapes and a
// flat list of scalar attributes, never the graph. Everything a kernel reads
// is prepared once when a plan is compiled, so launching one allocates
// nothing (the executor's no-allocation guarantee rests on this).
#pragma once
#include <cstdint>
#include <cstring>

#include "dtype.h"

namespace pooch::kern {

inline constexpr int kMaxDims = 4;
inline constexpr int kMaxOperands = 8;
inline constexpr int kMaxAttrs = 12;

// How a tensor's elements lie in memory. `plain`: row-major, as its shape
// reads. The blocked layouts are oneDNN's, used only where the blocked
// dimensions are multiples of 16, so their bytes are as many as plain's
// (kernels/common/layout.h has the offsets):
// - `nchw16c`: a 4-D f32 activation [N, C, H, W] whose channels are in
//   blocks of 16, the block innermost (oneDNN's nChw16c: element (n, c, h, w)
//   at ((n·C/16 + c/16)·H·W + h·W + w)·16 + c mod 16);
// - `oihw16i16o`: a 4-D f32 convolution weight [O, I, KH, KW] (or its
//   gradient or optimizer state) in 16 × 16 blocks of output and input
//   channels, the output channel innermost (oneDNN's OIhw16i16o, the layout
//   its forward convolution and weight gradient run in).
// The planner chooses a blocked layout for a tensor only where every kernel
// that reads or writes it takes it (KernelVariant::blocked and
// blocked_weights), so that convolutions need not reorder their operands at
// every call (docs/OPS.md, "Blocked layouts").
enum class Layout : uint8_t { plain = 0, nchw16c = 1, oihw16i16o = 2 };

// A dense tensor in some backend's memory, row-major unless `layout` says
// otherwise.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  Layout layout = Layout::plain;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t dim(int i) const { return i < 0 ? shape[ndim + i] : shape[i]; }
  // Product of all dimensions but the last: the "rows" of a row-major matrix
  // (3 for a [3, 0] tensor: its rows exist, they are empty).
  int64_t rows() const {
    int64_t n = 1;
    for (int i = 0; i + 1 < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Scalar attributes by name (integers are stored exactly as doubles up to
// 2^53). A linear scan over a dozen entries is cheaper than any map here and
// allocates nothing.
struct KernelAttrs {
  int n = 0;
  char names[kMaxAttrs][24] = {};
  double values[kMaxAttrs] = {};

  bool has(const char* name) const {
    for (int i = 0; i < n; ++i)
      if (std::strcmp(names[i], name) == 0) return true;
    return false;
  }
  double get(const char* name, double fallback) const {
    for (int i = 0; i < n; ++i)
      if (std::strcmp(names[i], name) == 0) return values[i];
    return fallback;
  }
  int64_t geti(const char* name, int64_t fallback) const {
    return static_cast<int64_t>(get(name, static_cast<double>(fallback)));
  }
  // Returns false when full or the name is too long (callers treat it as a bug).
  bool set(const char* name, double v) {
    for (int i = 0; i < n; ++i)
      if (std::strcmp(names[i], name) == 0) {
        values[i] = v;
        return true;
      }
    if (n == kMaxAttrs || std::strlen(name) >= sizeof(names[0])) return false;
    std::strcpy(names[n], name);
    values[n++] = v;
    return true;
  }
};

// Per-step values, owned by the executor; kernels read them at launch.
struct KernelContext {
  uint64_t seed = 0;      // the session's seed
  uint64_t step = 0;      // optimizer step counter, starting at 1 for the first update
  int threads = 1;        // CPU threads a kernel may use
  int training = 1;       // 0 in inference: dropout passes its input through
  double lr_scale = 1.0;  // learning-rate schedule factor the optimizer updates apply
};

// What the CPU backend passes as KernelArgs::device: the threads its kernels
// run with. oneDNN's primitives take their thread count when they are made,
// at plan time, where no KernelContext exists yet.
struct CpuDevice {
  int threads = 1;
};

struct KernelArgs {
  TensorView in[kMaxOperands];
  TensorView out[kMaxOperands];
  int n_in = 0;
  int n_out = 0;
  KernelAttrs attrs;
  // Scratch of at least workspace(args) bytes. The executor places it at the
  // backend's alignment (BackendCaps::alignment, 256 bytes on the CPU), and
  // kernels lay vectors out from its start: a caller of its own (a
  // benchmark, a checker) gives it the same alignment, or the kernels still
  // compute the same bits, only slower (the fused fixed fan-in step 20%, its
  // rows straddling cache lines).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  const KernelContext* ctx = nullptr;
  void* stream = nullptr;  // backend-specific stream handle (CUDA); null on the CPU
  // The device the kernel is planned for, as its backend describes it (CUDA:
  // a kern::cuda::LaunchEnv*; the CPU: a CpuDevice*; null for a kernel run
  // on the host beside another device). Set before `supports` and
  // `workspace` are asked, so neither reads process-global state.
  const void* device = nullptr;
};

using KernelFn = void (*)(const KernelArgs&);
// Scratch bytes a kernel needs for these shapes (data pointers may be null).
using WorkspaceFn = size_t (*)(const KernelArgs&);
// Whether this kernel computes the op for these arguments (dtypes, ranks,
// sizes); asked at plan time, never at launch (ggml's supports_op). Data
// pointers may be null.
using SupportsFn = bool (*)(const KernelArgs&);

// One implementation of one op on one backend.
struct KernelVariant {
  const char* op;       // op kind, e.g. "linear"
  const char* variant;  // e.g. "ref", "blas", "atomic", "deterministic"
  KernelFn fn;
  WorkspaceFn workspace;          // may be null: no scratch needed
  bool deterministic;             // bitwise reproducible run to run
  SupportsFn supports = nullptr;  // null: every argument set the op accepts
  // The operands the kernel also takes in Layout::nchw16c (bit i: input i;
  // bit kOutBit + j: output j); 0: plain only. With same_layout, the listed
  // operands must all be in one layout (element-wise kernels, which compute
  // element by element in any order of the elements).
  uint32_t blocked = 0;
  bool same_layout = false;
  // The operands it also takes in Layout::oihw16i16o, in the same bits (a
  // same_layout kernel's listed operands again all in one layout).
  uint32_t blocked_weights = 0;
};
inline constexpr int kOutBit = 16;
constexpr uint32_t in_bit(int i) {
  return uint32_t{1} << i;
}
constexpr uint32_t out_bit(int j) {
  return uint32_t{1} << (kOutBit + j);
}

}  // namespace pooch::kern
