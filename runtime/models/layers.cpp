#include "layers.h"

#include <fmt/format.h>

#include <cmath>

#include "../core/error.h"

namespace pooch {

AddWeight weight_adder(Model& m) {
  return [&m](std::string name, DType dt, Shape shape, bool trainable, WeightInit::Kind kind,
              double a) {
    TensorDesc d{name, dt, std::move(shape), Role::weight};
    d.trainable = trainable;
    const TensorId id = m.graph.add_tensor(std::move(d));
    m.init[name] = {kind, a, static_cast<uint32_t>(id) + (1u << 20)};
    return id;
  };
}

std::unique_ptr<Model> new_model(const ModelSpec& resolved) {
  auto m = std::make_unique<Model>();
  m->family = family_name(resolved.family);
  m->spec_json = spec_to_json(resolved);
  m->seed = resolved.seed;
  m->batch = resolved.run.batch;
  return m;
}

TensorId add_hidden_layer(Graph& g, const LayerSpec& l, size_t i, TensorId h, int64_t& width,
                          const AddWeight& weight) {
  switch (l.kind) {
    case LayerKind::linear: {
      const std::string p = fmt::format("fc{}", i);
      const TensorId w = weight(p + ".weight", DType::f32, {l.width, width}, true,
                                WeightInit::Kind::uniform, 1.0 / std::sqrt(double(width)));
      const TensorId b =
          weight(p + ".bias", DType::f32, {l.width}, true, WeightInit::Kind::zeros, 0);
      const TensorId pre = g.add_op1("linear", {h, w, b}, {}, p + ".pre");
      width = l.width;
      return l.activation == "none" ? pre : g.add_op1(l.activation, {pre}, {}, p + ".act");
    }
    case LayerKind::dropout:
      return g.add_op1("dropout", {h}, {{"p", l.p}, {"key", double(i + 1)}},
                       fmt::format("drop{}", i));
    case LayerKind::layernorm: {
      const std::string n = fmt::format("ln{}", i);
      const TensorId gamma =
          weight(n + ".gamma", DType::f32, {width}, true, WeightInit::Kind::constant, 1.0);
      const TensorId beta =
          weight(n + ".beta", DType::f32, {width}, true, WeightInit::Kind::zeros, 0);
      return g.add_op("layernorm", {h, gamma, beta}, {}, {n + ".out", n + ".mean", n + ".rstd"})[0];
    }
    default:
      throw Error(POOCH_ERR_INTERNAL, fmt::format("layers[{}] is not a hidden layer", i));
  }
}

}  // namespace pooch
