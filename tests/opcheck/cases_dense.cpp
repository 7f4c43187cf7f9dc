// Kernel checker cases for the dense family (docs/OPS.md, "Dense"). Forward
// ops only: the runner derives linear_grad_*, relu_grad, gelu_grad,
// dropout_grad and layernorm_grad from the backward builders.
//
// Every op sweeps an empty shape, a single element, odd sizes that fit no
// vector width or block, and one larger shape that spreads over the threads.
#include <cmath>
#include <limits>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

// Moves values off the kink of relu: a central difference that straddles 0
// measures half the slope, not the slope on either side.
void keep_off_zero(HostTensor& t, double margin = 0.05) {
  for (double& v : t.values)
    if (std::fabs(v) < margin) v = static_cast<float>(v < 0 ? v - 2 * margin : v + 2 * margin);
}

std::string shape_label(const Shape& s) {
  return "shape=" + shape_str(s);
}

// Elementwise shapes: scalar, empty, one element, odd, three-dimensional and
// one above the CPU kernels' threading grain.
const std::vector<Shape>& elementwise_shapes() {
  static const std::vector<Shape> shapes = {{},     {0},       {1},    {7},
                                            {3, 5}, {2, 3, 5}, {0, 4}, {96, 517}};
  return shapes;
}

// NaN, ±Inf and huge values, for NaN/Inf parity between kernels. Not
// differentiated: finite differences through them mean nothing.
HostTensor specials(Rng& rng, std::string name) {
  HostTensor t = randn(rng, {4, 9}, std::move(name), 2.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double vals[] = {
      std::numeric_limits<double>::quiet_NaN(), inf, -inf, 1e30, -1e30, 0.0, -0.0, 1e-40, -40.0};
  for (size_t i = 0; i < std::size(vals); ++i) t.values[i * 3] = vals[i];
  return t;
}

void linear_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, I, O;
  };
  for (const Dims d : {Dims{0, 5, 7}, Dims{1, 1, 1}, Dims{3, 5, 7}, Dims{4, 0, 3}, Dims{5, 3, 0},
                       Dims{17, 33, 9}, Dims{64, 256, 96}}) {
    for (const bool bias : {false, true}) {
      OpCase c;
      c.op = "linear";
      // W scaled as at initialisation so y stays O(1) whatever I is.
      const double ws = 1.0 / std::sqrt(static_cast<double>(d.I > 0 ? d.I : 1));
      c.inputs = {randn(rng, {d.B, d.I}, "x"), randn(rng, {d.O, d.I}, "W", ws)};
      c.grad_inputs = {0, 1};
      if (bias) {
        c.inputs.push_back(randn(rng, {d.O}, "b"));
        c.grad_inputs.push_back(2);
      }
      // OpenBLAS sums in its own order (blocked, FMA), so agreement is to a
      // few float roundings of the larger partial sums, not to the last bit.
      c.rtol = 1e-4;
      c.atol = 2e-5;
      c.label = "B=" + std::to_string(d.B) + " I=" + std::to_string(d.I) +
                " O=" + std::to_string(d.O) + (bias ? " bias" : " no bias");
      out.push_back(std::move(c));
    }
  }
}

void activation_cases(Rng& rng, std::vector<OpCase>& out) {
  for (const Shape& s : elementwise_shapes()) {
    OpCase relu;
    relu.op = "relu";
    relu.inputs = {randn(rng, s, "x", 2.0)};
    keep_off_zero(relu.inputs[0]);
    relu.grad_inputs = {0};
    relu.label = shape_label(s);
    out.push_back(std::move(relu));

    OpCase gelu;
    gelu.op = "gelu";
    gelu.inputs = {randn(rng, s, "x", 2.5)};
    keep_off_zero(gelu.inputs[0]);
    gelu.grad_inputs = {0};
    // The fast erf and exp are polynomial fits good to a few ulp; in the
    // left tail 1 + erf cancels, so the error there is absolute, ~1e-6.
    gelu.rtol = 1e-5;
    gelu.atol = 3e-6;
    gelu.label = shape_label(s);
    out.push_back(std::move(gelu));
  }
  for (const char* op : {"relu", "gelu"}) {
    OpCase c;
    c.op = op;
    c.inputs = {specials(rng, "x")};
    c.rtol = 1e-5;
    c.atol = 3e-6;
    c.label = "NaN/Inf";
    out.push_back(std::move(c));
  }
}

void dropout_cases(Rng& rng, std::vector<OpCase>& out) {
  const Shape shapes[] = {{0}, {1}, {3, 5}, {2, 3, 7}, {64, 257}};
  for (const Shape& s : shapes)
    for (const double p : {0.0, 0.1, 0.5}) {
      OpCase c;
      c.op = "dropout";
      // A key with the top bit set checks that it reaches Philox as 32 bits.
      c.attrs = Attrs{{"p", p}, {"key", s.size() == 2 ? 3735928559.0 : 7.0}};
      c.inputs = {randn(rng, s, "x")};
      c.grad_inputs = {0};
      // The kept values are scaled by 1/(1 - p) in double, in every kernel.
      c.rtol = 1e-6;
      c.atol = 0;
      c.label = shape_label(s) + " p=" + std::to_string(p).substr(0, 3);
      out.push_back(std::move(c));
    }
  OpCase c;
  c.op = "dropout";
  c.attrs = Attrs{{"p", 0.25}, {"key", 11.0}};
  c.inputs = {specials(rng, "x")};
  c.rtol = 1e-6;
  c.atol = 0;
  c.label = "NaN/Inf p=0.25";
  out.push_back(std::move(c));
  // Inference: dropout passes its input through, whatever p.
  OpCase inf;
  inf.op = "dropout";
  inf.attrs = Attrs{{"p", 0.5}, {"key", 5.0}};
  inf.inputs = {randn(rng, {9, 33}, "x")};
  inf.grad_inputs = {0};
  inf.rtol = 0;
  inf.atol = 0;
  inf.training = false;
  inf.label = "[9,33] p=0.5 inference";
  out.push_back(std::move(inf));
}

void layernorm_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, D;
    double eps;
  };
  for (const Dims d :
       {Dims{0, 4, 1e-5}, Dims{1, 1, 1e-5}, Dims{3, 1, 1e-5}, Dims{3, 37, 1e-5}, Dims{2, 5, 1e-2},
        Dims{4, 0, 1e-5}, Dims{64, 256, 1e-5}, Dims{9, 130, 1e-5}}) {
    OpCase c;
    c.op = "layernorm";
    c.attrs = Attrs{{"eps", d.eps}};
    HostTensor x = randn(rng, {d.B, d.D}, "x", 2.0);
    // An offset common to each row: the statistics must not lose the
    // variance to cancellation.
    for (double& v : x.values) v = static_cast<float>(v + 3.0);
    c.inputs = {std::move(x), randn(rng, {d.D}, "gamma"), randn(rng, {d.D}, "beta")};
    c.grad_inputs = {0, 1, 2};
    c.rtol = 1e-4;
    c.atol = 2e-5;
    c.label = "B=" + std::to_string(d.B) + " D=" + std::to_string(d.D) +
              (d.eps != 1e-5 ? " eps=0.01" : "");
    out.push_back(std::move(c));
  }
}

void add_cases(Rng& rng, std::vector<OpCase>& out) {
  for (const Shape& s : elementwise_shapes()) {
    OpCase c;
    c.op = "add";
    c.inputs = {randn(rng, s, "a"), randn(rng, s, "b")};
    c.grad_inputs = {0, 1};
    c.label = shape_label(s);
    out.push_back(std::move(c));
  }
  OpCase c;
  c.op = "add";
  c.inputs = {specials(rng, "a"), specials(rng, "b")};
  c.label = "NaN/Inf";
  out.push_back(std::move(c));
}

}  // namespace

std::vector<OpCase> dense_cases(Rng& rng) {
  std::vector<OpCase> out;
  linear_cases(rng, out);
  activation_cases(rng, out);
  dropout_cases(rng, out);
  layernorm_cases(rng, out);
  add_cases(rng, out);
  return out;
}

}  // namespace pooch::opcheck
