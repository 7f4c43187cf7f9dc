// The fused fixed fan-in output layer (docs/OPS.md, "Sparse"): ffi_linear,
// the loss over label-CSR targets and the logits' gradient in one op, computed
// label tile by label tile, so that a training step never holds the [B, L]
// logits (nor their gradient); and ffi_topk, the same layer's top-k labels
// per row from a running top-k. The unfused ops (ffi_linear, *_csr losses,
// topk) stay the reference: the fused ones compute the same values.
//
//   ffi_loss(h[B,H], index[L,K], w[L,K], b[L], lptr i32[B+1], lidx i32[M];
//            loss = 0 bce | 1 squared hinge | 2 softmax) -> scalar
//   ffi_loss_grad(same inputs; loss, scale, with_loss) -> dh[B,H], dw[L,K], db[L]
//                                                        [, loss with with_loss = 1]
//   ffi_topk(h, index, w, b; k) -> values[B,k], indices i32[B,k]
//
// With with_loss = 1, ffi_loss_grad also gives the loss, as ffi_loss computes
// it: it forms every logit for the gradient anyway, so a train step reads the
// loss from it and never runs ffi_loss (one pass over the [B, L] logits
// instead of two). The backward builder sets it; without it the op has the
// three outputs that files written before it store (their graphs are
// rebuilt op by op when read).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "../op_registry.h"
#include "op_checks.h"

namespace pooch {
namespace {

constexpr double kInt32Max = static_cast<double>(std::numeric_limits<int32_t>::max());

// h[B,H] float, index[L,K], w[L,K], b[L] (the ffi_linear operands).
void check_layer(std::string_view op, InDescs in) {
  const TensorDesc& h = *in[0];
  const TensorDesc& index = *in[1];
  expect_rank(op, h, 2, "input");
  expect_float(op, h, "input");
  check_index(op, index, h.shape[1]);
  expect_like_index(op, *in[2], "weight", index, h.dtype);
  expect_rank(op, *in[3], 1, "bias");
  expect_dtype(op, *in[3], h.dtype, "bias");
  expect_dim(op, *in[3], 0, "bias", index, 0, "index");
}

// The layer plus label-CSR targets for its [B, L] logits, and the loss kind.
void check_layer_loss(std::string_view op, InDescs in, const Attrs& attrs) {
  check_layer(op, in);
  // The targets' checks, against a stand-in for the logits the op never forms.
  TensorDesc logits;
  logits.name = "(logits)";
  logits.dtype = in[0]->dtype;
  logits.shape = Shape{in[0]->shape[0], in[1]->shape[0]};
  const TensorDesc* csr[3] = {&logits, in[4], in[5]};
  check_logits_label_csr(op, InDescs(csr, 3));
  const double k = attrs.require(op, "loss");
  if (!(k == 0 || k == 1 || k == 2))
    op_error(op, fmt::format("attribute loss = {} must be 0 (bce), 1 (squared hinge) or 2 "
                             "(softmax)",
                             k));
}

double macs(InDescs in) {
  return static_cast<double>(in[0]->shape[0]) * numel(in[1]);
}

void add_ffi_loss(OpRegistry& r) {
  OpDef loss;
  loss.name = "ffi_loss";
  loss.min_inputs = loss.max_inputs = 6;
  loss.is_loss = true;
  loss.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    check_layer_loss("ffi_loss", in, attrs);
    return {OutSpec{in[0]->dtype, Shape{}}};
  };
  // The layer's multiply-adds, then a few operations per logit for the loss.
  loss.flops = [](InDescs in, InDescs, const Attrs&) {
    return 2.0 * macs(in) + 8.0 * static_cast<double>(in[0]->shape[0]) * numel(in[3]);
  };
  // The structure (index) and the targets are not parameters.
  loss.backward = [](Graph& g, const Node& fwd, std::span<const TensorId>,
                     const std::vector<char>& needs, std::span<TensorId> dx) {
    if (!needs[0] && !needs[2] && !needs[3]) return;
    Attrs a = fwd.attrs;
    a.set("scale", 1.0);
    a.set("with_loss", 1.0);
    const TensorId h = fwd.inputs[0], w = fwd.inputs[2], b = fwd.inputs[3];
    const TensorId loss = fwd.outputs[0];
    const std::vector<TensorId> outs =
        g.add_op("ffi_loss_grad", std::vector<TensorId>(fwd.inputs.begin(), fwd.inputs.end()), a,
                 {grad_name(g, h), grad_name(g, w), grad_name(g, b),
                  g.unique_name(g.tensor(loss).name + ".again")},
                 Role::gradient);
    g.tensor(outs[3]).role = g.tensor(loss).role;
    g.tensor(outs[3]).repeats = loss;
    if (needs[0]) dx[0] = outs[0];
    if (needs[2]) dx[2] = outs[1];
    if (needs[3]) dx[3] = outs[2];
  };
  r.add(std::move(loss));

  OpDef grad;
  grad.name = "ffi_loss_grad";
  grad.min_inputs = grad.max_inputs = 6;
  grad.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    check_layer_loss("ffi_loss_grad", in, attrs);
    const double s = attrs.get("scale", 1.0);
    if (!std::isfinite(s))
      op_error("ffi_loss_grad", fmt::format("attribute scale must be finite, got {}", s));
    const double with_loss = attrs.get("with_loss", 0.0);
    if (!(with_loss == 0 || with_loss == 1))
      op_error(
          "ffi_loss_grad",
          fmt::format("attribute with_loss = {} must be 0 or 1 (1: the loss as well)", with_loss));
    const DType dt = in[0]->dtype;
    std::vector<OutSpec> out{OutSpec{dt, in[0]->shape}, OutSpec{dt, in[1]->shape},
                             OutSpec{dt, in[3]->shape}};
    if (with_loss == 1) out.push_back(OutSpec{dt, Shape{}});
    return out;
  };
  // The logits, then dw and dh: three multiply-adds per connection and row;
  // per logit its loss term and its gradient.
  grad.flops = [](InDescs in, InDescs, const Attrs&) {
    return 6.0 * macs(in) + 16.0 * static_cast<double>(in[0]->shape[0]) * numel(in[3]);
  };
  r.add(std::move(grad));
}

void add_ffi_topk(OpRegistry& r) {
  OpDef d;
  d.name = "ffi_topk";
  d.min_inputs = d.max_inputs = 4;
  d.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "ffi_topk";
    check_layer(op, in);
    const int64_t labels = in[1]->shape[0];
    if (static_cast<double>(labels) > kInt32Max)
      op_error(op,
               fmt::format("index '{}' has more labels than i32 indices can hold", in[1]->name));
    const double k = attrs.require(op, "k");
    if (!(k >= 1 && k <= static_cast<double>(labels) && k == std::floor(k)))
      op_error(op, fmt::format("attribute k = {} must be a whole number in [1, L] = [1, {}]", k,
                               labels));
    const Shape s{in[0]->shape[0], static_cast<int64_t>(k)};
    return {OutSpec{in[0]->dtype, s}, OutSpec{DType::i32, s}};
  };
  d.flops = [](InDescs in, InDescs, const Attrs&) {
    return 2.0 * macs(in) + 2.0 * static_cast<double>(in[0]->shape[0]) * numel(in[3]);
  };
  r.add(std::move(d));
}

}  // namespace

void register_ffi_head_ops(OpRegistry& r) {
  add_ffi_loss(r);
  add_ffi_topk(r);
}

}  // namespace pooch
