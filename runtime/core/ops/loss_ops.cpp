// Loss ops (docs/OPS.md, "Losses"): bce_logits, squared_hinge, softmax_xent
// and their gradient ops, with dense targets t[B,L], and the same three with
// the targets as a label CSR (bce_logits_csr, ...: lptr i32[B+1], lidx i32[M],
// the positive labels of each row). A loss is the root of the backward pass,
// so its builder needs no incoming gradient: it emits the *_grad op, whose
// `scale` (1 here) stands in for dL/dloss.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "../op_registry.h"

namespace pooch {
namespace {

bool is_float_operand(DType t) {
  return t == DType::f32 || t == DType::f64;
}

// x[B,L] and t[B,L] of one float type; returns nothing, throws naming the op.
void check_logits_targets(std::string_view op, InDescs in) {
  const TensorDesc& x = *in[0];
  const TensorDesc& t = *in[1];
  expect_rank(op, x, 2, "logits");
  expect_rank(op, t, 2, "targets");
  if (!is_float_operand(x.dtype))
    op_error(op, fmt::format("logits '{}' must be f32 (or f64 for checking), got {}", x.name,
                             dtype_name(x.dtype)));
  expect_dtype(op, t, x.dtype, "targets");
  if (x.shape != t.shape)
    op_error(op, fmt::format("logits '{}' {} and targets '{}' {} must have the same shape", x.name,
                             shape_str(x.shape), t.name, shape_str(t.shape)));
}

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

void check_scale(std::string_view op, const Attrs& attrs) {
  const double s = attrs.get("scale", 1.0);
  if (!std::isfinite(s)) op_error(op, fmt::format("attribute scale must be finite, got {}", s));
}

// Per-element cost, transcendental functions counted as one operation each.
struct LossCost {
  double fwd;
  double grad;
};

void add_loss(OpRegistry& r, const std::string& name, LossCost cost) {
  const std::string grad_name = name + "_grad";

  OpDef loss;
  loss.name = name;
  loss.min_inputs = loss.max_inputs = 2;
  loss.is_loss = true;
  loss.infer = [name](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    check_logits_targets(name, in);
    return {OutSpec{in[0]->dtype, Shape{}}};
  };
  loss.flops = [cost](InDescs in, InDescs, const Attrs&) {
    return cost.fwd * static_cast<double>(in[0]->numel());
  };
  // Targets are data: only the logits get a gradient.
  loss.backward = [grad_name](Graph& g, const Node& fwd, std::span<const TensorId>,
                              const std::vector<char>& needs, std::span<TensorId> dx) {
    if (needs.empty() || !needs[0]) return;
    const TensorId x = fwd.inputs[0];
    dx[0] = g.add_op1(grad_name, {x, fwd.inputs[1]}, Attrs{{"scale", 1.0}},
                      g.unique_name(g.tensor(x).name + ".grad"), Role::gradient);
  };
  r.add(std::move(loss));

  OpDef grad;
  grad.name = grad_name;
  grad.min_inputs = grad.max_inputs = 2;
  grad.infer = [grad_name](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    check_logits_targets(grad_name, in);
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
  // The label-CSR forms: one elementwise pass at t = 0 plus corrections at
  // the listed labels.
  add_csr_loss(r, "bce_logits_csr", {8, 5});
  add_csr_loss(r, "squared_hinge_csr", {7, 7});
  add_csr_loss(r, "softmax_xent_csr", {6, 8});
}

}  // namespace pooch
