// The hidden layers the xmc and mlp families share: linear (+ activation),
// dropout and layernorm over dense rows, with the weight names and initial
// values both families have always used.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model.h"
#include "model_spec.h"

namespace pooch {

// Adds a weight tensor with its initialiser; returns its id.
using AddWeight = std::function<TensorId(std::string name, DType dt, Shape shape, bool trainable,
                                         WeightInit::Kind kind, double a)>;

// The model's weight adder: each weight draws its initial values from its own
// counter stream (its tensor id + 2^20, clear of dropout keys).
AddWeight weight_adder(Model& m);

// Starts a model of a family from its resolved spec: family, spec JSON, seed
// and batch.
std::unique_ptr<Model> new_model(const ModelSpec& resolved);

// Layer `i` of a spec (linear, dropout or layernorm) over the dense rows `h`
// of width `width`; returns its output and updates `width`.
TensorId add_hidden_layer(Graph& g, const LayerSpec& l, size_t i, TensorId h, int64_t& width,
                          const AddWeight& weight);

}  // namespace pooch
