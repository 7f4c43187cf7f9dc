// The extreme multi-label model: a CSR bag-of-words batch -> sparse linear
// (hidden) -> relu [-> dropout] -> output layer over the labels (fixed fan-in
// or dense) -> loss, with top-k over the logits for prediction.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "../core/graph.h"
#include "optimizer.h"

namespace pooch {

enum class LossKind { bce, squared_hinge, softmax };

struct XmcModelSpec {
  int64_t features = 0;
  int64_t labels = 0;
  int64_t hidden = 256;
  int64_t fan_in = 32;  // 0: a dense output layer
  int64_t batch = 64;
  int64_t max_nnz = 0;  // 0: batch * 64
  double dropout = 0.0;
  LossKind loss = LossKind::bce;
  uint64_t seed = 1;
  int topk = 5;  // the most labels predict() can return per row
};

// How a weight starts: drawn from the seed, so two builds agree bit for bit.
struct WeightInit {
  enum class Kind { zeros, uniform, constant, fan_in_index };
  TensorId tensor;
  Kind kind;
  double a = 0;  // uniform: bound; constant: value; fan_in_index: the input width
};

struct XmcModel {
  XmcModelSpec spec;
  Graph graph;
  TensorId ptr = kNoTensor, idx = kNoTensor, val = kNoTensor, targets = kNoTensor;
  TensorId logits = kNoTensor, loss = kNoTensor, top_values = kNoTensor, top_indices = kNoTensor;
  std::vector<WeightInit> init;  // every weight and optimizer state
};

// Validates the spec (Error naming the bad field) and builds forward,
// backward and optimizer ops.
std::unique_ptr<XmcModel> build_xmc_model(const XmcModelSpec& spec, const OptimizerConfig& opt);

// The initial bytes of one weight or state tensor.
std::vector<std::byte> initial_value(const Graph& g, const WeightInit& w, uint64_t seed);

}  // namespace pooch
