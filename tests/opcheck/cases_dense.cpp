// Kernel checker cases for the dense family (docs/OPS.md, "Dense") and the
// layout ops (reshape, transpose). Forward ops only: the runner derives
// linear_grad_*, relu_grad, gelu_grad, dropout_grad, layernorm_grad and the
// reshapes and transposes of the backward passes from the backward builders.
//
// Every op sweeps an empty shape, a single element, odd sizes that fit no
// vector width or block, and one larger shape that spreads over the threads.
#include <fmt/format.h>

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

// Elementwise shapes: scalar, empty, one element, odd, ranks 3 and 4 (one of
// them empty), and one above the CPU kernels' threading grain.
const std::vector<Shape>& elementwise_shapes() {
  static const std::vector<Shape> shapes = {{},        {0},          {1},       {7},    {3, 5},
                                            {2, 3, 5}, {2, 1, 3, 4}, {2, 0, 3}, {0, 4}, {96, 517}};
  return shapes;
}

std::string shape_dims(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += fmt::format("{}{}", i ? "x" : "", s[i]);
  return r;
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
  // B = 1 takes the CPU kernel's GEMV path (a decoding step): {1, 300, 129}
  // at a size where OpenBLAS splits it over threads.
  for (const Dims d : {Dims{0, 5, 7}, Dims{1, 1, 1}, Dims{1, 300, 129}, Dims{3, 5, 7},
                       Dims{4, 0, 3}, Dims{5, 3, 0}, Dims{17, 33, 9}, Dims{64, 256, 96}}) {
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
  // Ranks 3 and 4: x[..., I], the leading dimensions are rows. Odd sizes, a
  // size-1 dimension, empty rows and an empty I.
  struct Nd {
    Shape x;
    int64_t O;
  };
  for (const Nd& d : {Nd{{2, 3, 5}, 7}, Nd{{3, 1, 4}, 1}, Nd{{1, 1, 64}, 33}, Nd{{2, 1, 3, 4}, 3},
                      Nd{{2, 3, 2, 17}, 9}, Nd{{0, 3, 5}, 4}, Nd{{2, 0, 3, 5}, 2}, Nd{{3, 4, 0}, 2},
                      Nd{{4, 16, 64}, 48}}) {
    for (const bool bias : {false, true}) {
      OpCase c;
      c.op = "linear";
      const int64_t I = d.x.back();
      const double ws = 1.0 / std::sqrt(static_cast<double>(I > 0 ? I : 1));
      c.inputs = {randn(rng, d.x, "x"), randn(rng, {d.O, I}, "W", ws)};
      c.grad_inputs = {0, 1};
      if (bias) {
        c.inputs.push_back(randn(rng, {d.O}, "b"));
        c.grad_inputs.push_back(2);
      }
      c.rtol = 1e-4;
      c.atol = 2e-5;
      c.label =
          "x=" + shape_dims(d.x) + " O=" + std::to_string(d.O) + (bias ? " bias" : " no bias");
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
  for (const Shape& s : elementwise_shapes()) {
    OpCase sc;  // LoRA's alpha/rank: a factor that is not a power of two
    sc.op = "scale";
    sc.attrs = Attrs{{"s", -1.75}};
    sc.inputs = {randn(rng, s, "x")};
    sc.grad_inputs = {0};
    sc.label = shape_label(s) + " s=-1.75";
    out.push_back(std::move(sc));
  }
  for (const char* op : {"relu", "gelu", "scale"}) {
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
  const Shape shapes[] = {{0}, {1}, {3, 5}, {2, 3, 7}, {2, 2, 3, 5}, {64, 257}};
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
  // Ranks 3 and 4: over the last dimension, mean and rstd shaped as the
  // leading dimensions.
  for (const Shape& s : {Shape{2, 3, 7}, Shape{3, 1, 1}, Shape{2, 2, 3, 5}, Shape{0, 3, 4},
                         Shape{2, 3, 0}, Shape{4, 8, 130}}) {
    OpCase c;
    c.op = "layernorm";
    HostTensor x = randn(rng, s, "x", 2.0);
    for (double& v : x.values) v = static_cast<float>(v + 3.0);
    c.inputs = {std::move(x), randn(rng, {s.back()}, "gamma"), randn(rng, {s.back()}, "beta")};
    c.grad_inputs = {0, 1, 2};
    c.rtol = 1e-4;
    c.atol = 2e-5;
    c.label = "x=" + shape_dims(s);
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

Attrs shape_attrs(const Shape& target) {
  Attrs a;
  a.set("rank", static_cast<double>(target.size()));
  for (size_t i = 0; i < target.size(); ++i)
    a.set(fmt::format("d{}", i), static_cast<double>(target[i]));
  return a;
}

Attrs perm_attrs(const std::vector<int>& p) {
  Attrs a;
  for (size_t k = 0; k < p.size(); ++k) a.set(fmt::format("p{}", k), p[k]);
  return a;
}

// Layout ops move elements and compute nothing: every kernel must give the
// reference's bits exactly.
void layout_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Re {
    Shape x, target;  // target may hold one -1
  };
  for (const Re& r :
       {Re{{2, 3, 4}, {6, 4}}, Re{{2, 3, 4}, {-1}}, Re{{24}, {2, -1, 3, 2}}, Re{{3, 5}, {5, 1, 3}},
        Re{{0, 3}, {3, 0}}, Re{{5}, {5, 1, 1, 1}}, Re{{}, {1, 1}}, Re{{64, 257}, {257, -1}}}) {
    OpCase c;
    c.op = "reshape";
    c.attrs = shape_attrs(r.target);
    c.inputs = {randn(rng, r.x, "x")};
    c.grad_inputs = {0};
    c.rtol = 0;
    c.atol = 0;
    c.label = shape_dims(r.x) + " to " + shape_str(r.target);
    out.push_back(std::move(c));
  }
  struct Tr {
    Shape x;
    std::vector<int> p;
  };
  for (const Tr& t :
       {Tr{{3, 5}, {1, 0}}, Tr{{2, 3, 4}, {2, 0, 1}}, Tr{{2, 3, 4}, {0, 2, 1}},
        Tr{{2, 3, 4, 5}, {3, 1, 0, 2}}, Tr{{2, 1, 3, 1}, {3, 2, 1, 0}}, Tr{{3, 1, 4}, {1, 0, 2}},
        Tr{{1, 5}, {1, 0}}, Tr{{0, 3}, {1, 0}}, Tr{{2, 0, 3}, {2, 1, 0}}, Tr{{7}, {0}},
        Tr{{64, 257}, {1, 0}}, Tr{{5, 7, 33, 3}, {0, 3, 2, 1}}}) {
    OpCase c;
    c.op = "transpose";
    c.attrs = perm_attrs(t.p);
    c.inputs = {randn(rng, t.x, "x")};
    c.grad_inputs = {0};
    c.rtol = 0;
    c.atol = 0;
    std::string p;
    for (int d : t.p) p += std::to_string(d);
    c.label = shape_dims(t.x) + " p=" + p;
    out.push_back(std::move(c));
  }
  // Any dtype: indices move as they are.
  OpCase ri;
  ri.op = "reshape";
  ri.attrs = shape_attrs({4, 3});
  ri.inputs = {randint(rng, {3, 4}, 0, 1000, DType::i32, "idx")};
  ri.label = "i32 3x4 to [4,3]";
  out.push_back(std::move(ri));
  OpCase ti;
  ti.op = "transpose";
  ti.attrs = perm_attrs({1, 2, 0});
  ti.inputs = {randint(rng, {3, 5, 2}, 0, 65536, DType::u16, "idx")};
  ti.label = "u16 3x5x2 p=120";
  out.push_back(std::move(ti));
}

// f64 operands: the reference computes in double, the fast kernels take f32
// only, so their supports() refuses these and the checker reports them as
// "not supported" without running them.
void f64_cases(Rng& rng, std::vector<OpCase>& out) {
  auto f64 = [](HostTensor t) {
    t.dtype = DType::f64;
    return t;
  };
  OpCase relu;
  relu.op = "relu";
  relu.inputs = {f64(randn(rng, {3, 5}, "x", 2.0))};
  keep_off_zero(relu.inputs[0]);
  relu.grad_inputs = {0};
  relu.label = "f64 3x5";
  out.push_back(std::move(relu));
  OpCase lin;
  lin.op = "linear";
  lin.inputs = {f64(randn(rng, {2, 3, 4}, "x")), f64(randn(rng, {5, 4}, "W", 0.5)),
                f64(randn(rng, {5}, "b"))};
  lin.grad_inputs = {0, 1, 2};
  lin.label = "f64 x=2x3x4 O=5 bias";
  out.push_back(std::move(lin));
}

}  // namespace

std::vector<OpCase> dense_cases(Rng& rng) {
  std::vector<OpCase> out;
  linear_cases(rng, out);
  activation_cases(rng, out);
  dropout_cases(rng, out);
  layernorm_cases(rng, out);
  add_cases(rng, out);
  layout_cases(rng, out);
  f64_cases(rng, out);
  return out;
}

}  // namespace pooch::opcheck
