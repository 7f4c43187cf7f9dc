#include "xmc_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../../kernels/common/philox.h"
#include "../core/autodiff.h"
#include "../core/error.h"

namespace pooch {

std::unique_ptr<XmcModel> build_xmc_model(const ModelSpec& spec, const OptimizerConfig& opt) {
  validate_spec(spec);
  auto m = std::make_unique<XmcModel>();
  m->spec = spec;
  ModelSpec& s = m->spec;
  if (s.max_nnz == 0) s.max_nnz = s.batch * 64;
  if (s.max_labels == 0) s.max_labels = s.batch * 32;
  s.topk = static_cast<int>(std::min<int64_t>(s.topk, s.labels));
  Graph& g = m->graph;
  const int64_t B = s.batch, L = s.labels;

  auto weight = [&](std::string name, DType dt, Shape shape, bool trainable, WeightInit::Kind kind,
                    double a) {
    TensorDesc d{std::move(name), dt, std::move(shape), Role::weight};
    d.trainable = trainable;
    const TensorId id = g.add_tensor(std::move(d));
    m->init.push_back({id, kind, a});
    return id;
  };

  TensorId h = kNoTensor;
  bool sparse_pending = s.input == InputKind::sparse;
  if (sparse_pending) {
    m->ptr = g.add_tensor({"batch.ptr", DType::i32, {B + 1}, Role::input});
    m->idx = g.add_tensor({"batch.idx", DType::i32, {s.max_nnz}, Role::input});
    m->val = g.add_tensor({"batch.val", DType::f32, {s.max_nnz}, Role::input});
  } else {
    m->x = g.add_tensor({"batch.x", DType::f32, {B, s.input_width}, Role::input});
    h = m->x;
  }
  // The targets as a label CSR (no [B, L] array is filled or copied per
  // step). lidx is added just before the loss: weights draw their initial
  // values by tensor id, so they keep the ids they had with the one dense
  // target tensor that lptr replaces here.
  m->lptr = g.add_tensor({"batch.lptr", DType::i32, {B + 1}, Role::input});

  int64_t width = s.input_width;
  // Most labels are absent from most rows: start every logit low so the
  // first steps are not spent pushing them down.
  const double bias0 = s.loss == LossKind::softmax ? 0.0 : -std::log(static_cast<double>(L));
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    const std::string p = fmt::format("fc{}", i);
    switch (l.kind) {
      case LayerKind::linear: {
        TensorId pre;
        if (sparse_pending) {
          // Bag-of-words rows have unit length, so each unit sums a few
          // weights: draw them as for a layer whose fan-in is a typical row.
          const TensorId w = weight(p + ".weight", DType::f32, {width, l.width}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(8.0));
          const TensorId b =
              weight(p + ".bias", DType::f32, {l.width}, true, WeightInit::Kind::zeros, 0);
          pre = g.add_op1("sparse_linear", {m->ptr, m->idx, m->val, w, b}, {}, p + ".pre");
          sparse_pending = false;
        } else {
          const TensorId w = weight(p + ".weight", DType::f32, {l.width, width}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(double(width)));
          const TensorId b =
              weight(p + ".bias", DType::f32, {l.width}, true, WeightInit::Kind::zeros, 0);
          pre = g.add_op1("linear", {h, w, b}, {}, p + ".pre");
        }
        h = l.activation == "none" ? pre : g.add_op1(l.activation, {pre}, {}, p + ".act");
        width = l.width;
        break;
      }
      case LayerKind::dropout:
        h = g.add_op1("dropout", {h}, {{"p", l.p}, {"key", double(i + 1)}},
                      fmt::format("drop{}", i));
        break;
      case LayerKind::layernorm: {
        const std::string n = fmt::format("ln{}", i);
        const TensorId gamma =
            weight(n + ".gamma", DType::f32, {width}, true, WeightInit::Kind::constant, 1.0);
        const TensorId beta =
            weight(n + ".beta", DType::f32, {width}, true, WeightInit::Kind::zeros, 0);
        h = g.add_op("layernorm", {h, gamma, beta}, {}, {n + ".out", n + ".mean", n + ".rstd"})[0];
        break;
      }
      case LayerKind::ffi_head: {
        const int64_t K = l.fan_in;
        const DType idx_t = width <= 65536 ? DType::u16 : DType::i32;
        const TensorId index = weight("head.index", idx_t, {L, K}, false,
                                      WeightInit::Kind::fan_in_index, double(width));
        const TensorId w = weight("head.weight", DType::f32, {L, K}, true,
                                  WeightInit::Kind::uniform, 1.0 / std::sqrt(double(K)));
        const TensorId b =
            weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
        m->logits = g.add_op1("ffi_linear", {h, index, w, b}, {}, "logits");
        break;
      }
      case LayerKind::dense_head: {
        const TensorId b =
            weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
        if (sparse_pending) {
          const TensorId w = weight("head.weight", DType::f32, {width, L}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(8.0));
          m->logits = g.add_op1("sparse_linear", {m->ptr, m->idx, m->val, w, b}, {}, "logits");
        } else {
          const TensorId w = weight("head.weight", DType::f32, {L, width}, true,
                                    WeightInit::Kind::uniform, 1.0 / std::sqrt(double(width)));
          m->logits = g.add_op1("linear", {h, w, b}, {}, "logits");
        }
        break;
      }
    }
  }
  const auto top = g.add_op("topk", {m->logits}, {{"k", s.topk}}, {"top.values", "top.indices"});
  m->top_values = top[0];
  m->top_indices = top[1];
  const char* loss_op = s.loss == LossKind::bce             ? "bce_logits_csr"
                        : s.loss == LossKind::squared_hinge ? "squared_hinge_csr"
                                                            : "softmax_xent_csr";
  m->lidx = g.add_tensor({"batch.lidx", DType::i32, {s.max_labels}, Role::input});
  m->loss = g.add_op1(loss_op, {m->logits, m->lptr, m->lidx}, {}, "loss");
  g.mark_output(m->loss);
  g.mark_output(m->top_values);
  g.mark_output(m->top_indices);

  append_optimizer(g, build_backward(g, m->loss), opt);
  for (size_t t = 0; t < g.num_tensors(); ++t)
    if (g.tensor(static_cast<TensorId>(t)).role == Role::optimizer_state)
      m->init.push_back({static_cast<TensorId>(t), WeightInit::Kind::zeros, 0});
  return m;
}

std::vector<std::byte> initial_value(const Graph& g, const WeightInit& w, uint64_t seed) {
  const TensorDesc& d = g.tensor(w.tensor);
  std::vector<std::byte> out(d.bytes());
  const auto n = static_cast<size_t>(d.numel());
  // Each tensor draws from its own counter stream (op key = tensor id + 2^20,
  // clear of dropout keys), so adding a tensor never shifts another's values.
  const uint32_t key = static_cast<uint32_t>(w.tensor) + (1u << 20);
  switch (w.kind) {
    case WeightInit::Kind::zeros:
      break;
    case WeightInit::Kind::constant: {
      const float v = static_cast<float>(w.a);
      for (size_t i = 0; i < n; ++i) std::memcpy(out.data() + i * 4, &v, 4);
      break;
    }
    case WeightInit::Kind::uniform: {
      for (size_t i = 0; i < n; ++i) {
        const float u = kern::philox_uniform(seed, 0, key, i);
        const float v = static_cast<float>((2.0 * u - 1.0) * w.a);
        std::memcpy(out.data() + i * 4, &v, 4);
      }
      break;
    }
    case WeightInit::Kind::fan_in_index: {
      // K distinct inputs per row, by Floyd's sampling: O(K^2) per row
      // whatever H is (a shuffle of [0, H) per row would cost L*H).
      const int64_t rows = d.shape[0], K = d.shape[1], H = static_cast<int64_t>(w.a);
      std::vector<int32_t> pick(static_cast<size_t>(K));
      uint64_t counter = 0;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t n = 0;
        for (int64_t j = H - K; j < H; ++j) {
          const float u = kern::philox_uniform(seed, 0, key, counter++);
          auto t =
              static_cast<int32_t>(std::min<int64_t>(j, static_cast<int64_t>(u * double(j + 1))));
          if (std::find(pick.begin(), pick.begin() + n, t) != pick.begin() + n)
            t = static_cast<int32_t>(j);
          pick[static_cast<size_t>(n++)] = t;
        }
        std::sort(pick.begin(), pick.end());  // ascending: friendlier gathers
        for (int64_t k = 0; k < K; ++k) {
          const size_t at = static_cast<size_t>(r * K + k);
          if (d.dtype == DType::u16) {
            const auto v = static_cast<uint16_t>(pick[static_cast<size_t>(k)]);
            std::memcpy(out.data() + at * 2, &v, 2);
          } else {
            std::memcpy(out.data() + at * 4, &pick[static_cast<size_t>(k)], 4);
          }
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace pooch
