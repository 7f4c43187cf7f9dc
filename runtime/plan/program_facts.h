// Facts of a program that no planning decision changes, shared by the
// schedule builder and the out-of-core search: which tensors alias which
// (views share their input's buffer) and which tensors may leave the device
// in a gap between their uses (saved activations, gradients waiting for
// their update).
#pragma once
#include <vector>

#include "planner.h"

namespace pooch {

// Weights and optimizer state outlive every program.
inline bool persistent(const TensorDesc& d) {
  return d.role == Role::weight || d.role == Role::optimizer_state;
}

// Views share their input's buffer: every tensor maps to the root it aliases.
struct Aliases {
  std::vector<TensorId> root;
  std::vector<char> is_view;    // per program position
  std::vector<char> has_alias;  // per tensor: some view aliases it
};

Aliases find_aliases(const Graph& g, const ProgramRequest& req);

// saved_activations (planner.h) with the aliases already found.
std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req,
                                               const Aliases& al);

}  // namespace pooch
