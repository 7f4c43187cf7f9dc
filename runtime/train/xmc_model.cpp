#include "xmc_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../../kernels/common/philox.h"
#include "../core/autodiff.h"
#include "../core/error.h"

namespace pooch {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw Error(POOCH_ERR_INVALID_ARG, what);
}

}  // namespace

std::unique_ptr<XmcModel> build_xmc_model(const XmcModelSpec& s, const OptimizerConfig& opt) {
  require(s.features > 0, fmt::format("features must be positive, got {}", s.features));
  require(s.labels > 0, fmt::format("labels must be positive, got {}", s.labels));
  require(s.hidden > 0, fmt::format("hidden must be positive, got {}", s.hidden));
  require(s.batch > 0, fmt::format("batch size must be positive, got {}", s.batch));
  require(s.fan_in >= 0 && s.fan_in <= s.hidden,
          fmt::format("fan-in must be between 0 (dense head) and hidden ({}), got {}", s.hidden,
                      s.fan_in));
  require(s.dropout >= 0 && s.dropout < 1,
          fmt::format("dropout must be in [0, 1), got {}", s.dropout));
  require(s.topk >= 1, fmt::format("top-k must be at least 1, got {}", s.topk));
  require(s.features <= INT32_MAX && s.labels <= INT32_MAX,
          "features and labels must fit in 32-bit indices");

  auto m = std::make_unique<XmcModel>();
  m->spec = s;
  m->spec.max_nnz = s.max_nnz > 0 ? s.max_nnz : s.batch * 64;
  m->spec.topk = static_cast<int>(std::min<int64_t>(s.topk, s.labels));
  Graph& g = m->graph;
  const int64_t B = s.batch, F = s.features, H = s.hidden, L = s.labels, K = s.fan_in;

  m->ptr = g.add_tensor({"batch.ptr", DType::i32, {B + 1}, Role::input});
  m->idx = g.add_tensor({"batch.idx", DType::i32, {m->spec.max_nnz}, Role::input});
  m->val = g.add_tensor({"batch.val", DType::f32, {m->spec.max_nnz}, Role::input});
  m->targets = g.add_tensor({"batch.targets", DType::f32, {B, L}, Role::input});

  auto weight = [&](std::string name, DType dt, Shape shape, bool trainable, WeightInit::Kind kind,
                    double a) {
    TensorDesc d{std::move(name), dt, std::move(shape), Role::weight};
    d.trainable = trainable;
    const TensorId id = g.add_tensor(std::move(d));
    m->init.push_back({id, kind, a});
    return id;
  };
  // Bag-of-words rows have unit length, so each hidden unit sums a few
  // weights: draw them as for a layer whose fan-in is the typical row length.
  const TensorId w1 = weight("hidden.weight", DType::f32, {F, H}, true, WeightInit::Kind::uniform,
                             1.0 / std::sqrt(8.0));
  const TensorId b1 = weight("hidden.bias", DType::f32, {H}, true, WeightInit::Kind::zeros, 0);
  TensorId h = g.add_op1("sparse_linear", {m->ptr, m->idx, m->val, w1, b1}, {}, "hidden.pre");
  h = g.add_op1("relu", {h}, {}, "hidden.act");
  if (s.dropout > 0) h = g.add_op1("dropout", {h}, {{"p", s.dropout}, {"key", 1}}, "hidden.drop");

  // Most labels are absent from most rows: start every logit low so the
  // first steps are not spent pushing them down.
  const double bias0 = s.loss == LossKind::softmax ? 0.0 : -std::log(static_cast<double>(L));
  if (K > 0) {
    const DType idx_t = H <= 65536 ? DType::u16 : DType::i32;
    const TensorId index =
        weight("head.index", idx_t, {L, K}, false, WeightInit::Kind::fan_in_index, double(H));
    const TensorId w2 = weight("head.weight", DType::f32, {L, K}, true, WeightInit::Kind::uniform,
                               1.0 / std::sqrt(double(K)));
    const TensorId b2 =
        weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
    m->logits = g.add_op1("ffi_linear", {h, index, w2, b2}, {}, "logits");
  } else {
    const TensorId w2 = weight("head.weight", DType::f32, {L, H}, true, WeightInit::Kind::uniform,
                               1.0 / std::sqrt(double(H)));
    const TensorId b2 =
        weight("head.bias", DType::f32, {L}, true, WeightInit::Kind::constant, bias0);
    m->logits = g.add_op1("linear", {h, w2, b2}, {}, "logits");
  }
  const auto top =
      g.add_op("topk", {m->logits}, {{"k", m->spec.topk}}, {"top.values", "top.indices"});
  m->top_values = top[0];
  m->top_indices = top[1];
  const char* loss_op = s.loss == LossKind::bce             ? "bce_logits"
                        : s.loss == LossKind::squared_hinge ? "squared_hinge"
                                                            : "softmax_xent";
  m->loss = g.add_op1(loss_op, {m->logits, m->targets}, {}, "loss");
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
