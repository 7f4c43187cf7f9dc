// Kernel checker cases for the convolutional family (docs/OPS.md,
// "Convolutional"): conv2d over strides, padding, dilation and groups (with
// and without a bias), batch normalisation in training and inference (and
// its replay, which a recompute runs), max
// and average pooling, global average pooling. The runner derives the
// gradient ops from the backward builders and checks them against finite
// differences.
#include <fmt/format.h>

#include <cmath>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

void conv_cases(Rng& rng, std::vector<OpCase>& out) {
  struct C {
    int64_t N, Cin, H, W, O, KH, KW, s, p, d, g;
  };
  const C cases[] = {{1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1},      // one pixel
                     {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1},      // same padding, odd image
                     {2, 3, 9, 8, 5, 3, 3, 2, 1, 1, 1},      // stride 2
                     {1, 4, 9, 9, 6, 3, 3, 1, 2, 2, 2},      // dilation 2, two groups
                     {2, 4, 6, 7, 4, 3, 3, 1, 1, 1, 4},      // depthwise
                     {2, 3, 11, 10, 8, 7, 7, 2, 3, 1, 1},    // a ResNet stem
                     {3, 8, 5, 5, 16, 1, 1, 2, 0, 1, 1},     // a 1x1 downsample
                     {2, 6, 5, 4, 6, 2, 3, 1, 0, 1, 3},      // rectangular window, 3 groups
                     {0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1},      // an empty batch
                     {8, 16, 14, 14, 32, 3, 3, 1, 1, 1, 1},  // larger: spreads over threads
                     // 1x1 over 1024 channels: the weight gradient leaves oneDNN's blocked
                     // layout through BlockedToPlain (kernels/cpu), its last block of
                     // output channels (40 of 48) partly padding.
                     {2, 1024, 3, 3, 40, 1, 1, 1, 0, 1, 1}};
  for (const C& c : cases)
    for (const bool bias : {false, true}) {
      OpCase k;
      k.op = "conv2d";
      k.attrs.set("stride_h", c.s).set("stride_w", c.s).set("pad_h", c.p).set("pad_w", c.p);
      k.attrs.set("dil_h", c.d).set("dil_w", c.d).set("groups", c.g);
      const double fan_in = static_cast<double>(c.Cin / c.g * c.KH * c.KW);
      k.inputs = {randn(rng, {c.N, c.Cin, c.H, c.W}, "x"),
                  randn(rng, {c.O, c.Cin / c.g, c.KH, c.KW}, "w", 1.0 / std::sqrt(fan_in))};
      k.grad_inputs = {0, 1};
      if (bias) {
        k.inputs.push_back(randn(rng, {c.O}, "b"));
        k.grad_inputs.push_back(2);
      }
      // oneDNN sums in its own (blocked, FMA) order.
      k.rtol = 1e-4;
      k.atol = 3e-5;
      k.label = fmt::format("x={}x{}x{}x{} O={} k={}x{} s={} p={} d={} g={}{}", c.N, c.Cin, c.H,
                            c.W, c.O, c.KH, c.KW, c.s, c.p, c.d, c.g, bias ? " bias" : "");
      // The two large cases are there for the fast kernels (threads, blocked
      // layouts), which are compared with the reference all the same; the
      // small ones check the gradients' formulas by finite differences, which
      // would repeat the large ones' reference pass ~300 times (most of the
      // checker's time under ASan).
      k.finite_differences = c.N * c.Cin * c.H * c.W * c.O <= 20000;
      out.push_back(std::move(k));
    }
}

void batchnorm_cases(Rng& rng, std::vector<OpCase>& out) {
  // {8, 32, 14, 14} spreads over the threads; {0, 3, 2, 2} has no values.
  const Shape shapes[] = {{4, 3},       {2, 3, 5, 4},    {1, 2, 3, 3}, {8, 16, 7, 7},
                          {3, 5, 1, 1}, {8, 32, 14, 14}, {0, 3, 2, 2}};
  for (const Shape& s : shapes)
    for (const bool training : {true, false}) {
      OpCase k;
      k.op = "batchnorm";
      const int64_t C = s[1];
      HostTensor rvar = randn(rng, {C}, "running_var");
      for (double& v : rvar.values) v = 0.5 + std::fabs(v);
      k.inputs = {randn(rng, s, "x", 2.0), randn(rng, {C}, "gamma"), randn(rng, {C}, "beta"),
                  randn(rng, {C}, "running_mean"), rvar};
      for (double& v : k.inputs[0].values) v += 0.5;  // a mean away from 0
      k.attrs.set("eps", 1e-5).set("momentum", 0.1);
      k.training = training;
      // Gradients are those of the batch statistics: training only.
      if (training) k.grad_inputs = {0, 1, 2};
      k.rtol = 1e-4;
      k.atol = 2e-5;
      k.fd_tol = 1e-5;
      k.label = fmt::format("x={} {}", shape_str(s), training ? "training" : "inference");
      if (training) {
        // The recompute's op reads the same x, gamma and beta.
        OpCase replay = k;
        replay.op = "batchnorm_replay";
        replay.inputs.resize(3);
        replay.attrs = Attrs{}.set("eps", 1e-5);
        replay.grad_inputs.clear();
        replay.label = fmt::format("x={}", shape_str(s));
        out.push_back(std::move(replay));
      }
      out.push_back(std::move(k));
    }
  // Channels whose mean (100) is large against their spread (0.01): the
  // normalised values must not carry the mean's rounding error (forward
  // only; finite differences at this spread say little).
  OpCase k;
  k.op = "batchnorm";
  k.inputs = {randn(rng, {4, 6, 5, 5}, "x", 0.01), randn(rng, {6}, "gamma"),
              randn(rng, {6}, "beta"), randn(rng, {6}, "running_mean"),
              randn(rng, {6}, "running_var")};
  for (double& v : k.inputs[0].values) v += 100;
  for (double& v : k.inputs[4].values) v = 0.5 + std::fabs(v);
  k.attrs.set("eps", 1e-5).set("momentum", 0.1);
  k.rtol = 1e-4;
  k.atol = 2e-5;
  k.label = "x=[4,6,5,5] mean 100, spread 0.01";
  out.push_back(std::move(k));
}

// Values with no ties inside a window: a central difference at a tie
// measures the average of two slopes, not the gradient of either.
HostTensor distinct(Rng& rng, Shape s, std::string name) {
  HostTensor t = randn(rng, std::move(s), std::move(name));
  for (size_t i = 0; i < t.values.size(); ++i)
    t.values[i] = t.values[i] + 1e-3 * static_cast<double>(i % 97);
  return t;
}

void pool_cases(Rng& rng, std::vector<OpCase>& out) {
  struct P {
    int64_t N, C, H, W, k, s, p;
  };
  const P cases[] = {{1, 1, 1, 1, 1, 1, 0}, {2, 3, 6, 6, 2, 2, 0}, {2, 3, 7, 5, 3, 2, 1},
                     {1, 2, 9, 9, 3, 1, 1}, {2, 4, 8, 7, 3, 3, 0}, {4, 16, 28, 28, 3, 2, 1},
                     {0, 3, 4, 4, 2, 2, 0}};
  for (const P& c : cases) {
    OpCase mp;
    mp.op = "maxpool2d";
    mp.attrs.set("kh", c.k).set("kw", c.k).set("stride_h", c.s).set("stride_w", c.s);
    mp.attrs.set("pad_h", c.p).set("pad_w", c.p);
    mp.inputs = {distinct(rng, {c.N, c.C, c.H, c.W}, "x")};
    mp.grad_inputs = {0};
    mp.label = fmt::format("x={}x{}x{}x{} k={} s={} p={}", c.N, c.C, c.H, c.W, c.k, c.s, c.p);
    out.push_back(mp);

    for (const int inc : {1, 0}) {
      if (!inc && c.p == 0) continue;  // the same divisor without padding
      OpCase ap = mp;
      ap.op = "avgpool2d";
      ap.inputs = {randn(rng, {c.N, c.C, c.H, c.W}, "x")};
      ap.attrs.set("count_include_pad", inc);
      ap.rtol = 1e-5;
      ap.atol = 1e-6;
      ap.label = mp.label + (inc ? "" : " exclude pad");
      out.push_back(std::move(ap));
    }
  }
  const Shape gshapes[] = {{1, 1, 1, 1}, {2, 3, 4, 5}, {3, 7, 1, 6}, {8, 64, 7, 7}, {0, 4, 3, 3}};
  for (const Shape& s : gshapes) {
    OpCase g;
    g.op = "global_avgpool";
    g.inputs = {randn(rng, s, "x")};
    g.grad_inputs = {0};
    g.label = fmt::format("x={}", shape_str(s));
    out.push_back(std::move(g));
  }
}

}  // namespace

std::vector<OpCase> conv_cases(Rng& rng) {
  std::vector<OpCase> out;
  conv_cases(rng, out);
  batchnorm_cases(rng, out);
  pool_cases(rng, out);
  return out;
}

}  // namespace pooch::opcheck
