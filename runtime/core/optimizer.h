// Appends optimizer update ops (and their state tensors) to a graph.
#pragma once
#include <vector>

#include "autodiff.h"
#include "graph.h"

namespace pooch {

struct OptimizerConfig {
  enum class Kind { sgd, adam, adamw };
  Kind kind = Kind::adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.9;  // SGD
};

// One update op per weight: dense gradients use sgd_update/adam_update,
// row-sparse ones the lazy *_rows variants. State tensors (zeros at start)
// are named "<weight>.m", "<weight>.v" or "<weight>.momentum".
void append_optimizer(Graph& g, const std::vector<WeightGrad>& grads, const OptimizerConfig& cfg);

}  // namespace pooch
