// Fast CPU kernels of the convolutional family (docs/OPS.md,
// "Convolutional") through oneDNN: convolution (forward, data and weight
// gradients), max, average and global average pooling, on NCHW f32 tensors
// as the graph holds them. The convolutions run in oneDNN's blocked layouts,
// their operands reordered through the workspace (dnnl_prims.h, add_prim).
// Primitives are built at plan time (the workspace query) with their
// scratchpads in the arena workspace. max pooling's gradient is a loop here:
// oneDNN's needs the forward's workspace of argmax positions, which no graph
// tensor carries. Batch normalisation is in batchnorm.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../common/conv_geom.h"
#include "../common/supports.h"
#include "cpu_kernels.h"
#include "dnnl_prims.h"

namespace pooch::kern {
namespace {

using namespace dnnl_cpu;
using dnnl::algorithm;
using dnnl::prop_kind;
using dims = dnnl::memory::dims;

dims dims_of(const TensorView& t) {
  return dims(t.shape, t.shape + t.ndim);
}

bool any_empty(const KernelArgs& a) {
  for (int i = 0; i < a.n_in; ++i)
    if (a.in[i].numel() == 0) return true;
  for (int i = 0; i < a.n_out; ++i)
    if (a.out[i].numel() == 0) return true;
  return false;
}

void zero_outputs(const KernelArgs& a) {
  for (int i = 0; i < a.n_out; ++i)
    if (a.out[i].numel()) std::memset(a.out[i].data, 0, static_cast<size_t>(a.out[i].numel()) * 4);
}

// ---- convolution ------------------------------------------------------------------

// oneDNN's descriptors of one convolution: x[N,C,H,W], w[O,C/g,KH,KW] (as
// g × O/g × C/g × KH × KW when grouped), y[N,O,OH,OW]. `x`, `w` and `y` are
// the operands' own layouts (x and y plain or nChw16c, the weights plain or
// OIhw16i16o, as the planner laid them out); the primitives are made with `any` in their
// place, so oneDNN picks its blocked layouts (nChw16c and the like, where
// its direct convolutions run several times faster than im2col + GEMM on
// plain NCHW) and an operand in another layout is reordered through the
// workspace.
struct ConvMds {
  dnnl::memory::desc x, w, b, y;
  dnnl::memory::desc x_any, w_any, y_any;
  dims strides, dilates, pad_l, pad_r;
};

ConvMds conv_mds(const KernelAttrs& at, const TensorView& x, const TensorView& w,
                 const TensorView& y) {
  const Window win = window_of(at);
  ConvMds m;
  m.x = md_of(dims_of(x), x.layout);
  m.y = md_of(dims_of(y), y.layout);
  // A grouped weight's OIhw16i16o is oneDNN's gOIhw16i16o when each group's
  // output channels are whole blocks of 16 (conv_supports).
  if (win.groups > 1)
    m.w = dnnl::memory::desc(
        {win.groups, w.shape[0] / win.groups, w.shape[1], w.shape[2], w.shape[3]},
        dnnl::memory::data_type::f32,
        w.layout == Layout::oihw16i16o ? dnnl::memory::format_tag::gOIhw16i16o
                                       : dnnl::memory::format_tag::goihw);
  else
    m.w = md_of(dims_of(w), w.layout);
  m.b = plain_md({w.shape[0]});
  m.x_any = any_md(m.x.dims());
  m.w_any = any_md(m.w.dims());
  m.y_any = any_md(m.y.dims());
  m.strides = {win.sh, win.sw};
  m.dilates = {win.dh - 1, win.dw - 1};  // oneDNN counts dilation from 0
  m.pad_l = {win.ph, win.pw};
  // The right padding that makes oneDNN's output size the floor formula's.
  const int64_t kh = (w.shape[2] - 1) * win.dh + 1, kw = (w.shape[3] - 1) * win.dw + 1;
  m.pad_r = {(y.shape[2] - 1) * win.sh + kh - x.shape[2] - win.ph,
             (y.shape[3] - 1) * win.sw + kw - x.shape[3] - win.pw};
  return m;
}

dnnl::convolution_forward::primitive_desc conv_fwd_pd(const ConvMds& m, bool bias) {
  const auto d = bias ? dnnl::convolution_forward::desc(
                            prop_kind::forward_training, algorithm::convolution_direct, m.x_any,
                            m.w_any, m.b, m.y_any, m.strides, m.dilates, m.pad_l, m.pad_r)
                      : dnnl::convolution_forward::desc(
                            prop_kind::forward_training, algorithm::convolution_direct, m.x_any,
                            m.w_any, m.y_any, m.strides, m.dilates, m.pad_l, m.pad_r);
  return {d, user_scratchpad(), cpu_engine()};
}

void build_conv(const KernelArgs& a, Prepared& s) {
  const bool bias = a.n_in > 2;
  const ConvMds m = conv_mds(a.attrs, a.in[0], a.in[1], a.out[0]);
  const auto pd = conv_fwd_pd(m, bias);
  std::vector<ArgOperand> args = {{DNNL_ARG_SRC, kIn + 0, m.x},
                                  {DNNL_ARG_WEIGHTS, kIn + 1, m.w},
                                  {DNNL_ARG_DST, kOut + 0, m.y}};
  if (bias) args.push_back({DNNL_ARG_BIAS, kIn + 2, m.b});
  add_prim(s, dnnl::convolution_forward(pd), pd, args);
}

void build_conv_grad_input(const KernelArgs& a, Prepared& s) {
  // dy plays y's part, dx x's.
  const ConvMds m = conv_mds(a.attrs, a.out[0], a.in[1], a.in[0]);
  const auto hint = conv_fwd_pd(m, false);
  const dnnl::convolution_backward_data::desc d(algorithm::convolution_direct, m.x_any, m.w_any,
                                                m.y_any, m.strides, m.dilates, m.pad_l, m.pad_r);
  const dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad(), cpu_engine(),
                                                           hint);
  add_prim(s, dnnl::convolution_backward_data(pd), pd,
           {{DNNL_ARG_DIFF_DST, kIn + 0, m.y},
            {DNNL_ARG_WEIGHTS, kIn + 1, m.w},
            {DNNL_ARG_DIFF_SRC, kOut + 0, m.x}});
}

void build_conv_grad_weight(const KernelArgs& a, Prepared& s) {
  const ConvMds m = conv_mds(a.attrs, a.in[1], a.out[0], a.in[0]);
  const auto hint = conv_fwd_pd(m, true);
  const dnnl::convolution_backward_weights::desc d(algorithm::convolution_direct, m.x_any, m.w_any,
                                                   m.b, m.y_any, m.strides, m.dilates, m.pad_l,
                                                   m.pad_r);
  const dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad(), cpu_engine(),
                                                              hint);
  add_prim(s, dnnl::convolution_backward_weights(pd), pd,
           {{DNNL_ARG_DIFF_DST, kIn + 0, m.y},
            {DNNL_ARG_SRC, kIn + 1, m.x},
            {DNNL_ARG_DIFF_WEIGHTS, kOut + 0, m.w},
            {DNNL_ARG_DIFF_BIAS, kOut + 1, m.b}});
}

template <const char* Name, void (*Build)(const KernelArgs&, Prepared&)>
size_t prim_workspace(const KernelArgs& a) {
  if (any_empty(a)) return 0;
  return prepared(Name, a, Build).scratch_bytes;
}

template <const char* Name, void (*Build)(const KernelArgs&, Prepared&)>
void run_prim(const KernelArgs& a) {
  if (any_empty(a)) {
    // An empty batch still has a (zero) weight gradient; an empty window set
    // has nothing to write.
    zero_outputs(a);
    return;
  }
  execute(prepared(Name, a, Build), a);
}

constexpr char kConv[] = "conv2d";
constexpr char kConvGI[] = "conv2d_grad_input";
constexpr char kConvGW[] = "conv2d_grad_weight";

// ---- pooling ------------------------------------------------------------------------

// The image side (x, or dx) of a pooling in its layout; the window side (y,
// or dy) in the same layout: a window side that is not 4-D is [N, C] or
// [N, C, 1, 1] (global pooling), whose nChw16c bytes are its plain ones.
struct PoolMds {
  dnnl::memory::desc img, win;
  dims pad_r;
};

PoolMds pool_mds(const TensorView& img, const TensorView& win, const Window& w) {
  const dims wdims = {win.shape[0], win.shape[1], win.ndim == 4 ? win.shape[2] : 1,
                      win.ndim == 4 ? win.shape[3] : 1};
  return {md_of(dims_of(img), img.layout),
          md_of(wdims, img.layout),
          {(wdims[2] - 1) * w.sh + w.kh - img.shape[2] - w.ph,
           (wdims[3] - 1) * w.sw + w.kw - img.shape[3] - w.pw}};
}

// x[N,C,H,W] -> y[N,C,OH,OW] with the op's window (or the whole image).
dnnl::pooling_forward::primitive_desc pool_fwd_pd(algorithm alg, const TensorView& x,
                                                  const TensorView& y, const Window& w,
                                                  prop_kind pk) {
  const PoolMds m = pool_mds(x, y, w);
  const dnnl::pooling_forward::desc d(pk, alg, m.img, m.win, {w.sh, w.sw}, {w.kh, w.kw},
                                      {w.ph, w.pw}, m.pad_r);
  return {d, user_scratchpad(), cpu_engine()};
}

algorithm avg_alg(const KernelAttrs& at) {
  return at.geti("count_include_pad", 1) ? algorithm::pooling_avg_include_padding
                                         : algorithm::pooling_avg_exclude_padding;
}

void build_maxpool(const KernelArgs& a, Prepared& s) {
  const auto pd = pool_fwd_pd(algorithm::pooling_max, a.in[0], a.out[0], window_of(a.attrs),
                              prop_kind::forward_inference);
  add_prim(s, dnnl::pooling_forward(pd), pd, {{DNNL_ARG_SRC, kIn + 0}, {DNNL_ARG_DST, kOut + 0}});
}

void build_avgpool(const KernelArgs& a, Prepared& s) {
  const auto pd = pool_fwd_pd(avg_alg(a.attrs), a.in[0], a.out[0], window_of(a.attrs),
                              prop_kind::forward_inference);
  add_prim(s, dnnl::pooling_forward(pd), pd, {{DNNL_ARG_SRC, kIn + 0}, {DNNL_ARG_DST, kOut + 0}});
}

// dy -> dx through oneDNN's average pooling backward (no workspace needed).
void build_avgpool_bwd(const KernelArgs& a, const Window& w, algorithm alg, Prepared& s) {
  const TensorView& dy = a.in[0];
  const TensorView& dx = a.out[0];
  const auto hint = pool_fwd_pd(alg, dx, dy, w, prop_kind::forward_training);
  const PoolMds m = pool_mds(dx, dy, w);
  const dnnl::pooling_backward::desc d(alg, m.img, m.win, {w.sh, w.sw}, {w.kh, w.kw}, {w.ph, w.pw},
                                       m.pad_r);
  const dnnl::pooling_backward::primitive_desc pd(d, user_scratchpad(), cpu_engine(), hint);
  add_prim(s, dnnl::pooling_backward(pd), pd,
           {{DNNL_ARG_DIFF_DST, kIn + 0}, {DNNL_ARG_DIFF_SRC, kOut + 0}});
}

void build_avgpool_grad(const KernelArgs& a, Prepared& s) {
  build_avgpool_bwd(a, window_of(a.attrs), avg_alg(a.attrs), s);
}

// The whole image as one window.
Window whole(const TensorView& img) {
  Window w;
  w.kh = img.shape[2];
  w.kw = img.shape[3];
  return w;
}

void build_gap(const KernelArgs& a, Prepared& s) {
  const auto pd = pool_fwd_pd(algorithm::pooling_avg_include_padding, a.in[0], a.out[0],
                              whole(a.in[0]), prop_kind::forward_inference);
  add_prim(s, dnnl::pooling_forward(pd), pd, {{DNNL_ARG_SRC, kIn + 0}, {DNNL_ARG_DST, kOut + 0}});
}

void build_gap_grad(const KernelArgs& a, Prepared& s) {
  build_avgpool_bwd(a, whole(a.out[0]), algorithm::pooling_avg_include_padding, s);
}

constexpr char kMaxPool[] = "maxpool2d";
constexpr char kAvgPool[] = "avgpool2d";
constexpr char kAvgPoolGrad[] = "avgpool2d_grad";
constexpr char kGap[] = "global_avgpool";
constexpr char kGapGrad[] = "global_avgpool_grad";

// dx: dy of each window added at its first maximum (the one oneDNN's and
// PyTorch's forward pick). One thread per image plane, so the additions
// within a plane keep their order. In nChw16c (every operand; the planner
// keeps them together) a plane's values are every 16th float of its
// block of 16 channels, and a thread takes whole blocks.
void maxpool_grad(const KernelArgs& a) {
  const Window w = window_of(a.attrs);
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t N = a.in[1].shape[0], C = a.in[1].shape[1], H = a.in[1].shape[2],
                W = a.in[1].shape[3], OH = a.in[0].shape[2], OW = a.in[0].shape[3];
  const bool blocked = a.in[1].layout == Layout::nchw16c;
  const int64_t lanes = blocked ? 16 : 1;  // planes a block interleaves
  const int nt = threads_of(a);
#pragma omp parallel for num_threads(nt) if (N * C * H * W > 32768) schedule(static)
  for (int64_t blk = 0; blk < N * C / lanes; ++blk) {
    const float* img0 = x + blk * H * W * lanes;
    float* d0 = dx + blk * H * W * lanes;
    const float* g0 = dy + blk * OH * OW * lanes;
    std::fill(d0, d0 + H * W * lanes, 0.f);
    for (int64_t lane = 0; lane < lanes; ++lane) {
      // Element p of this plane is at [p * lanes + lane] of its block.
      const float* img = img0 + lane;
      float* d = d0 + lane;
      const float* g = g0 + lane;
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          int64_t best = -1;
          float bv = 0;
          for (int64_t ky = 0; ky < w.kh; ++ky) {
            const int64_t iy = oy * w.sh - w.ph + ky;
            if (iy < 0 || iy >= H) continue;
            for (int64_t kx = 0; kx < w.kw; ++kx) {
              const int64_t ix = ox * w.sw - w.pw + kx;
              if (ix < 0 || ix >= W) continue;
              const float v = img[(iy * W + ix) * lanes];
              if (best < 0 || v > bv || (std::isnan(v) && !std::isnan(bv))) {
                best = iy * W + ix;
                bv = v;
              }
            }
          }
          if (best >= 0) d[best * lanes] += g[(oy * OW + ox) * lanes];
        }
    }
  }
}

// `blocked`, `same`, `weights`: the operands that may be nChw16c, and those
// that may be OIhw16i16o (KernelVariant).
KernelVariant dnnl_kernel(const char* op, KernelFn fn, WorkspaceFn ws, uint32_t blocked = 0,
                          bool same = false, uint32_t weights = 0,
                          SupportsFn supports = f32_operands) {
  return KernelVariant{op, "onednn", fn, ws, true, supports, blocked, same, weights};
}

// A convolution whose weights (`w`) lie in OIhw16i16o: grouped ones only
// where each group's output channels are whole blocks of 16, as oneDNN's
// gOIhw16i16o has them (a depthwise weight has one a group).
template <bool Out, int W>
bool conv_supports(const KernelArgs& a) {
  const TensorView& w = Out ? a.out[W] : a.in[W];
  const int64_t groups = window_of(a.attrs).groups;
  return f32_operands(a) &&
         (w.layout != Layout::oihw16i16o || groups == 1 || (w.shape[0] / groups) % 16 == 0);
}

}  // namespace

std::vector<KernelVariant> cpu_conv_kernels() {
  return {
      // x, y, dy and dx in either layout, the weights and their gradient
      // plain or OIhw16i16o (the forward's and the weight gradient's own;
      // the data gradient reorders them into OIhw16o16i), each reordered
      // where the primitive chose another.
      dnnl_kernel("conv2d", run_prim<kConv, build_conv>, prim_workspace<kConv, build_conv>,
                  in_bit(0) | out_bit(0), false, in_bit(1), conv_supports<false, 1>),
      dnnl_kernel("conv2d_grad_input", run_prim<kConvGI, build_conv_grad_input>,
                  prim_workspace<kConvGI, build_conv_grad_input>, in_bit(0) | out_bit(0), false,
                  in_bit(1), conv_supports<false, 1>),
      dnnl_kernel("conv2d_grad_weight", run_prim<kConvGW, build_conv_grad_weight>,
                  prim_workspace<kConvGW, build_conv_grad_weight>, in_bit(0) | in_bit(1), false,
                  out_bit(0), conv_supports<true, 0>),
      dnnl_kernel("maxpool2d", run_prim<kMaxPool, build_maxpool>,
                  prim_workspace<kMaxPool, build_maxpool>, in_bit(0) | out_bit(0), true),
      // dy, x, y (which the loop does not read) and dx in one layout.
      KernelVariant{"maxpool2d_grad", "omp", maxpool_grad, nullptr, true, f32_operands,
                    in_bit(0) | in_bit(1) | in_bit(2) | out_bit(0), true},
      dnnl_kernel("avgpool2d", run_prim<kAvgPool, build_avgpool>,
                  prim_workspace<kAvgPool, build_avgpool>),
      dnnl_kernel("avgpool2d_grad", run_prim<kAvgPoolGrad, build_avgpool_grad>,
                  prim_workspace<kAvgPoolGrad, build_avgpool_grad>),
      // The window side, [N, C] (or 1 × 1), has the same bytes in both.
      dnnl_kernel("global_avgpool", run_prim<kGap, build_gap>, prim_workspace<kGap, build_gap>,
                  in_bit(0)),
      dnnl_kernel("global_avgpool_grad", run_prim<kGapGrad, build_gap_grad>,
                  prim_workspace<kGapGrad, build_gap_grad>, out_bit(0)),
  };
}

}  // namespace pooch::kern
