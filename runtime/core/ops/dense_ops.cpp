// Dense ops (docs/OPS.md, "Dense"): linear, relu, gelu, dropout, layernorm,
// add and the gradient ops their backward builders emit. Float operands are
// f32; f64 is accepted too because the kernel checker builds the same graphs
// in double for finite differences. Every output takes the dtype of the
// first operand, and all float operands of one op must agree on it.
#include <fmt/format.h>

#include <cmath>

#include "../op_registry.h"

namespace pooch {
namespace {

// p in [0, 1) and a 32-bit key, both required: a dropout without an explicit
// key would share its mask with every other keyless dropout.
void check_dropout_attrs(std::string_view op, const Attrs& a) {
  const double p = a.require(op, "p");
  if (!std::isfinite(p) || p < 0.0 || p >= 1.0)
    op_error(op, fmt::format("attribute p = {} is out of range; it must lie in [0, 1)", p));
  const double key = a.require(op, "key");
  if (!(key >= 0.0 && key <= 4294967295.0 && key == std::floor(key)))
    op_error(op, fmt::format("attribute key = {} must be a whole number in [0, 2^32)", key));
}

// An elementwise op y = f(x) of any shape, with flops per element.
OpDef unary(const std::string& name, double flops_per_element) {
  OpDef d;
  d.name = name;
  d.min_inputs = d.max_inputs = 1;
  d.infer = [name](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    expect_float(name, *in[0], "input");
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  d.flops = [flops_per_element](InDescs in, InDescs, const Attrs&) {
    return flops_per_element * numel(in[0]);
  };
  return d;
}

// An elementwise op of two operands of one shape (dy and a saved tensor, or
// the two summands of add).
OpDef binary(const std::string& name, const char* role0, const char* role1,
             double flops_per_element) {
  OpDef d;
  d.name = name;
  d.min_inputs = d.max_inputs = 2;
  d.infer = [name, role0, role1](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    expect_float(name, *in[0], role0);
    expect_like(name, *in[1], role1, *in[0], role0);
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  d.flops = [flops_per_element](InDescs in, InDescs, const Attrs&) {
    return flops_per_element * numel(in[0]);
  };
  return d;
}

void add_linear(OpRegistry& r) {
  OpDef lin;
  lin.name = "linear";
  lin.min_inputs = 2;
  lin.max_inputs = 3;
  lin.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "linear";
    const TensorDesc& x = *in[0];
    const TensorDesc& w = *in[1];
    expect_rank(op, x, 2, "input");
    expect_float(op, x, "input");
    expect_rank(op, w, 2, "weight");
    expect_dtype(op, w, x.dtype, "weight");
    expect_dim(op, w, 1, "weight", x, 1, "input");
    if (in.size() > 2) {
      const TensorDesc& b = *in[2];
      expect_rank(op, b, 1, "bias");
      expect_dtype(op, b, x.dtype, "bias");
      expect_dim(op, b, 0, "bias", w, 0, "weight");
    }
    return {OutSpec{x.dtype, Shape{x.shape[0], w.shape[0]}}};
  };
  lin.flops = [](InDescs in, InDescs out, const Attrs&) {
    const double bias = in.size() > 2 ? numel(out[0]) : 0.0;
    return 2.0 * numel(out[0]) * static_cast<double>(in[0]->shape[1]) + bias;
  };
  lin.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                    const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor) return;
    const TensorId x = fwd.inputs[0], w = fwd.inputs[1];
    const bool has_bias = fwd.inputs.size() > 2;
    if (needs[0])
      dx[0] = g.add_op1("linear_grad_input", {dy[0], w}, {}, grad_name(g, x), Role::gradient);
    const bool need_b = has_bias && needs[2];
    if (!needs[1] && !need_b) return;
    // dW and db come from one op. Without a bias the db output still exists
    // (it costs one pass over dy) but nothing reads it.
    const std::string db_name =
        has_bias ? grad_name(g, fwd.inputs[2]) : g.unique_name(g.tensor(w).name + ".bias.grad");
    const std::vector<TensorId> dwb =
        g.add_op("linear_grad_weight", {dy[0], x}, {}, {grad_name(g, w), db_name}, Role::gradient);
    if (needs[1]) dx[1] = dwb[0];
    if (need_b) dx[2] = dwb[1];
  };
  r.add(std::move(lin));

  OpDef gi;
  gi.name = "linear_grad_input";
  gi.min_inputs = gi.max_inputs = 2;
  gi.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "linear_grad_input";
    const TensorDesc& dy = *in[0];
    const TensorDesc& w = *in[1];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_rank(op, w, 2, "weight");
    expect_dtype(op, w, dy.dtype, "weight");
    expect_dim(op, w, 0, "weight", dy, 1, "output gradient");
    return {OutSpec{dy.dtype, Shape{dy.shape[0], w.shape[1]}}};
  };
  gi.flops = [](InDescs in, InDescs out, const Attrs&) {
    return 2.0 * numel(out[0]) * static_cast<double>(in[0]->shape[1]);
  };
  r.add(std::move(gi));

  OpDef gw;
  gw.name = "linear_grad_weight";
  gw.min_inputs = gw.max_inputs = 2;
  gw.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "linear_grad_weight";
    const TensorDesc& dy = *in[0];
    const TensorDesc& x = *in[1];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_rank(op, x, 2, "input");
    expect_dtype(op, x, dy.dtype, "input");
    expect_dim(op, x, 0, "input", dy, 0, "output gradient");
    return {OutSpec{dy.dtype, Shape{dy.shape[1], x.shape[1]}},
            OutSpec{dy.dtype, Shape{dy.shape[1]}}};
  };
  gw.flops = [](InDescs in, InDescs out, const Attrs&) {
    return 2.0 * numel(out[0]) * static_cast<double>(in[0]->shape[0]) + numel(in[0]);
  };
  r.add(std::move(gw));
}

void add_activations(OpRegistry& r) {
  OpDef relu = unary("relu", 1);
  relu.inplace_input = 0;
  // relu_grad reads the output, not the input: y > 0 exactly where x > 0, and
  // the input may already have been overwritten by an in-place relu.
  relu.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                     const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    dx[0] = g.add_op1("relu_grad", {dy[0], fwd.outputs[0]}, {}, grad_name(g, fwd.inputs[0]),
                      Role::gradient);
  };
  r.add(std::move(relu));
  r.add(binary("relu_grad", "output gradient", "relu output", 1));

  // Per element: a scale, erf, an affine map and the product (transcendental
  // functions count as one operation).
  OpDef gelu = unary("gelu", 5);
  gelu.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                     const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    dx[0] = g.add_op1("gelu_grad", {dy[0], fwd.inputs[0]}, {}, grad_name(g, fwd.inputs[0]),
                      Role::gradient);
  };
  r.add(std::move(gelu));
  // Φ(x) as above, φ(x) (square, scale, exp, scale), x·φ, the sum and dy·().
  r.add(binary("gelu_grad", "output gradient", "gelu input", 10));
}

void add_dropout(OpRegistry& r) {
  for (const char* name : {"dropout", "dropout_grad"}) {
    OpDef d = unary(name, 2);  // compare, multiply; the random bits are not flops
    d.infer = [name = std::string(name)](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
      expect_float(name, *in[0], name == "dropout" ? "input" : "output gradient");
      check_dropout_attrs(name, attrs);
      return {OutSpec{in[0]->dtype, in[0]->shape}};
    };
    if (std::string_view(name) == "dropout")
      // The mask is regenerated from (seed, step, key), never stored.
      d.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                      const std::vector<char>& needs, std::span<TensorId> dx) {
        if (dy[0] == kNoTensor || !needs[0]) return;
        const Attrs a{{"p", fwd.attrs.get("p", 0.0)}, {"key", fwd.attrs.get("key", 0.0)}};
        dx[0] = g.add_op1("dropout_grad", {dy[0]}, a, grad_name(g, fwd.inputs[0]), Role::gradient);
      };
    r.add(std::move(d));
  }
}

void add_layernorm(OpRegistry& r) {
  OpDef ln;
  ln.name = "layernorm";
  ln.min_inputs = ln.max_inputs = 3;
  ln.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "layernorm";
    const TensorDesc& x = *in[0];
    expect_rank(op, x, 2, "input");
    expect_float(op, x, "input");
    for (int i = 1; i < 3; ++i) {
      const char* role = i == 1 ? "gamma" : "beta";
      expect_rank(op, *in[i], 1, role);
      expect_dtype(op, *in[i], x.dtype, role);
      expect_dim(op, *in[i], 0, role, x, 1, "input");
    }
    const double eps = attrs.get("eps", 1e-5);
    if (!std::isfinite(eps) || eps < 0.0)
      op_error(op, fmt::format("attribute eps = {} must be finite and >= 0", eps));
    return {OutSpec{x.dtype, x.shape}, OutSpec{x.dtype, Shape{x.shape[0]}},
            OutSpec{x.dtype, Shape{x.shape[0]}}};
  };
  // Per element: the mean (1), the variance (3) and the affine normalisation (4).
  ln.flops = [](InDescs in, InDescs, const Attrs&) { return 8.0 * numel(in[0]); };
  // mean and rstd are statistics saved for layernorm_grad, not values a loss
  // depends on: only the gradient of y flows back.
  ln.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !(needs[0] || needs[1] || needs[2])) return;
    const TensorId x = fwd.inputs[0], gamma = fwd.inputs[1], beta = fwd.inputs[2];
    const std::vector<TensorId> d =
        g.add_op("layernorm_grad", {dy[0], x, gamma, fwd.outputs[1], fwd.outputs[2]}, {},
                 {grad_name(g, x), grad_name(g, gamma), grad_name(g, beta)}, Role::gradient);
    for (size_t i = 0; i < 3; ++i)
      if (needs[i]) dx[i] = d[i];
  };
  r.add(std::move(ln));

  OpDef lg;
  lg.name = "layernorm_grad";
  lg.min_inputs = lg.max_inputs = 5;
  lg.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "layernorm_grad";
    const TensorDesc& dy = *in[0];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_like(op, *in[1], "input", dy, "output gradient");
    expect_rank(op, *in[2], 1, "gamma");
    expect_dtype(op, *in[2], dy.dtype, "gamma");
    expect_dim(op, *in[2], 0, "gamma", dy, 1, "output gradient");
    for (int i = 3; i < 5; ++i) {
      const char* role = i == 3 ? "mean" : "rstd";
      expect_rank(op, *in[i], 1, role);
      expect_dtype(op, *in[i], dy.dtype, role);
      expect_dim(op, *in[i], 0, role, dy, 0, "output gradient");
    }
    return {OutSpec{dy.dtype, dy.shape}, OutSpec{dy.dtype, Shape{dy.shape[1]}},
            OutSpec{dy.dtype, Shape{dy.shape[1]}}};
  };
  // Per element: g = dy·γ, xhat (2), the two row sums (3), dx (4), dγ (2), dβ (1).
  lg.flops = [](InDescs in, InDescs, const Attrs&) { return 13.0 * numel(in[0]); };
  r.add(std::move(lg));
}

void add_add(OpRegistry& r) {
  OpDef add = binary("add", "first summand", "second summand", 1);
  add.inplace_input = 0;
  // The gradient of a sum is dy for both summands: no op at all.
  add.backward = [](Graph&, const Node&, std::span<const TensorId> dy,
                    const std::vector<char>& needs, std::span<TensorId> dx) {
    for (size_t i = 0; i < 2; ++i)
      if (needs[i]) dx[i] = dy[0];
  };
  r.add(std::move(add));
}

}  // namespace

void register_dense_ops(OpRegistry& r) {
  add_linear(r);
  add_activations(r);
  add_dropout(r);
  add_layernorm(r);
  add_add(r);
}

}  // namespace pooch
