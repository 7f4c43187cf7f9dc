// Convolutional ops (docs/OPS.md, "Convolutional"): conv2d, batchnorm,
// maxpool2d, avgpool2d, global_avgpool and the gradient ops their backward
// builders emit. Images are NCHW: x[N, C, H, W]. Float operands are f32 (f64
// for the kernel checker's finite differences); all float operands of one op
// share the first one's dtype.
#include <fmt/format.h>

#include <cmath>

#include "../../../kernels/common/conv_geom.h"
#include "../op_registry.h"

namespace pooch {
namespace {

// A whole-number attribute in [lo, hi], or its default when absent.
int64_t int_attr(std::string_view op, const Attrs& a, const char* key, int64_t fallback, int64_t lo,
                 int64_t hi = int64_t{1} << 40) {
  if (!a.has(key)) return fallback;
  const double v = a.get(key, 0);
  if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi) && v == std::floor(v)))
    op_error(op,
             fmt::format("attribute {} = {} must be a whole number in [{}, {}]", key, v, lo, hi));
  return static_cast<int64_t>(v);
}

// The window attributes, checked. `pool`: kh/kw are required and dilation
// and groups are not taken.
kern::Window window(std::string_view op, const Attrs& a, bool pool) {
  kern::Window w;
  w.sh = int_attr(op, a, "stride_h", 1, 1);
  w.sw = int_attr(op, a, "stride_w", 1, 1);
  w.ph = int_attr(op, a, "pad_h", 0, 0);
  w.pw = int_attr(op, a, "pad_w", 0, 0);
  if (pool) {
    a.require(op, "kh");
    a.require(op, "kw");
    w.kh = int_attr(op, a, "kh", 1, 1);
    w.kw = int_attr(op, a, "kw", 1, 1);
    // PyTorch's rule: a window is never more than half padding.
    if (w.ph > w.kh / 2 || w.pw > w.kw / 2)
      op_error(op,
               fmt::format("padding {}x{} exceeds half the window {}x{}", w.ph, w.pw, w.kh, w.kw));
  } else {
    w.dh = int_attr(op, a, "dil_h", 1, 1);
    w.dw = int_attr(op, a, "dil_w", 1, 1);
    w.groups = int_attr(op, a, "groups", 1, 1);
  }
  return w;
}

void expect_image(std::string_view op, const TensorDesc& t, const char* role) {
  expect_rank(op, t, 4, role);
  expect_float(op, t, role);
}

// The output height and width of a window over an H×W image; an error when
// the window does not fit.
std::pair<int64_t, int64_t> out_hw(std::string_view op, int64_t H, int64_t W, int64_t kh,
                                   int64_t kw, const kern::Window& w) {
  const int64_t oh = kern::conv_out_len(H, kh, w.sh, w.ph, w.dh);
  const int64_t ow = kern::conv_out_len(W, kw, w.sw, w.pw, w.dw);
  if (oh < 1 || ow < 1)
    op_error(op, fmt::format("a {}x{} window (dilation {}x{}) does not fit a {}x{} image padded "
                             "by {}x{}",
                             kh, kw, w.dh, w.dw, H, W, w.ph, w.pw));
  return {oh, ow};
}

// The attributes a gradient op repeats from its forward op.
Attrs window_attrs(const Attrs& fwd) {
  Attrs a;
  for (const char* k : {"stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups", "kh",
                        "kw", "count_include_pad"})
    if (fwd.has(k)) a.set(k, fwd.get(k, 0));
  return a;
}

// ---- conv2d ---------------------------------------------------------------------

// x[N,C,H,W] ⋆ w[O,C/g,KH,KW] (+ b[O]) -> y[N,O,OH,OW].
void add_conv(OpRegistry& r) {
  OpDef c;
  c.name = "conv2d";
  c.min_inputs = 2;
  c.max_inputs = 3;
  c.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "conv2d";
    const TensorDesc& x = *in[0];
    const TensorDesc& w = *in[1];
    expect_image(op, x, "input");
    expect_rank(op, w, 4, "weight");
    expect_dtype(op, w, x.dtype, "weight");
    const kern::Window win = window(op, attrs, false);
    const int64_t C = x.shape[1], O = w.shape[0];
    if (C % win.groups != 0 || O % win.groups != 0)
      op_error(op, fmt::format("groups = {} must divide the input channels {} and the output "
                               "channels {}",
                               win.groups, C, O));
    if (w.shape[1] * win.groups != C)
      op_error(op, fmt::format("weight '{}' {} takes {} input channels per group; input '{}' {} "
                               "has {} in {} group{}",
                               w.name, shape_str(w.shape), w.shape[1], x.name, shape_str(x.shape),
                               C, win.groups, win.groups == 1 ? "" : "s"));
    if (w.shape[2] < 1 || w.shape[3] < 1)
      op_error(op, fmt::format("weight '{}' {} has an empty window", w.name, shape_str(w.shape)));
    if (in.size() > 2) {
      expect_rank(op, *in[2], 1, "bias");
      expect_dtype(op, *in[2], x.dtype, "bias");
      expect_dim(op, *in[2], 0, "bias", w, 0, "weight");
    }
    const auto [oh, ow] = out_hw(op, x.shape[2], x.shape[3], w.shape[2], w.shape[3], win);
    return {OutSpec{x.dtype, Shape{x.shape[0], O, oh, ow}}};
  };
  c.flops = [](InDescs in, InDescs out, const Attrs&) {
    const TensorDesc& w = *in[1];
    return 2.0 * numel(out[0]) * static_cast<double>(w.shape[1] * w.shape[2] * w.shape[3]) +
           (in.size() > 2 ? numel(out[0]) : 0.0);
  };
  c.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                  const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor) return;
    const TensorId x = fwd.inputs[0], w = fwd.inputs[1];
    // Copies: add_op grows the graph's tensor list, which would leave a
    // reference dangling (found by AddressSanitizer in pooch-opcheck).
    const TensorDesc xd = g.tensor(x);
    const TensorDesc wd = g.tensor(w);
    const bool has_bias = fwd.inputs.size() > 2;
    if (needs[0]) {
      Attrs a = window_attrs(fwd.attrs);
      a.set("in_h", static_cast<double>(xd.shape[2])).set("in_w", static_cast<double>(xd.shape[3]));
      dx[0] = g.add_op1("conv2d_grad_input", {dy[0], w}, a, grad_name(g, x), Role::gradient);
    }
    const bool need_b = has_bias && needs[2];
    if (!needs[1] && !need_b) return;
    Attrs a = window_attrs(fwd.attrs);
    a.set("kh", static_cast<double>(wd.shape[2])).set("kw", static_cast<double>(wd.shape[3]));
    // As linear_grad_weight: dW and db from one op; without a bias nothing
    // reads db.
    const std::string db_name =
        has_bias ? grad_name(g, fwd.inputs[2]) : g.unique_name(wd.name + ".bias.grad");
    const std::vector<TensorId> dwb =
        g.add_op("conv2d_grad_weight", {dy[0], x}, a, {grad_name(g, w), db_name}, Role::gradient);
    if (needs[1]) dx[1] = dwb[0];
    if (need_b) dx[2] = dwb[1];
  };
  r.add(std::move(c));

  // dy[N,O,OH,OW], w[O,C/g,KH,KW] -> dx[N,C,in_h,in_w].
  OpDef gi;
  gi.name = "conv2d_grad_input";
  gi.min_inputs = gi.max_inputs = 2;
  gi.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "conv2d_grad_input";
    const TensorDesc& dy = *in[0];
    const TensorDesc& w = *in[1];
    expect_image(op, dy, "output gradient");
    expect_rank(op, w, 4, "weight");
    expect_dtype(op, w, dy.dtype, "weight");
    expect_dim(op, w, 0, "weight", dy, 1, "output gradient");
    const kern::Window win = window(op, attrs, false);
    const int64_t H = int_attr(op, attrs, "in_h", -1, 1), W = int_attr(op, attrs, "in_w", -1, 1);
    attrs.require(op, "in_h");
    attrs.require(op, "in_w");
    if (w.shape[0] % win.groups != 0)
      op_error(op, fmt::format("groups = {} must divide the output channels {}", win.groups,
                               w.shape[0]));
    const auto [oh, ow] = out_hw(op, H, W, w.shape[2], w.shape[3], win);
    if (oh != dy.shape[2] || ow != dy.shape[3])
      op_error(op, fmt::format("output gradient '{}' {} does not match the {}x{} output of a {}x{} "
                               "input",
                               dy.name, shape_str(dy.shape), oh, ow, H, W));
    return {OutSpec{dy.dtype, Shape{dy.shape[0], w.shape[1] * win.groups, H, W}}};
  };
  gi.flops = [](InDescs in, InDescs, const Attrs&) {
    const TensorDesc& w = *in[1];
    return 2.0 * numel(in[0]) * static_cast<double>(w.shape[1] * w.shape[2] * w.shape[3]);
  };
  r.add(std::move(gi));

  // dy[N,O,OH,OW], x[N,C,H,W] -> dw[O,C/g,kh,kw], db[O].
  OpDef gw;
  gw.name = "conv2d_grad_weight";
  gw.min_inputs = gw.max_inputs = 2;
  gw.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "conv2d_grad_weight";
    const TensorDesc& dy = *in[0];
    const TensorDesc& x = *in[1];
    expect_image(op, dy, "output gradient");
    expect_image(op, x, "input");
    expect_dtype(op, x, dy.dtype, "input");
    expect_dim(op, x, 0, "input", dy, 0, "output gradient");
    const kern::Window win = window(op, attrs, false);
    attrs.require(op, "kh");
    attrs.require(op, "kw");
    const int64_t kh = int_attr(op, attrs, "kh", 1, 1), kw = int_attr(op, attrs, "kw", 1, 1);
    const int64_t C = x.shape[1], O = dy.shape[1];
    if (C % win.groups != 0 || O % win.groups != 0)
      op_error(op, fmt::format("groups = {} must divide the input channels {} and the output "
                               "channels {}",
                               win.groups, C, O));
    const auto [oh, ow] = out_hw(op, x.shape[2], x.shape[3], kh, kw, win);
    if (oh != dy.shape[2] || ow != dy.shape[3])
      op_error(op, fmt::format("output gradient '{}' {} does not match the {}x{} output of input "
                               "'{}' {}",
                               dy.name, shape_str(dy.shape), oh, ow, x.name, shape_str(x.shape)));
    return {OutSpec{dy.dtype, Shape{O, C / win.groups, kh, kw}}, OutSpec{dy.dtype, Shape{O}}};
  };
  gw.flops = [](InDescs in, InDescs out, const Attrs&) {
    const TensorDesc& dw = *out[0];
    return 2.0 * numel(in[0]) * static_cast<double>(dw.shape[1] * dw.shape[2] * dw.shape[3]) +
           numel(in[0]);
  };
  r.add(std::move(gw));
}

// ---- batchnorm --------------------------------------------------------------------

// x[N,C] or x[N,C,H,W]: the per-channel vectors are [C].
void expect_channels(std::string_view op, const TensorDesc& t, const char* role,
                     const TensorDesc& x) {
  expect_rank(op, t, 1, role);
  expect_dtype(op, t, x.dtype, role);
  expect_dim(op, t, 0, role, x, 1, "input");
}

void expect_bn_input(std::string_view op, const TensorDesc& x, const char* role) {
  if (x.shape.size() != 2 && x.shape.size() != 4)
    op_error(op, fmt::format("{} '{}' must be [N, C] or [N, C, H, W], got {}", role, x.name,
                             shape_str(x.shape)));
  expect_float(op, x, role);
}

double bn_eps(std::string_view op, const Attrs& a) {
  const double eps = a.get("eps", 1e-5);
  if (!std::isfinite(eps) || eps <= 0.0)
    op_error(op, fmt::format("attribute eps = {} must be finite and > 0", eps));
  return eps;
}

void add_batchnorm(OpRegistry& r) {
  // x, gamma, beta, running_mean, running_var -> y, mean, var. Training: the
  // batch's statistics (biased variance) normalise, and the running averages
  // move toward them (running_var toward the unbiased variance, as PyTorch);
  // inference: the running averages normalise and nothing is written.
  OpDef bn;
  bn.name = "batchnorm";
  bn.min_inputs = bn.max_inputs = 5;
  bn.mutates = {3, 4};
  bn.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "batchnorm";
    const TensorDesc& x = *in[0];
    expect_bn_input(op, x, "input");
    const char* roles[] = {"", "gamma", "beta", "running mean", "running variance"};
    for (int i = 1; i < 5; ++i) expect_channels(op, *in[i], roles[i], x);
    bn_eps(op, attrs);
    const double m = attrs.get("momentum", 0.1);
    if (!(m >= 0.0 && m <= 1.0))
      op_error(op, fmt::format("attribute momentum = {} must lie in [0, 1]", m));
    const Shape c{x.shape[1]};
    return {OutSpec{x.dtype, x.shape}, OutSpec{x.dtype, c}, OutSpec{x.dtype, c}};
  };
  // Per element: mean (1), variance (3), normalise and scale (4).
  bn.flops = [](InDescs in, InDescs, const Attrs&) { return 8.0 * numel(in[0]); };
  // mean and var are saved for batchnorm_grad; only y's gradient flows back.
  bn.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !(needs[0] || needs[1] || needs[2])) return;
    const TensorId x = fwd.inputs[0], gamma = fwd.inputs[1], beta = fwd.inputs[2];
    const std::vector<TensorId> d =
        g.add_op("batchnorm_grad", {dy[0], x, gamma, fwd.outputs[1], fwd.outputs[2]},
                 {{"eps", fwd.attrs.get("eps", 1e-5)}},
                 {grad_name(g, x), grad_name(g, gamma), grad_name(g, beta)}, Role::gradient);
    for (size_t i = 0; i < 3; ++i)
      if (needs[i]) dx[i] = d[i];
  };
  bn.replay = {"batchnorm_replay", {0, 1, 2}};
  r.add(std::move(bn));

  // x, gamma, beta -> y: batchnorm's training output alone, the batch's
  // statistics recomputed from x in batchnorm's own order (the same bits),
  // nothing else written. What a recompute of batchnorm's output runs.
  OpDef replay;
  replay.name = "batchnorm_replay";
  replay.min_inputs = replay.max_inputs = 3;
  replay.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "batchnorm_replay";
    const TensorDesc& x = *in[0];
    expect_bn_input(op, x, "input");
    const char* roles[] = {"", "gamma", "beta"};
    for (int i = 1; i < 3; ++i) expect_channels(op, *in[i], roles[i], x);
    bn_eps(op, attrs);
    return {OutSpec{x.dtype, x.shape}};
  };
  replay.flops = [](InDescs in, InDescs, const Attrs&) { return 8.0 * numel(in[0]); };
  r.add(std::move(replay));

  // dy, x, gamma, mean, var -> dx, dgamma, dbeta (the batch-statistics gradient).
  OpDef bg;
  bg.name = "batchnorm_grad";
  bg.min_inputs = bg.max_inputs = 5;
  bg.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "batchnorm_grad";
    const TensorDesc& dy = *in[0];
    expect_bn_input(op, dy, "output gradient");
    expect_like(op, *in[1], "input", dy, "output gradient");
    const char* roles[] = {"", "", "gamma", "mean", "variance"};
    for (int i = 2; i < 5; ++i) expect_channels(op, *in[i], roles[i], dy);
    bn_eps(op, attrs);
    const Shape c{dy.shape[1]};
    return {OutSpec{dy.dtype, dy.shape}, OutSpec{dy.dtype, c}, OutSpec{dy.dtype, c}};
  };
  bg.flops = [](InDescs in, InDescs, const Attrs&) { return 10.0 * numel(in[0]); };
  r.add(std::move(bg));
}

// ---- pooling ----------------------------------------------------------------------

void add_pooling(OpRegistry& r) {
  // maxpool2d(x) -> y; its gradient goes to the first maximum of each window.
  OpDef mp;
  mp.name = "maxpool2d";
  mp.min_inputs = mp.max_inputs = 1;
  mp.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "maxpool2d";
    const TensorDesc& x = *in[0];
    expect_image(op, x, "input");
    const kern::Window w = window(op, attrs, true);
    const auto [oh, ow] = out_hw(op, x.shape[2], x.shape[3], w.kh, w.kw, w);
    return {OutSpec{x.dtype, Shape{x.shape[0], x.shape[1], oh, ow}}};
  };
  mp.flops = [](InDescs, InDescs out, const Attrs& a) {
    return numel(out[0]) * static_cast<double>(a.get("kh", 1) * a.get("kw", 1));
  };
  mp.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    dx[0] = g.add_op1("maxpool2d_grad", {dy[0], x, fwd.outputs[0]}, window_attrs(fwd.attrs),
                      grad_name(g, x), Role::gradient);
  };
  r.add(std::move(mp));

  // dy, x, y -> dx.
  OpDef mg;
  mg.name = "maxpool2d_grad";
  mg.min_inputs = mg.max_inputs = 3;
  mg.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "maxpool2d_grad";
    const TensorDesc& dy = *in[0];
    const TensorDesc& x = *in[1];
    expect_image(op, dy, "output gradient");
    expect_image(op, x, "input");
    expect_dtype(op, x, dy.dtype, "input");
    expect_like(op, *in[2], "output", dy, "output gradient");
    const kern::Window w = window(op, attrs, true);
    const auto [oh, ow] = out_hw(op, x.shape[2], x.shape[3], w.kh, w.kw, w);
    if (dy.shape != Shape{x.shape[0], x.shape[1], oh, ow})
      op_error(op, fmt::format("output gradient '{}' {} is not the pooled shape of input '{}' {}",
                               dy.name, shape_str(dy.shape), x.name, shape_str(x.shape)));
    return {OutSpec{x.dtype, x.shape}};
  };
  mg.flops = [](InDescs in, InDescs, const Attrs& a) {
    return numel(in[0]) * static_cast<double>(a.get("kh", 1) * a.get("kw", 1));
  };
  r.add(std::move(mg));

  // avgpool2d(x) -> y: the window's mean; count_include_pad (default 1, as
  // PyTorch) divides by the whole window, 0 by its part inside the image.
  OpDef ap;
  ap.name = "avgpool2d";
  ap.min_inputs = ap.max_inputs = 1;
  ap.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "avgpool2d";
    const TensorDesc& x = *in[0];
    expect_image(op, x, "input");
    const kern::Window w = window(op, attrs, true);
    int_attr(op, attrs, "count_include_pad", 1, 0, 1);
    const auto [oh, ow] = out_hw(op, x.shape[2], x.shape[3], w.kh, w.kw, w);
    return {OutSpec{x.dtype, Shape{x.shape[0], x.shape[1], oh, ow}}};
  };
  ap.flops = [](InDescs, InDescs out, const Attrs& a) {
    return numel(out[0]) * static_cast<double>(a.get("kh", 1) * a.get("kw", 1));
  };
  ap.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    Attrs a = window_attrs(fwd.attrs);
    a.set("in_h", static_cast<double>(g.tensor(x).shape[2]))
        .set("in_w", static_cast<double>(g.tensor(x).shape[3]));
    dx[0] = g.add_op1("avgpool2d_grad", {dy[0]}, a, grad_name(g, x), Role::gradient);
  };
  r.add(std::move(ap));

  // dy -> dx[N,C,in_h,in_w].
  OpDef ag;
  ag.name = "avgpool2d_grad";
  ag.min_inputs = ag.max_inputs = 1;
  ag.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "avgpool2d_grad";
    const TensorDesc& dy = *in[0];
    expect_image(op, dy, "output gradient");
    const kern::Window w = window(op, attrs, true);
    int_attr(op, attrs, "count_include_pad", 1, 0, 1);
    attrs.require(op, "in_h");
    attrs.require(op, "in_w");
    const int64_t H = int_attr(op, attrs, "in_h", 1, 1), W = int_attr(op, attrs, "in_w", 1, 1);
    const auto [oh, ow] = out_hw(op, H, W, w.kh, w.kw, w);
    if (oh != dy.shape[2] || ow != dy.shape[3])
      op_error(op, fmt::format("output gradient '{}' {} does not match the {}x{} output of a {}x{} "
                               "input",
                               dy.name, shape_str(dy.shape), oh, ow, H, W));
    return {OutSpec{dy.dtype, Shape{dy.shape[0], dy.shape[1], H, W}}};
  };
  ag.flops = [](InDescs, InDescs out, const Attrs&) { return numel(out[0]); };
  r.add(std::move(ag));

  // global_avgpool(x[N,C,H,W]) -> y[N,C]: each channel's mean.
  OpDef gp;
  gp.name = "global_avgpool";
  gp.min_inputs = gp.max_inputs = 1;
  gp.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const TensorDesc& x = *in[0];
    expect_image("global_avgpool", x, "input");
    if (x.shape[2] < 1 || x.shape[3] < 1)
      op_error("global_avgpool",
               fmt::format("input '{}' {} has an empty image", x.name, shape_str(x.shape)));
    return {OutSpec{x.dtype, Shape{x.shape[0], x.shape[1]}}};
  };
  gp.flops = [](InDescs in, InDescs, const Attrs&) { return numel(in[0]); };
  gp.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    const Attrs a{{"in_h", static_cast<double>(g.tensor(x).shape[2])},
                  {"in_w", static_cast<double>(g.tensor(x).shape[3])}};
    dx[0] = g.add_op1("global_avgpool_grad", {dy[0]}, a, grad_name(g, x), Role::gradient);
  };
  r.add(std::move(gp));

  // dy[N,C] -> dx[N,C,in_h,in_w] = dy / (in_h·in_w) everywhere.
  OpDef gg;
  gg.name = "global_avgpool_grad";
  gg.min_inputs = gg.max_inputs = 1;
  gg.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "global_avgpool_grad";
    const TensorDesc& dy = *in[0];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    attrs.require(op, "in_h");
    attrs.require(op, "in_w");
    const int64_t H = int_attr(op, attrs, "in_h", 1, 1), W = int_attr(op, attrs, "in_w", 1, 1);
    return {OutSpec{dy.dtype, Shape{dy.shape[0], dy.shape[1], H, W}}};
  };
  gg.flops = [](InDescs, InDescs out, const Attrs&) { return numel(out[0]); };
  r.add(std::move(gg));
}

}  // namespace

void register_conv_ops(OpRegistry& r) {
  add_conv(r);
  add_batchnorm(r);
  add_pooling(r);
}

}  // namespace pooch
