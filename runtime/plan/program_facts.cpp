#include "program_facts.h"

#include <algorithm>

#include "../core/op_registry.h"

namespace pooch {

Aliases find_aliases(const Graph& g, const ProgramRequest& req) {
  const size_t n_t = g.num_tensors();
  Aliases a;
  a.root.resize(n_t);
  a.has_alias.assign(n_t, 0);
  for (size_t t = 0; t < n_t; ++t) a.root[t] = static_cast<TensorId>(t);
  a.is_view.assign(req.nodes.size(), 0);
  for (size_t p = 0; p < req.nodes.size(); ++p) {
    const Node& nd = g.nodes()[static_cast<size_t>(req.nodes[p])];
    if (!runs_as_view(g, nd)) continue;
    a.is_view[p] = 1;
    const TensorId r = a.root[static_cast<size_t>(nd.inputs[0])];
    a.root[static_cast<size_t>(nd.outputs[0])] = r;
    a.has_alias[static_cast<size_t>(r)] = 1;
  }
  return a;
}

bool recompute_replays(const Node& nd, const OpDef& def) {
  return nd.outputs.size() != 1 || !def.mutates.empty();
}

bool may_recompute(const Node& nd, const OpDef& def, TensorId t) {
  if (!recompute_replays(nd, def)) return true;
  return !def.replay.op.empty() && !nd.outputs.empty() && nd.outputs[0] == t;
}

Node recompute_node(const Node& nd, const OpDef& def) {
  if (!recompute_replays(nd, def)) return nd;
  Node r;
  r.op = def.replay.op;
  r.attrs = nd.attrs;
  for (int i : def.replay.inputs) r.inputs.push_back(nd.inputs[static_cast<size_t>(i)]);
  r.outputs = {nd.outputs[0]};
  return r;
}

std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req,
                                               const Aliases& al,
                                               std::vector<SavedActivation>* through) {
  std::vector<SavedActivation> out;
  if (req.split < 0) return out;
  const auto& nodes = g.nodes();
  const size_t n_t = g.num_tensors();
  std::vector<int> producer(n_t, -1), last_fwd(n_t, -1), first_bwd(n_t, -1);
  std::vector<std::vector<int>> after_split_uses(n_t);  // of gradients, in order
  std::vector<char> mutated(n_t, 0);
  for (int p = 0; p < static_cast<int>(req.nodes.size()); ++p) {
    if (al.is_view[static_cast<size_t>(p)]) continue;
    const Node& nd = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
    for (TensorId x : nd.inputs) {
      const auto r = static_cast<size_t>(al.root[static_cast<size_t>(x)]);
      if (p <= req.split)
        last_fwd[r] = std::max(last_fwd[r], p);
      else if (first_bwd[r] < 0)
        first_bwd[r] = p;
      if (p > req.split && g.tensor(static_cast<TensorId>(r)).role == Role::gradient &&
          (after_split_uses[r].empty() || after_split_uses[r].back() != p))
        after_split_uses[r].push_back(p);
    }
    for (int m : op_registry().get(nd.op).mutates)
      mutated[static_cast<size_t>(
          al.root[static_cast<size_t>(nd.inputs[static_cast<size_t>(m)])])] = 1;
    for (TensorId o : nd.outputs)
      if (producer[static_cast<size_t>(o)] < 0) producer[static_cast<size_t>(o)] = p;
  }
  std::vector<char> is_output(n_t, 0);
  for (TensorId o : req.outputs)
    is_output[static_cast<size_t>(al.root[static_cast<size_t>(o)])] = 1;
  for (size_t t = 0; t < n_t; ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    const int p = producer[t];
    // Kept always: views and what they alias, outputs, what a node writes in
    // place (a copy out after its producer would miss the write).
    if (al.root[t] != static_cast<TensorId>(t) || al.has_alias[t] || is_output[t] || mutated[t] ||
        p < 0)
      continue;
    SavedActivation sa;
    sa.tensor = static_cast<TensorId>(t);
    sa.producer = p;
    sa.bytes = d.bytes();
    const Node& made_by = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
    if (d.role == Role::activation && p <= req.split && first_bwd[t] < 0) {
      if (!through || last_fwd[t] < 0 ||
          !may_recompute(made_by, op_registry().get(made_by.op), sa.tensor))
        continue;
      sa.last_forward = std::max(p, last_fwd[t]);
      sa.recomputable = true;
      through->push_back(sa);
      continue;
    }
    if (d.role == Role::activation && p <= req.split) {
      sa.last_forward = std::max(p, last_fwd[t]);
      sa.first_backward = first_bwd[t];
      sa.recomputable = may_recompute(made_by, op_registry().get(made_by.op), sa.tensor);
    } else if (d.role == Role::gradient && p > req.split && !after_split_uses[t].empty()) {
      // A gradient waiting for its update (with clipping, every update waits
      // for the norm of all of them): its gap is the longest stretch between
      // two consecutive uses, the producer counting as the first.
      int before = p;
      for (int u : after_split_uses[t]) {
        if (u - before > sa.first_backward - sa.last_forward) {
          sa.last_forward = before;
          sa.first_backward = u;
        }
        before = u;
      }
      // Only one that waits for its update (an op writing a weight in place).
      const Node& after =
          nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(sa.first_backward)])];
      if (op_registry().get(after.op).mutates.empty()) continue;
      sa.gradient = true;
    } else {
      continue;
    }
    if (sa.first_backward <= sa.last_forward + 1) continue;  // no gap to use
    out.push_back(sa);
  }
  return out;
}

std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req) {
  return saved_activations(g, req, find_aliases(g, req));
}

}  // namespace pooch
