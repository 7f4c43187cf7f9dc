// Loss ops (docs/OPS.md, "Losses"): bce_logits, squared_hinge, softmax_xent
// and their gradient ops, with dense targets t[..., L] (rank 2 to 4, leading
// dimensions as rows), and the same three with the targets as a label CSR
// (bce_logits_csr, ...: x[B,L], lptr i32[B+1], lidx i32[M], the positive
// labels of each row); mse with row weights, and softmax_xent_index with one
// class id per row. A loss is the root of the backward pass,
// so its builder needs no incoming gradient: it emits the *_grad op, whose
// `scale` (1 here) stands in for dL/dloss.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "../op_registry.h"
#include "op_checks.h"

namespace pooch {
namespace {

bool is_float_operand(DType t) {
  return t == DType::f32 || t == DType::f64;
}

// The dense-target losses take x[..., L] of rank 2 to 4: every dimension but
// the last counts rows (the kernels see [rows, L]).
constexpr int kMinRank = 2;
constexpr int kMaxRank = 4;

void expect_rows_rank(std::string_view op, const TensorDesc& t, const char* role) {
  const auto rank = static_cast<int>(t.shape.size());
  if (rank < kMinRank || rank > kMaxRank)
    op_error(op, fmt::format("{} '{}' must have {} to {} dimensions ([..., L]), got {}", role,
                             t.name, kMinRank, kMaxRank, shape_str(t.shape)));
}

void expect_float_operand(std::string_view op, const TensorDesc& x, const char* role) {
  if (!is_float_operand(x.dtype))
    op_error(op, fmt::format("{} '{}' must be f32 (or f64 for checking), got {}", role, x.name,
                             dtype_name(x.dtype)));
}

// Rows of x[..., L]: the product of all dimensions but the last.
int64_t leading_rows(const TensorDesc& x) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.shape.size(); ++i) rows *= x.shape[i];
  return rows;
}

// x[..., L] and t of the same shape and float type; throws naming the op.
void check_logits_targets(std::string_view op, InDescs in) {
  const TensorDesc& x = *in[0];
  const TensorDesc& t = *in[1];
  expect_rows_rank(op, x, "logits");
  expect_float_operand(op, x, "logits");
  expect_dtype(op, t, x.dtype, "targets");
  if (x.shape != t.shape)
    op_error(op, fmt::format("logits '{}' {} and targets '{}' {} must have the same shape", x.name,
                             shape_str(x.shape), t.name, shape_str(t.shape)));
}

}  // namespace

// x[B,L] float, lptr i32[B+1], lidx i32[M]. The label ids themselves are
// data: the batch loader checks them, the kernels trust them.
void check_logits_label_csr(std::string_view op, InDescs in) {
  const TensorDesc& x = *in[0];
  const TensorDesc& ptr = *in[1];
  const TensorDesc& idx = *in[2];
  expect_rank(op, x, 2, "logits");
  if (!is_float_operand(x.dtype))
    op_error(op, fmt::format("logits '{}' must be f32 (or f64 for checking), got {}", x.name,
                             dtype_name(x.dtype)));
  expect_rank(op, ptr, 1, "label row offsets");
  expect_dtype(op, ptr, DType::i32, "label row offsets");
  if (ptr.shape[0] != x.shape[0] + 1)
    op_error(op, fmt::format("label row offsets '{}' {} must hold B+1 = {} entries for logits "
                             "'{}' {}",
                             ptr.name, shape_str(ptr.shape), x.shape[0] + 1, x.name,
                             shape_str(x.shape)));
  expect_rank(op, idx, 1, "label ids");
  expect_dtype(op, idx, DType::i32, "label ids");
  if (static_cast<double>(idx.shape[0]) > std::numeric_limits<int32_t>::max())
    op_error(op, fmt::format("label ids '{}' {}: a capacity above 2^31-1 does not fit the i32 "
                             "row offsets",
                             idx.name, shape_str(idx.shape)));
}

namespace {

// pred[..., C] float, target of the same shape, row_weight[rows] of the same
// float type (rows = the product of the leading dimensions).
void check_mse(std::string_view op, InDescs in) {
  const TensorDesc& p = *in[0];
  const TensorDesc& w = *in[2];
  expect_rows_rank(op, p, "prediction");
  expect_float_operand(op, p, "prediction");
  expect_like(op, *in[1], "target", p, "prediction");
  expect_rank(op, w, 1, "row weights");
  expect_dtype(op, w, p.dtype, "row weights");
  if (w.shape[0] != leading_rows(p))
    op_error(op,
             fmt::format("row weights '{}' {} must hold one weight per row of prediction "
                         "'{}' {}: {}",
                         w.name, shape_str(w.shape), p.name, shape_str(p.shape), leading_rows(p)));
}

// logits[..., C] float and target i32[...] (the logits' shape without its
// last dimension). The class ids are data: the session checks them, the
// kernels ignore a row whose id is outside [0, C).
void check_index_targets(std::string_view op, InDescs in) {
  const TensorDesc& x = *in[0];
  const TensorDesc& t = *in[1];
  expect_rows_rank(op, x, "logits");
  expect_float_operand(op, x, "logits");
  expect_dtype(op, t, DType::i32, "class ids");
  const Shape lead(x.shape.begin(), x.shape.end() - 1);
  if (t.shape != lead)
    op_error(op,
             fmt::format("class ids '{}' {} must have the shape {} of logits '{}' {} without "
                         "its last dimension",
                         t.name, shape_str(t.shape), shape_str(lead), x.name, shape_str(x.shape)));
  if (static_cast<double>(x.shape.back()) > std::numeric_limits<int32_t>::max())
    op_error(op, fmt::format("logits '{}' {}: more classes than i32 class ids can name", x.name,
                             shape_str(x.shape)));
}

void check_scale(std::string_view op, const Attrs& attrs) {
  const double s = attrs.get("scale", 1.0);
  if (!std::isfinite(s)) op_error(op, fmt::format("attribute scale must be finite, got {}", s));
}

// Per-element cost, transcendental functions counted as one operation each.
struct LossCost {
  double fwd;
  double grad;
};

using CheckFn = void (*)(std::string_view op, InDescs in);

// A loss over dense operands: inputs checked by `check` (input 0 the only one
// differentiated), a scalar output; its gradient op takes the same inputs
// and `scale`, and returns a tensor shaped as input 0.
void add_loss(OpRegistry& r, const std::string& name, LossCost cost, int n_inputs = 2,
              CheckFn check = check_logits_targets) {
  const std::string grad_name = name + "_grad";

  OpDef loss;
  loss.name = name;
  loss.min_inputs = loss.max_inputs = n_inputs;
  loss.is_loss = true;
  loss.infer = [name, check](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    check(name, in);
    return {OutSpec{in[0]->dtype, Shape{}}};
  };
  loss.flops = [cost](InDescs in, InDescs, const Attrs&) {
    return cost.fwd * static_cast<double>(in[0]->numel());
  };
  // Targets (and row weights) are data: only input 0 gets a gradient.
  loss.backward = [grad_name](Graph& g, const Node& fwd, std::span<const TensorId>,
                              const std::vector<char>& needs, std::span<TensorId> dx) {
    if (needs.empty() || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    dx[0] = g.add_op1(grad_name, fwd.inputs, Attrs{{"scale", 1.0}},
                      g.unique_name(g.tensor(x).name + ".grad"), Role::gradient);
  };
  r.add(std::move(loss));

  OpDef grad;
  grad.name = grad_name;
  grad.min_inputs = grad.max_inputs = n_inputs;
  grad.infer = [grad_name, check](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    check(grad_name, in);
    check_scale(grad_name, attrs);
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  grad.flops = [cost](InDescs in, InDescs, const Attrs&) {
    return cost.grad * static_cast<double>(in[0]->numel());
  };
  r.add(std::move(grad));
}

// The label-CSR form: inputs x, lptr, lidx; the same losses as the dense form
// with t[b,l] = 1 for the listed labels and 0 elsewhere. Costs: the dense
// per-element cost over x plus a few operations per listed label.
void add_csr_loss(OpRegistry& r, const std::string& name, LossCost cost) {
  const std::string grad_name = name + "_grad";

  OpDef loss;
  loss.name = name;
  loss.min_inputs = loss.max_inputs = 3;
  loss.is_loss = true;
  loss.infer = [name](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    check_logits_label_csr(name, in);
    return {OutSpec{in[0]->dtype, Shape{}}};
  };
  loss.flops = [cost](InDescs in, InDescs, const Attrs&) {
    return cost.fwd * (static_cast<double>(in[0]->numel()) + 2.0 * numel(in[2]));
  };
  // The labels are data: only the logits get a gradient.
  loss.backward = [grad_name](Graph& g, const Node& fwd, std::span<const TensorId>,
                              const std::vector<char>& needs, std::span<TensorId> dx) {
    if (needs.empty() || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    dx[0] = g.add_op1(grad_name, {x, fwd.inputs[1], fwd.inputs[2]}, Attrs{{"scale", 1.0}},
                      g.unique_name(g.tensor(x).name + ".grad"), Role::gradient);
  };
  r.add(std::move(loss));

  OpDef grad;
  grad.name = grad_name;
  grad.min_inputs = grad.max_inputs = 3;
  grad.infer = [grad_name](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    check_logits_label_csr(grad_name, in);
    check_scale(grad_name, attrs);
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  grad.flops = [cost](InDescs in, InDescs, const Attrs&) {
    return cost.grad * (static_cast<double>(in[0]->numel()) + numel(in[2]));
  };
  r.add(std::move(grad));
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  // bce: max, x*t, subtract, |x|, exp, log1p, add, accumulate; its gradient a
  // sigmoid (exp, add, divide), subtract, scale.
  add_loss(r, "bce_logits", {8, 5});
  // hinge: s = 2t-1, 1 - s*x, max, square, accumulate; gradient the margin
  // again and two multiplies.
  add_loss(r, "squared_hinge", {7, 7});
  // softmax: max, exp(x - m) summed, t*(lse - x) summed; the gradient
  // recomputes the normaliser, sums t and forms p*sum(t) - t, scaled.
  add_loss(r, "softmax_xent", {7, 10});
  // mse: subtract, square, accumulate, the row weight once per row; its
  // gradient a subtract and two multiplies.
  add_loss(r, "mse", {3, 3}, 3, check_mse);
  // softmax with one class id per row: max, exp(x - m) summed; the gradient
  // recomputes both and forms the scaled softmax.
  add_loss(r, "softmax_xent_index", {4, 7}, 2, check_index_targets);
  // The label-CSR forms: one elementwise pass at t = 0 plus corrections at
  // the listed labels.
  add_csr_loss(r, "bce_logits_csr", {8, 5});
  add_csr_loss(r, "squared_hinge_csr", {7, 7});
  add_csr_loss(r, "softmax_xent_csr", {6, 8});
}

}  // namespace pooch
