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

// saved_activations (planner.h) with the aliases already found; with
// `through`, also the activations a recompute may remake on its way: made
// in the forward pass by a node that may run again (as for `recomputable`)
// and read only there, so never saved (a batch normalisation's output that
// only the ReLU after it reads). A recompute that reads one remakes it just
// before, rather than keep it on the device from the forward pass (which
// would free nothing where it is as large as what the recompute saves).
// Their entries have first_backward -1 and recomputable set.
std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req,
                                               const Aliases& al,
                                               std::vector<SavedActivation>* through = nullptr);

// Whether a recompute may remake `t`, an output of `nd`: the node runs again
// when it has one output and writes no input; otherwise output 0 alone is
// remade by the op's replay (OpDef::replay), where it has one.
bool may_recompute(const Node& nd, const OpDef& def, TensorId t);
// Whether remaking an output of `nd` runs its replay instead of the node.
bool recompute_replays(const Node& nd, const OpDef& def);
// What a recompute of `nd`'s output launches: the node itself, or its
// replay (reading the replay's inputs, writing output 0 alone).
Node recompute_node(const Node& nd, const OpDef& def);

}  // namespace pooch
