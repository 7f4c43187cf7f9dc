// Builds the training graph of a model spec: the input (a CSR bag-of-words
// batch or dense rows) -> the spec's layers -> the output layer over the
// labels -> loss, top-k over the logits for prediction, then backward and
// optimizer ops.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "../core/graph.h"
#include "model_spec.h"
#include "optimizer.h"

namespace pooch {

// How a weight starts: drawn from the seed, so two builds agree bit for bit.
struct WeightInit {
  enum class Kind { zeros, uniform, constant, fan_in_index };
  TensorId tensor;
  Kind kind;
  double a = 0;  // uniform: bound; constant: value; fan_in_index: the input width
};

struct XmcModel {
  ModelSpec spec;  // with max_nnz, max_labels and topk resolved
  Graph graph;
  TensorId ptr = kNoTensor, idx = kNoTensor, val = kNoTensor;  // sparse input
  TensorId x = kNoTensor;                                      // dense input
  // The positive labels of each row as a CSR: lptr i32[B+1], lidx i32[max_labels].
  TensorId lptr = kNoTensor, lidx = kNoTensor;
  TensorId logits = kNoTensor, loss = kNoTensor, top_values = kNoTensor, top_indices = kNoTensor;
  std::vector<WeightInit> init;  // every weight and optimizer state
};

// Validates the spec (Error naming the bad field) and builds forward,
// backward and optimizer ops.
std::unique_ptr<XmcModel> build_xmc_model(const ModelSpec& spec, const OptimizerConfig& opt);

// The initial bytes of one weight or state tensor.
std::vector<std::byte> initial_value(const Graph& g, const WeightInit& w, uint64_t seed);

}  // namespace pooch
