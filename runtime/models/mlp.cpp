#include "mlp.h"

#include <cmath>

#include "layers.h"

namespace pooch {

std::unique_ptr<Model> build_mlp_model(const ModelSpec& spec) {
  ModelSpec s = spec;
  s.family = Family::mlp;
  validate_spec(s);
  auto m = new_model(s);
  Graph& g = m->graph;
  const int64_t B = s.run.batch, N = s.labels;
  const AddWeight weight = weight_adder(*m);

  TensorId h = g.add_tensor({"batch.x", DType::f32, {B, s.input_width}, Role::input});
  m->inputs.push_back({"batch.x", h, 0});
  int64_t width = s.input_width;
  for (size_t i = 0; i + 1 < s.layers.size(); ++i)
    h = add_hidden_layer(g, s.layers[i], i, h, width, weight);
  const TensorId w = weight("head.weight", DType::f32, {N, width}, true, WeightInit::Kind::uniform,
                            1.0 / std::sqrt(double(width)));
  const TensorId b = weight("head.bias", DType::f32, {N}, true, WeightInit::Kind::zeros, 0);
  const TensorId pred = g.add_op1("linear", {h, w, b}, {}, "prediction");

  TensorId loss;
  if (s.loss == LossKind::mse) {
    const TensorId y = g.add_tensor({"batch.y", DType::f32, {B, N}, Role::input});
    const TensorId rw = g.add_tensor({"batch.row_weight", DType::f32, {B}, Role::input});
    m->inputs.push_back({"batch.y", y, 0});
    m->inputs.push_back({"batch.row_weight", rw, 0, 0.0, true});
    loss = g.add_op1("mse", {pred, y, rw}, {}, "loss");
  } else {
    const TensorId c = g.add_tensor({"batch.class", DType::i32, {B}, Role::input});
    m->inputs.push_back({"batch.class", c, 0, -1.0, false, N});
    loss = g.add_op1("softmax_xent_index", {pred, c}, {}, "loss");
  }
  g.mark_output(pred);
  g.mark_output(loss);
  m->outputs.push_back({"prediction", pred, 0});
  m->outputs.push_back({"loss", loss});
  m->losses.push_back(loss);
  return m;
}

}  // namespace pooch
