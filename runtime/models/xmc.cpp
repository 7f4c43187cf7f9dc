#include "xmc.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/error.h"
#include "layers.h"

namespace pooch {

std::unique_ptr<Model> build_xmc_model(const ModelSpec& spec) {
  validate_spec(spec);
  ModelSpec s = spec;
  if (s.run.max_nnz == 0) s.run.max_nnz = s.run.batch * 64;
  if (s.run.max_labels == 0) s.run.max_labels = s.run.batch * 32;
  s.run.topk = static_cast<int>(std::min<int64_t>(s.run.topk, s.labels));
  auto m = new_model(s);
  Graph& g = m->graph;
  const int64_t B = s.run.batch, L = s.labels;
  TensorId ptr = kNoTensor, idx = kNoTensor, val = kNoTensor, logits = kNoTensor;
  // The fused fixed fan-in output layer's operands (h, index, w, b), when it
  // is used: no [B, L] logits are ever formed (ffi_loss, ffi_topk).
  std::vector<TensorId> head;
  const AddWeight weight = weight_adder(*m);

  TensorId h = kNoTensor;
  bool sparse_pending = s.input == InputKind::sparse;
  if (sparse_pending) {
    ptr = g.add_tensor({"batch.ptr", DType::i32, {B + 1}, Role::input});
    idx = g.add_tensor({"batch.idx", DType::i32, {s.run.max_nnz}, Role::input});
    val = g.add_tensor({"batch.val", DType::f32, {s.run.max_nnz}, Role::input});
    m->inputs.push_back({"batch.ptr", ptr});
    m->inputs.push_back({"batch.idx", idx});
    m->inputs.push_back({"batch.val", val});
  } else {
    h = g.add_tensor({"batch.x", DType::f32, {B, s.input_width}, Role::input});
    m->inputs.push_back({"batch.x", h, 0});
  }
  // The targets as a label CSR (no [B, L] array is filled or copied per
  // step). lidx is added just before the loss: weights draw their initial
  // values by tensor id, so they keep the ids they had with the one dense
  // target tensor that lptr replaces here.
  const TensorId lptr = g.add_tensor({"batch.lptr", DType::i32, {B + 1}, Role::input});

  int64_t width = s.input_width;
  // Most labels are absent from most rows: start every logit low so the
  // first steps are not spent pushing them down.
  const double bias0 = s.loss == LossKind::softmax ? 0.0 : -std::log(static_cast<double>(L));
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    const std::string p = fmt::format("fc{}", i);
    switch (l.kind) {
      case LayerKind::linear:
        if (sparse_pending) {
          // Bag-of-words rows have unit length, so each unit sums a few
          // weights: draw them as for a layer whose fan-in is a typical row.
          const TensorId w = weight(p + ".weight", DType::f32, {width, l.width}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(8.0));
          const TensorId b =
              weight(p + ".bias", DType::f32, {l.width}, true, WeightInit::Kind::zeros, 0);
          const TensorId pre = g.add_op1("sparse_linear", {ptr, idx, val, w, b}, {}, p + ".pre");
          h = l.activation == "none" ? pre : g.add_op1(l.activation, {pre}, {}, p + ".act");
          width = l.width;
          sparse_pending = false;
          break;
        }
        [[fallthrough]];
      case LayerKind::dropout:
      case LayerKind::layernorm:
        h = add_hidden_layer(g, l, i, h, width, weight);
        break;
      case LayerKind::ffi_head: {
        const int64_t K = l.fan_in;
        const DType idx_t = width <= 65536 ? DType::u16 : DType::i32;
        const TensorId index = weight("head.index", idx_t, {L, K}, false,
                                      WeightInit::Kind::fan_in_index, double(width));
        const TensorId w = weight("head.weight", DType::f32, {L, K}, true,
                                  WeightInit::Kind::uniform, 1.0 / std::sqrt(double(K)));
        const TensorId b =
            weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
        if (s.fused_head && !s.skip) {
          head = {h, index, w, b};  // the loss and top-k read the layer itself
        } else {
          logits = g.add_op1("ffi_linear", {h, index, w, b}, {}, "logits");
        }
        break;
      }
      case LayerKind::dense_head: {
        const TensorId b =
            weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
        if (sparse_pending) {
          const TensorId w = weight("head.weight", DType::f32, {width, L}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(8.0));
          logits = g.add_op1("sparse_linear", {ptr, idx, val, w, b}, {}, "logits");
        } else {
          const TensorId w = weight("head.weight", DType::f32, {L, width}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(double(width)));
          logits = g.add_op1("linear", {h, w, b}, {}, "logits");
        }
        break;
      }
    }
  }
  if (s.skip) {
    // The linear path: every input feature straight to every label, summed
    // with the network's logits. Zero at the start, so the first steps see
    // the network alone; its gradient reaches only the rows of the features
    // in the batch (sparse rows, as the first layer's).
    const TensorId w =
        weight("skip.weight", DType::f32, {s.input_width, L}, true, WeightInit::Kind::zeros, 0);
    const TensorId b = weight("skip.bias", DType::f32, {L}, true, WeightInit::Kind::zeros, 0);
    const TensorId lin = g.add_op1("sparse_linear", {ptr, idx, val, w, b}, {}, "skip.logits");
    logits = g.add_op1("add", {logits, lin}, {}, "logits.sum");
  }
  const Attrs k{{"k", s.run.topk}};
  const auto top = head.empty() ? g.add_op("topk", {logits}, k, {"top.values", "top.indices"})
                                : g.add_op("ffi_topk", head, k, {"top.values", "top.indices"});
  const char* loss_op = s.loss == LossKind::bce             ? "bce_logits_csr"
                        : s.loss == LossKind::squared_hinge ? "squared_hinge_csr"
                                                            : "softmax_xent_csr";
  const TensorId lidx = g.add_tensor({"batch.lidx", DType::i32, {s.run.max_labels}, Role::input});
  m->inputs.push_back({"batch.lptr", lptr});
  m->inputs.push_back({"batch.lidx", lidx});
  TensorId loss;
  if (head.empty()) {
    loss = g.add_op1(loss_op, {logits, lptr, lidx}, {}, "loss");
  } else {
    // ffi_loss's loss attribute: 0 bce, 1 squared hinge, 2 softmax.
    const double kind = s.loss == LossKind::bce ? 0 : s.loss == LossKind::squared_hinge ? 1 : 2;
    std::vector<TensorId> in = head;
    in.push_back(lptr);
    in.push_back(lidx);
    loss = g.add_op1("ffi_loss", in, {{"loss", kind}}, "loss");
  }
  for (TensorId t : {loss, top[0], top[1]}) {
    g.mark_output(t);
    m->outputs.push_back({g.tensor(t).name, t, t == loss ? -1 : 0});
  }
  m->losses.push_back(loss);
  return m;
}

}  // namespace pooch
