// Reverse-mode differentiation over the static graph: appends the backward
// ops of every forward node that lies on a path from a trainable weight to
// the loss, summing gradients where a tensor feeds several ops (`add` for two
// dense ones; `scatter_add_rows` for a row-sparse one and a dense one, as a
// weight tied between a sparse_linear and a linear has; row-sparse
// gradients with no dense one to add them into are refused).
#pragma once
#include <utility>
#include <vector>

#include "graph.h"

namespace pooch {

struct WeightGrad {
  TensorId weight;
  TensorId grad;  // may be row-sparse (TensorDesc::sparse_rows)
};

// `loss` must be the scalar output of a loss op (OpDef::is_loss). Returns the
// gradient of every trainable weight the loss depends on, in weight order.
std::vector<WeightGrad> build_backward(Graph& g, TensorId loss);

// The tensor that holds `loss`'s value in a training step: the output of a
// backward op that computes the loss again in the pass that makes its
// gradient (TensorDesc::repeats), so that the forward op need not run, or
// else `loss` itself.
TensorId training_loss(const Graph& g, TensorId loss);

}  // namespace pooch
