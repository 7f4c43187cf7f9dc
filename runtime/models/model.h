// A Model: a graph with named inputs and outputs, its losses, how each
// weight starts, and what family built it. Any family's model (xmc, mlp, and
// later gpt, resnet) is one of these, and nothing below this layer knows which
// family it is. A Session puts a Model on a backend.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "../core/graph.h"

namespace pooch {

// A tensor a caller sets (input) or reads (output) by name.
struct IoTensor {
  std::string name;
  TensorId id = kNoTensor;
  // The dimension that holds the batch's rows (its size in the graph is the
  // planned maximum; a caller may pass fewer rows), or -1: a fixed shape.
  int batch_dim = -1;
  // Rows past the ones a caller passes are filled with this value (a class
  // target of -1 is ignored by the loss, a zero row weight masks the row).
  double pad = 0;
  // A row mask the session fills itself: 1 for each row the caller passed,
  // `pad` for the rest (callers need not set it).
  bool row_mask = false;
  // > 0: an i32 input of ids (class targets) whose values must lie in
  // [-1, index_bound) (-1: ignore the row); set_input refuses others.
  int64_t index_bound = 0;
};

// How a weight starts. The values are drawn from the seed and `stream`, a
// counter stream of its own (fixed when the model is built), so adding a
// tensor never shifts another's values and two builds agree bit for bit.
struct WeightInit {
  enum class Kind { zeros, uniform, constant, fan_in_index, normal, positions };
  Kind kind = Kind::zeros;
  // uniform: bound; constant: value; fan_in_index: the input width; normal:
  // the standard deviation (mean 0); positions: (an i32 tensor) each element
  // its index along the last dimension, 0, 1, ..., n-1 in every row
  double a = 0;
  uint32_t stream = 0;
};

struct Model {
  Graph graph;
  std::vector<IoTensor> inputs;
  std::vector<IoTensor> outputs;                        // losses among them
  std::vector<TensorId> losses;                         // the roots of the backward pass
  std::map<std::string, WeightInit, std::less<>> init;  // by weight name
  // What built the model: its family ("xmc", "mlp"; "" for a graph built by
  // hand) and the family's spec (JSON), from which the family rebuilds it for
  // a new run shape or head.
  std::string family;
  std::string spec_json;
  uint64_t seed = 1;  // initial weights, dropout, fan-in wiring
  int64_t batch = 0;  // the planned maximum rows per run (0: no batch dimension)

  const IoTensor* find_input(std::string_view name) const;
  const IoTensor* find_output(std::string_view name) const;
};

// A model over a graph built by hand: every input-role tensor is an input,
// every marked graph output an output, with fixed shapes.
Model model_from_graph(Graph g, uint64_t seed = 1);

// The initial bytes of one weight; normal draws use up to `threads` threads
// (the values do not depend on it).
std::vector<std::byte> initial_value(const TensorDesc& d, const WeightInit& w, uint64_t seed,
                                     int threads = 1);

// Names typed by people match without regard to case ("Loss" finds "loss").
bool same_name(std::string_view a, std::string_view b);

}  // namespace pooch
