// Dense ops (docs/OPS.md, "Dense"): linear, relu, gelu, dropout, layernorm,
// add and the gradient ops their backward builders emit; and the layout ops
// (docs/OPS.md, "Layout"): reshape and transpose. Float operands are f32;
// f64 is accepted too because the kernel checker builds the same graphs in
// double for finite differences. Every output takes the dtype of the first
// operand, and all float operands of one op must agree on it.
//
// linear and layernorm work over the last dimension of a rank 2 to 4 input:
// its leading dimensions are rows (x[..., I] is a [rows, I] matrix).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "../../../kernels/common/kernel_abi.h"
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

// A tensor of rank 2 to 4 whose last dimension is the op's width.
void expect_rows(std::string_view op, const TensorDesc& t, const char* role) {
  const size_t r = t.shape.size();
  if (r < 2 || r > static_cast<size_t>(kern::kMaxDims))
    op_error(op, fmt::format("{} '{}' must have 2 to {} dimensions, got {}", role, t.name,
                             kern::kMaxDims, shape_str(t.shape)));
}

// t's leading dimensions (all but the last) equal ref's.
void expect_same_rows(std::string_view op, const TensorDesc& t, const char* role,
                      const TensorDesc& ref, const char* ref_role) {
  if (t.shape.size() != ref.shape.size() ||
      !std::equal(t.shape.begin(), t.shape.end() - 1, ref.shape.begin()))
    op_error(op, fmt::format("{} '{}' {} must have the leading dimensions of {} '{}' {}", role,
                             t.name, shape_str(t.shape), ref_role, ref.name, shape_str(ref.shape)));
}

// ref's shape with the last dimension replaced by `last`.
Shape with_last(const Shape& ref, int64_t last) {
  Shape s = ref;
  s.back() = last;
  return s;
}

// ref's shape without its last dimension.
Shape leading(const Shape& ref) {
  return Shape(ref.begin(), ref.end() - 1);
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
    expect_rows(op, x, "input");
    expect_float(op, x, "input");
    expect_rank(op, w, 2, "weight");
    expect_dtype(op, w, x.dtype, "weight");
    expect_dim(op, w, 1, "weight", x, static_cast<int>(x.shape.size()) - 1, "input");
    if (in.size() > 2) {
      const TensorDesc& b = *in[2];
      expect_rank(op, b, 1, "bias");
      expect_dtype(op, b, x.dtype, "bias");
      expect_dim(op, b, 0, "bias", w, 0, "weight");
    }
    return {OutSpec{x.dtype, with_last(x.shape, w.shape[0])}};
  };
  lin.flops = [](InDescs in, InDescs out, const Attrs&) {
    const double bias = in.size() > 2 ? numel(out[0]) : 0.0;
    return 2.0 * numel(out[0]) * static_cast<double>(in[0]->shape.back()) + bias;
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
    expect_rows(op, dy, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_rank(op, w, 2, "weight");
    expect_dtype(op, w, dy.dtype, "weight");
    expect_dim(op, w, 0, "weight", dy, static_cast<int>(dy.shape.size()) - 1, "output gradient");
    return {OutSpec{dy.dtype, with_last(dy.shape, w.shape[1])}};
  };
  gi.flops = [](InDescs in, InDescs out, const Attrs&) {
    return 2.0 * numel(out[0]) * static_cast<double>(in[0]->shape.back());
  };
  r.add(std::move(gi));

  OpDef gw;
  gw.name = "linear_grad_weight";
  gw.min_inputs = gw.max_inputs = 2;
  gw.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "linear_grad_weight";
    const TensorDesc& dy = *in[0];
    const TensorDesc& x = *in[1];
    expect_rows(op, dy, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_rows(op, x, "input");
    expect_dtype(op, x, dy.dtype, "input");
    expect_same_rows(op, x, "input", dy, "output gradient");
    return {OutSpec{dy.dtype, Shape{dy.shape.back(), x.shape.back()}},
            OutSpec{dy.dtype, Shape{dy.shape.back()}}};
  };
  gw.flops = [](InDescs in, InDescs out, const Attrs&) {
    const double rows = numel(in[0]) / std::max(1.0, static_cast<double>(in[0]->shape.back()));
    return 2.0 * numel(out[0]) * rows + numel(in[0]);
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
    expect_rows(op, x, "input");
    expect_float(op, x, "input");
    const int last = static_cast<int>(x.shape.size()) - 1;
    for (int i = 1; i < 3; ++i) {
      const char* role = i == 1 ? "gamma" : "beta";
      expect_rank(op, *in[i], 1, role);
      expect_dtype(op, *in[i], x.dtype, role);
      expect_dim(op, *in[i], 0, role, x, last, "input");
    }
    const double eps = attrs.get("eps", 1e-5);
    if (!std::isfinite(eps) || eps < 0.0)
      op_error(op, fmt::format("attribute eps = {} must be finite and >= 0", eps));
    // One mean and one rstd per row, shaped as the leading dimensions.
    return {OutSpec{x.dtype, x.shape}, OutSpec{x.dtype, leading(x.shape)},
            OutSpec{x.dtype, leading(x.shape)}};
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
    expect_rows(op, dy, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_like(op, *in[1], "input", dy, "output gradient");
    const int last = static_cast<int>(dy.shape.size()) - 1;
    expect_rank(op, *in[2], 1, "gamma");
    expect_dtype(op, *in[2], dy.dtype, "gamma");
    expect_dim(op, *in[2], 0, "gamma", dy, last, "output gradient");
    for (int i = 3; i < 5; ++i) {
      const char* role = i == 3 ? "mean" : "rstd";
      expect_dtype(op, *in[i], dy.dtype, role);
      if (in[i]->shape != leading(dy.shape))
        op_error(op, fmt::format("{} '{}' {} must be shaped as the leading dimensions of the "
                                 "output gradient '{}' {}",
                                 role, in[i]->name, shape_str(in[i]->shape), dy.name,
                                 shape_str(dy.shape)));
    }
    return {OutSpec{dy.dtype, dy.shape}, OutSpec{dy.dtype, Shape{dy.shape.back()}},
            OutSpec{dy.dtype, Shape{dy.shape.back()}}};
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

// y = s·x (attribute "s", finite): LoRA's alpha/rank on an adapter's path.
// Its gradient is the same op: dx = s·dy.
void add_scale(OpRegistry& r) {
  OpDef sc = unary("scale", 1);
  sc.inplace_input = 0;
  sc.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    expect_float("scale", *in[0], "input");
    const double s = attrs.get("s", 1.0);
    if (!std::isfinite(s)) op_error("scale", fmt::format("attribute s = {} must be finite", s));
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  sc.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    dx[0] = g.add_op1("scale", {dy[0]}, Attrs{{"s", fwd.attrs.get("s", 1.0)}},
                      grad_name(g, fwd.inputs[0]), Role::gradient);
  };
  r.add(std::move(sc));
}

// ---- layout: reshape, transpose ------------------------------------------------

bool whole_in(double v, double lo, double hi) {
  return v >= lo && v <= hi && v == std::floor(v);
}

// Attributes d<i> (or p<i>) for i >= rank are a mistake, not something to ignore.
void expect_no_attrs_past(std::string_view op, const Attrs& a, char prefix, int rank) {
  for (int i = rank; i < kern::kMaxDims; ++i) {
    const std::string k = fmt::format("{}{}", prefix, i);
    if (a.has(k))
      op_error(op, fmt::format("attribute {} is given, but the shape has {} dimension{}", k, rank,
                               rank == 1 ? "" : "s"));
  }
}

// reshape's target: `rank` dimensions d0..d(rank-1), one of them possibly -1
// (whatever the others leave of the input's elements).
Shape reshape_target(std::string_view op, const TensorDesc& x, const Attrs& a) {
  const double r = a.require(op, "rank");
  if (!whole_in(r, 0, kern::kMaxDims))
    op_error(op, fmt::format("attribute rank = {} must be a whole number in [0, {}]", r,
                             kern::kMaxDims));
  const int rank = static_cast<int>(r);
  expect_no_attrs_past(op, a, 'd', rank);
  Shape s(static_cast<size_t>(rank), 0);
  int inferred = -1;
  double known = 1;
  for (int i = 0; i < rank; ++i) {
    const std::string k = fmt::format("d{}", i);
    const double v = a.require(op, k);
    if (v == -1) {
      if (inferred >= 0)
        op_error(op, fmt::format("attributes d{} and {} are both -1; at most one dimension is "
                                 "inferred",
                                 inferred, k));
      inferred = i;
      continue;
    }
    if (!whole_in(v, 0, 9007199254740992.0))
      op_error(op, fmt::format("attribute {} = {} must be a whole number >= 0, or -1", k, v));
    s[static_cast<size_t>(i)] = static_cast<int64_t>(v);
    known *= v;
  }
  const int64_t n = x.numel();
  if (inferred >= 0) {
    if (known == 0)
      op_error(op, fmt::format("the -1 in d{} cannot be inferred: the other dimensions of {} hold "
                               "no elements",
                               inferred, shape_str(s)));
    const auto k = static_cast<int64_t>(known);
    if (known > 9007199254740992.0 || n % k != 0)
      op_error(op, fmt::format("input '{}' {} has {} elements, which the other dimensions ({} "
                               "elements) do not divide",
                               x.name, shape_str(x.shape), n, k));
    s[static_cast<size_t>(inferred)] = n / k;
  }
  double total = 1;
  for (int64_t d : s) total *= static_cast<double>(d);
  if (total != static_cast<double>(n))
    op_error(op, fmt::format("input '{}' {} has {} elements; the target shape {} has {:.0f}",
                             x.name, shape_str(x.shape), n, shape_str(s), total));
  return s;
}

// The attributes that reshape to `shape`.
Attrs reshape_attrs(const Shape& shape) {
  Attrs a;
  a.set("rank", static_cast<double>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i)
    a.set(fmt::format("d{}", i), static_cast<double>(shape[i]));
  return a;
}

// transpose's permutation: p0..p(n-1), each of 0..n-1 once (n = the input's rank).
std::vector<int> transpose_perm(std::string_view op, const TensorDesc& x, const Attrs& a) {
  const int n = static_cast<int>(x.shape.size());
  expect_no_attrs_past(op, a, 'p', n);
  std::vector<int> p(static_cast<size_t>(n));
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int k = 0; k < n; ++k) {
    const std::string key = fmt::format("p{}", k);
    const double v = a.require(op, key);
    if (!whole_in(v, 0, n - 1))
      op_error(op, fmt::format("attribute {} = {} must name a dimension of input '{}' {} (0 to {})",
                               key, v, x.name, shape_str(x.shape), n - 1));
    const auto d = static_cast<size_t>(v);
    if (seen[d])
      op_error(op, fmt::format("dimension {} appears twice in the permutation; p0..p{} must name "
                               "each dimension once",
                               d, n - 1));
    seen[d] = 1;
    p[static_cast<size_t>(k)] = static_cast<int>(d);
  }
  return p;
}

void add_layout(OpRegistry& r) {
  OpDef rs;
  rs.name = "reshape";
  rs.min_inputs = rs.max_inputs = 1;
  rs.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    return {OutSpec{in[0]->dtype, reshape_target("reshape", *in[0], attrs)}};
  };
  rs.flops = [](InDescs, InDescs, const Attrs&) { return 0.0; };
  // Row-major elements in the same order: always the input's bytes.
  rs.view = [](InDescs, const Attrs&) { return true; };
  rs.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    dx[0] = g.add_op1("reshape", {dy[0]}, reshape_attrs(g.tensor(x).shape), grad_name(g, x),
                      Role::gradient);
  };
  r.add(std::move(rs));

  OpDef tr;
  tr.name = "transpose";
  tr.min_inputs = tr.max_inputs = 1;
  tr.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::vector<int> p = transpose_perm("transpose", *in[0], attrs);
    Shape s(p.size());
    for (size_t k = 0; k < p.size(); ++k) s[k] = in[0]->shape[static_cast<size_t>(p[k])];
    return {OutSpec{in[0]->dtype, s}};
  };
  tr.flops = [](InDescs, InDescs, const Attrs&) { return 0.0; };
  // The bytes stay in place when the dimensions of size above 1 keep their
  // order: only size-1 dimensions move.
  tr.view = [](InDescs in, const Attrs& attrs) {
    const std::vector<int> p = transpose_perm("transpose", *in[0], attrs);
    int last = -1;
    for (int d : p) {
      if (in[0]->shape[static_cast<size_t>(d)] == 1) continue;
      if (d < last) return false;
      last = d;
    }
    return true;
  };
  // The inverse permutation: dx = transpose(dy, q) with q[p[k]] = k.
  tr.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                   const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    const std::vector<int> p = transpose_perm("transpose", g.tensor(x), fwd.attrs);
    Attrs inv;
    for (size_t k = 0; k < p.size(); ++k) inv.set(fmt::format("p{}", p[k]), static_cast<double>(k));
    dx[0] = g.add_op1("transpose", {dy[0]}, inv, grad_name(g, x), Role::gradient);
  };
  r.add(std::move(tr));
}

}  // namespace

void register_dense_ops(OpRegistry& r) {
  add_linear(r);
  add_activations(r);
  add_dropout(r);
  add_layernorm(r);
  add_add(r);
  add_scale(r);
  add_layout(r);
}

}  // namespace pooch
