// The geometry of 2-D convolution and pooling windows, shared by the op
// definitions (shape inference) and every kernel, so that all of them agree
// on one output size formula (PyTorch's, floor mode).
#pragma once
#include <cstdint>

#include "kernel_abi.h"

namespace pooch::kern {

// Output length along one axis: floor((in + 2·pad − dil·(k − 1) − 1) / stride) + 1,
// or a value < 1 when the window does not fit.
inline int64_t conv_out_len(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  const int64_t span = dil * (k - 1) + 1;
  const int64_t room = in + 2 * pad - span;
  return room < 0 ? 0 : room / stride + 1;
}

// The window attributes of a conv2d or pooling call, as stored in KernelAttrs
// (docs/OPS.md, "Convolutional"): stride_h/w, pad_h/w, dil_h/w and groups,
// with PyTorch's defaults.
struct Window {
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int64_t kh = 1, kw = 1;  // pooling window (conv: from the weight's shape)
};

inline Window window_of(const KernelAttrs& a) {
  Window w;
  w.sh = a.geti("stride_h", 1);
  w.sw = a.geti("stride_w", 1);
  w.ph = a.geti("pad_h", 0);
  w.pw = a.geti("pad_w", 0);
  w.dh = a.geti("dil_h", 1);
  w.dw = a.geti("dil_w", 1);
  w.groups = a.geti("groups", 1);
  w.kh = a.geti("kh", 1);
  w.kw = a.geti("kw", 1);
  return w;
}

}  // namespace pooch::kern
