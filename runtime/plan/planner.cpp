#include "planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"

namespace pooch {

namespace {

bool persistent(const TensorDesc& d) {
  return d.role == Role::weight || d.role == Role::optimizer_state;
}

kern::TensorView view_of(const TensorDesc& d) {
  kern::TensorView v;
  v.dtype = d.dtype;
  v.ndim = static_cast<int>(d.shape.size());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = d.shape[static_cast<size_t>(i)];
  return v;
}

std::string operands_str(const kern::KernelArgs& a) {
  std::string s;
  auto add = [&](const kern::TensorView& v) {
    if (!s.empty()) s += ", ";
    s += dtype_name(v.dtype);
    s += '[';
    for (int i = 0; i < v.ndim; ++i) s += fmt::format("{}{}", i ? "," : "", v.shape[i]);
    s += ']';
  };
  for (int i = 0; i < a.n_in; ++i) add(a.in[i]);
  s += " -> ";
  std::string ins = s;
  s.clear();
  for (int i = 0; i < a.n_out; ++i) add(a.out[i]);
  return ins + s;
}

}  // namespace

SessionLayout plan_session_layout(const Graph& g, const std::vector<TensorId>& staged,
                                  size_t alignment, const std::vector<char>& paged) {
  SessionLayout l;
  l.alignment = alignment;
  const size_t n_t = g.num_tensors();
  std::vector<BufferRequest> dev, host;
  std::vector<TensorId> dev_ids, host_ids;
  std::vector<TensorId> home_ids;
  for (size_t t = 0; t < n_t; ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (!persistent(d)) continue;
    if (t < paged.size() && paged[t]) {
      host.push_back({d.bytes(), 0, kLiveForever, d.role, -1, "home of " + d.name});
      home_ids.push_back(static_cast<TensorId>(t));
      continue;
    }
    dev.push_back({d.bytes(), 0, kLiveForever, d.role, -1, d.name});
    dev_ids.push_back(static_cast<TensorId>(t));
  }
  for (TensorId t : staged) {
    if (std::find(host_ids.begin(), host_ids.end(), t) != host_ids.end()) continue;
    const TensorDesc& d = g.tensor(t);
    host.push_back({d.bytes(), 0, kLiveForever, d.role, -1, "staging of " + d.name});
    host_ids.push_back(t);
  }
  l.persistent = plan_arena(dev, alignment);
  l.host = plan_arena(host, alignment);
  l.device_offset.assign(n_t, kUnplaced);
  l.host_offset.assign(n_t, kUnplaced);
  l.home_offset.assign(n_t, kUnplaced);
  for (size_t i = 0; i < dev_ids.size(); ++i)
    l.device_offset[static_cast<size_t>(dev_ids[i])] = l.persistent.offsets[i];
  for (size_t i = 0; i < home_ids.size(); ++i)  // the homes come first in the host plan
    l.home_offset[static_cast<size_t>(home_ids[i])] = l.host.offsets[i];
  for (size_t i = 0; i < host_ids.size(); ++i)
    l.host_offset[static_cast<size_t>(host_ids[i])] = l.host.offsets[home_ids.size() + i];
  return l;
}

std::vector<int> select_nodes(const Graph& g, const std::vector<TensorId>& wanted,
                              bool with_updates) {
  const auto& nodes = g.nodes();
  std::vector<char> need_t(g.num_tensors(), 0), need_n(nodes.size(), 0);
  for (TensorId t : wanted) need_t[static_cast<size_t>(t)] = 1;
  for (size_t i = nodes.size(); i-- > 0;) {
    bool keep = with_updates && !op_registry().get(nodes[i].op).mutates.empty();
    for (TensorId o : nodes[i].outputs) keep = keep || need_t[static_cast<size_t>(o)];
    if (!keep) continue;
    need_n[i] = 1;
    for (TensorId x : nodes[i].inputs) need_t[static_cast<size_t>(x)] = 1;
  }
  std::vector<int> order;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (need_n[i]) order.push_back(static_cast<int>(i));
  // Optimizer updates run as soon as they may: right after the last node that
  // makes one of their inputs or reads a tensor they write. Autodiff appends
  // them after the whole backward pass, which would keep every gradient alive
  // to the end of the step; moved up, each gradient dies at its update. The
  // values are the same: every read of a weight still comes before its update.
  // Ops marked `early` (the gradient norm's links) move up the same way, so
  // that with clipping each gradient is read as it is made and then waits
  // for its update alone.
  std::vector<int> rest, moved;
  for (int n : order) {
    const OpDef& d = op_registry().get(nodes[static_cast<size_t>(n)].op);
    (d.mutates.empty() && !d.early ? rest : moved).push_back(n);
  }
  if (moved.empty()) return order;
  std::vector<std::vector<int>> after(rest.size() + 1);  // moved nodes placed after rest[i-1]
  std::vector<size_t> anchor_of(nodes.size(), 0);
  for (size_t k = 0; k < moved.size(); ++k) {
    const int u = moved[k];
    const Node& un = nodes[static_cast<size_t>(u)];
    const OpDef& ud = op_registry().get(un.op);
    std::vector<TensorId> written;
    for (int m : ud.mutates) written.push_back(un.inputs[static_cast<size_t>(m)]);
    size_t anchor = 0;  // place after rest[anchor - 1]
    for (size_t i = 0; i < rest.size(); ++i) {
      const Node& n = nodes[static_cast<size_t>(rest[i])];
      bool depends = false;
      for (TensorId o : n.outputs)
        depends = depends || std::find(un.inputs.begin(), un.inputs.end(), o) != un.inputs.end();
      for (TensorId x : n.inputs)
        depends = depends || std::find(written.begin(), written.end(), x) != written.end();
      if (depends && rest[i] < u) anchor = i + 1;
    }
    // Not before a moved node it reads (in graph order, so it lands after it
    // in the same list).
    for (size_t j = 0; j < k; ++j) {
      const Node& m = nodes[static_cast<size_t>(moved[j])];
      for (TensorId o : m.outputs)
        if (std::find(un.inputs.begin(), un.inputs.end(), o) != un.inputs.end())
          anchor = std::max(anchor, anchor_of[static_cast<size_t>(moved[j])]);
    }
    anchor_of[static_cast<size_t>(u)] = anchor;
    after[anchor].push_back(u);
  }
  std::vector<int> out;
  for (size_t i = 0; i <= rest.size(); ++i) {
    if (i > 0) out.push_back(rest[i - 1]);
    for (int u : after[i]) out.push_back(u);
  }
  return out;
}

bool runs_as_view(const Graph& g, const Node& n) {
  const OpDef& def = op_registry().get(n.op);
  if (!def.view || n.inputs.empty() || n.outputs.empty()) return false;
  std::vector<const TensorDesc*> in;
  for (TensorId x : n.inputs) in.push_back(&g.tensor(x));
  return def.view(in, n.attrs);
}

const kern::KernelVariant& choose_kernel(const Backend& b, const Node& node,
                                         const kern::KernelArgs& args, bool deterministic) {
  bool any = false, supported = false;
  for (const kern::KernelVariant& k : b.kernels()) {
    if (node.op != k.op) continue;
    any = true;
    if (k.supports && !k.supports(args)) continue;
    supported = true;
    if (deterministic && !k.deterministic) continue;
    return k;
  }
  if (!any)
    throw Error(POOCH_ERR_UNSUPPORTED,
                fmt::format("the {} backend has no kernel for op '{}'", b.name(), node.op));
  if (!supported)
    throw Error(POOCH_ERR_UNSUPPORTED,
                fmt::format("no {} kernel for op '{}' supports the operands {}", b.name(), node.op,
                            operands_str(args)));
  throw Error(POOCH_ERR_UNSUPPORTED,
              fmt::format("op '{}' has no deterministic kernel on the {} backend for the operands "
                          "{}, and determinism was asked for",
                          node.op, b.name(), operands_str(args)));
}

const kern::KernelVariant& choose_host_kernel(const Backend& b, const Node& node,
                                              const kern::KernelArgs& args, bool deterministic) {
  for (const kern::KernelVariant& k : b.host_kernels()) {
    if (node.op != k.op || (k.supports && !k.supports(args))) continue;
    if (deterministic && !k.deterministic) continue;
    return k;
  }
  throw Error(POOCH_ERR_UNSUPPORTED,
              fmt::format("the {} backend has no host kernel for op '{}' with the operands {}",
                          b.name(), node.op, operands_str(args)));
}

namespace {

// Views share their input's buffer: every tensor maps to the root it aliases.
struct Aliases {
  std::vector<TensorId> root;
  std::vector<char> is_view;    // per program position
  std::vector<char> has_alias;  // per tensor: some view aliases it
};

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

// One stretch of time a tensor spends in the arena, in launch slots.
struct Interval {
  int first = -1, last = -1;
  int request = -1;
};

}  // namespace

namespace {

std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req,
                                               const Aliases& al) {
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
    if (d.role == Role::activation && p <= req.split && first_bwd[t] >= 0) {
      sa.last_forward = std::max(p, last_fwd[t]);
      sa.first_backward = first_bwd[t];
      const Node& nd = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
      sa.recomputable = nd.outputs.size() == 1 && op_registry().get(nd.op).mutates.empty();
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

}  // namespace

std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req) {
  return saved_activations(g, req, find_aliases(g, req));
}

Schedule plan_schedule(const Graph& g, const ProgramRequest& req, const Backend& backend,
                       const SessionLayout& layout, const PlanOptions& opt, PlanCache* cache) {
  const bool candidate = cache && cache->candidate;
  const bool names = !candidate;
  const auto& nodes = g.nodes();
  const size_t n_t = g.num_tensors();
  const int n_pos = static_cast<int>(req.nodes.size());
  auto node_at = [&](int p) -> const Node& {
    return nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
  };
  Schedule s;
  s.training = req.training;
  PlanCache local;
  PlanCache& pc = cache ? *cache : local;
  if (!pc.facts) {
    Aliases a = find_aliases(g, req);
    pc.saved = saved_activations(g, req, a);
    pc.root = std::move(a.root);
    pc.is_view = std::move(a.is_view);
    pc.has_alias = std::move(a.has_alias);
    pc.def.resize(static_cast<size_t>(n_pos));
    for (int p = 0; p < n_pos; ++p)
      pc.def[static_cast<size_t>(p)] = &op_registry().get(node_at(p).op);
    pc.facts = true;
  }
  struct {
    const std::vector<TensorId>& root;
    const std::vector<char>& is_view;
  } al{pc.root, pc.is_view};
  auto root = [&](TensorId t) { return al.root[static_cast<size_t>(t)]; };

  // Nodes that run on the host: optimizer updates whose weight's update is
  // SessionLayout::host_update's (it and its state paged), and ops that read
  // rows of such a weight (a sparse input layer), whose other persistent
  // inputs are paged too. Their operands are at home, in a staging slot or
  // copied out; a row reader's output is copied in.
  std::vector<char> on_host(static_cast<size_t>(n_pos), 0);
  auto persistent_inputs_paged = [&](const Node& nd) {
    for (TensorId x : nd.inputs)
      if (persistent(g.tensor(root(x))) && !layout.paged(root(x))) return false;
    return true;
  };
  if (!layout.host_update.empty())
    for (int p = 0; p < n_pos; ++p) {
      const OpDef& d = *pc.def[static_cast<size_t>(p)];
      if (d.row_weight >= 0 && !al.is_view[static_cast<size_t>(p)]) {
        const Node& nd = node_at(p);
        const TensorId w = root(nd.inputs[static_cast<size_t>(d.row_weight)]);
        on_host[static_cast<size_t>(p)] = layout.updated_on_host(w) && persistent_inputs_paged(nd);
        continue;
      }
      if (d.mutates.empty()) continue;
      const Node& nd = node_at(p);
      bool all_paged = nd.outputs.empty();
      for (int m : d.mutates)
        all_paged = all_paged && layout.paged(root(nd.inputs[static_cast<size_t>(m)]));
      const TensorId w = root(nd.inputs[static_cast<size_t>(d.mutates[0])]);
      on_host[static_cast<size_t>(p)] = layout.updated_on_host(w) && all_paged ? 1 : 0;
    }
  // And an op marked host_for_host_readers whose largest output only host
  // nodes read (a sparse input layer's row gradient, for its host update).
  if (!layout.host_update.empty()) {
    std::vector<int> device_readers(n_t, 0), host_readers(n_t, 0);
    for (int p = 0; p < n_pos; ++p) {
      if (al.is_view[static_cast<size_t>(p)]) continue;
      for (TensorId x : node_at(p).inputs)
        ++(on_host[static_cast<size_t>(p)] ? host_readers
                                           : device_readers)[static_cast<size_t>(root(x))];
    }
    for (int p = 0; p < n_pos; ++p) {
      const Node& nd = node_at(p);
      if (!pc.def[static_cast<size_t>(p)]->host_for_host_readers ||
          on_host[static_cast<size_t>(p)] || nd.outputs.empty() ||
          al.is_view[static_cast<size_t>(p)])
        continue;
      TensorId big = nd.outputs[0];
      for (TensorId o : nd.outputs)
        if (g.tensor(o).bytes() > g.tensor(big).bytes()) big = o;
      const auto r = static_cast<size_t>(root(big));
      on_host[static_cast<size_t>(p)] =
          host_readers[r] > 0 && device_readers[r] == 0 && persistent_inputs_paged(nd);
    }
  }

  // What happens to each saved activation.
  s.residency.assign(n_t, Residency::keep);
  std::vector<const SavedActivation*> saved_of(n_t, nullptr);
  const std::vector<SavedActivation>& saved = pc.saved;
  if (!req.residency.empty())
    for (const SavedActivation& sa : saved) {
      // A gradient whose update runs on the host goes there once, not back;
      // what a host node makes is copied in once and kept.
      if (sa.gradient && on_host[static_cast<size_t>(sa.first_backward)]) continue;
      if (on_host[static_cast<size_t>(sa.producer)]) continue;
      const Residency r = req.residency[static_cast<size_t>(sa.tensor)];
      if (r == Residency::recompute && !sa.recomputable) continue;
      s.residency[static_cast<size_t>(sa.tensor)] = r;
      saved_of[static_cast<size_t>(sa.tensor)] = &sa;
    }

  // The launch slots: every node that is not a view, in program order, with
  // recompute launches inserted where a backward node first needs a tensor
  // that was recomputed away (its producer's own inputs first, recursively).
  struct Slot {
    int pos;                      // program position of the node
    TensorId target = kNoTensor;  // a recompute launch: the tensor it remakes
  };
  std::vector<Slot> slots;
  std::vector<int> slot_of_pos(static_cast<size_t>(n_pos), -1);
  std::vector<char> back(n_t, 0);     // an out-of-core tensor is back on the device
  std::vector<int> back_at(n_t, -1);  // the slot that first reads it again
  std::function<void(TensorId)> bring_back = [&](TensorId x) {
    const auto r = static_cast<size_t>(root(x));
    if (s.residency[r] == Residency::keep || back[r]) return;
    back[r] = 1;
    if (s.residency[r] == Residency::recompute) {
      for (TensorId in : node_at(saved_of[r]->producer).inputs) bring_back(in);
      slots.push_back({saved_of[r]->producer, static_cast<TensorId>(r)});
    }
    back_at[r] = static_cast<int>(slots.size());  // the next slot reads it
  };
  int first_backward_slot = -1;  // the first slot after the split (recomputes included)
  for (int p = 0; p < n_pos; ++p) {
    if (al.is_view[static_cast<size_t>(p)]) continue;
    if (p > req.split && req.split >= 0) {
      if (first_backward_slot < 0) first_backward_slot = static_cast<int>(slots.size());
      for (TensorId x : node_at(p).inputs) {
        if (on_host[static_cast<size_t>(p)]) break;  // reads its operands on the host
        // A gradient is read before its gap too (by the norm of clipping).
        const SavedActivation* sa = saved_of[static_cast<size_t>(root(x))];
        if (!sa || p >= sa->first_backward) bring_back(x);
      }
    }
    slot_of_pos[static_cast<size_t>(p)] = static_cast<int>(slots.size());
    slots.push_back({p});
  }
  const int n_slots = static_cast<int>(slots.size());
  if (first_backward_slot < 0) first_backward_slot = n_slots;
  auto paged = [&](size_t t) { return layout.paged(static_cast<TensorId>(t)); };
  // A slot whose launch runs on the host: it uses no device memory.
  auto runs_on_host = [&](int sl) {
    const Slot& x = slots[static_cast<size_t>(sl)];
    return x.target == kNoTensor && on_host[static_cast<size_t>(x.pos)] != 0;
  };

  // A paged tensor's backward uses split in two groups where they have a long
  // gap (with clipping, between a weight's read in the backward pass and its
  // update at the end): the later group is paged in again rather than keep
  // the weight on the device through the gap. Long: the copy's lead and lag
  // fit in it with two launches to spare. `late_group[t]`: the slot of the
  // later group's first use, or -1.
  std::vector<int> late_group(n_t, -1);
  if (!layout.home_offset.empty()) {
    std::vector<int> last_use(n_t, -1), gap(n_t, 0);
    const int long_gap = std::max(0, req.prefetch_lead) + std::max(0, req.release_lag) + 2;
    for (int sl = first_backward_slot; sl < n_slots; ++sl) {
      if (runs_on_host(sl)) continue;
      const Node& nd = node_at(slots[static_cast<size_t>(sl)].pos);
      for (const auto* list : {&nd.inputs, &nd.outputs})
        for (TensorId x : *list) {
          const auto r = static_cast<size_t>(root(x));
          if (!paged(r) || last_use[r] == sl) continue;
          if (last_use[r] >= 0 && sl - last_use[r] > std::max(gap[r], long_gap)) {
            gap[r] = sl - last_use[r];
            late_group[r] = sl;
          }
          last_use[r] = sl;
        }
    }
  }

  // Intervals: A before the gap (or the whole life of a kept tensor), B after;
  // a paged tensor's forward uses in A, its backward ones in B, or in B and C
  // (the later group).
  std::vector<Interval> A(n_t), B(n_t), C(n_t);
  std::vector<int> release(n_t, -1), prefetch(n_t, -1);  // swap: last slot of A, first of B
  std::vector<char> touched(n_t, 0);
  for (size_t t = 0; t < n_t; ++t) {
    if (s.residency[t] == Residency::keep) continue;
    const SavedActivation& sa = *saved_of[t];
    const int lf = slot_of_pos[static_cast<size_t>(sa.last_forward)];
    const int target = back_at[t];
    if (s.residency[t] == Residency::swap) {
      release[t] = std::min(lf + std::max(0, req.release_lag), target - 1);
      prefetch[t] = std::max(release[t] + 1, target - std::max(0, req.prefetch_lead));
      A[t].last = release[t];
      B[t].first = prefetch[t];
    } else {
      A[t].last = lf;
      B[t].first = target - 1;  // the recompute launch just before the reader
    }
  }
  // A paged tensor's group of uses at `slot` (0: forward, 1: backward, 2:
  // the later backward group), and the interval of each.
  auto group_of = [&](size_t r, int slot) {
    return slot < first_backward_slot ? 0 : late_group[r] >= 0 && slot >= late_group[r] ? 2 : 1;
  };
  auto group_interval = [&](size_t t, int group) -> Interval& {
    return group == 0 ? A[t] : group == 1 ? B[t] : C[t];
  };
  // Which interval an access at `slot` uses.
  auto interval = [&](TensorId x, int slot) -> Interval& {
    const auto r = static_cast<size_t>(root(x));
    if (paged(r)) return group_interval(r, group_of(r, slot));
    if (s.residency[r] != Residency::keep && slot >= B[r].first) return B[r];
    return A[r];
  };
  auto note = [&](Interval& iv, int slot) {
    if (iv.first < 0 || slot < iv.first) iv.first = slot;
    if (iv.last != kLiveForever) iv.last = std::max(iv.last, slot);
  };
  for (int sl = 0; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;
    const Node& nd = node_at(slots[static_cast<size_t>(sl)].pos);
    for (TensorId x : nd.inputs) {
      touched[static_cast<size_t>(x)] = 1;
      note(interval(x, sl), sl);
    }
    for (TensorId o : nd.outputs) {
      touched[static_cast<size_t>(o)] = 1;
      Interval& iv = slots[static_cast<size_t>(sl)].target != kNoTensor
                         ? B[static_cast<size_t>(root(o))]
                         : interval(o, sl);
      note(iv, sl);
    }
  }
  // What a host node makes lands in the arena from the slot after it (its
  // copy in starts there, once the host kernel is done), and is read on the
  // device from its first device use on.
  std::vector<int> host_out_at(n_t, -1), host_out_use(n_t, -1);
  for (int sl = 0; sl < n_slots; ++sl) {
    if (!runs_on_host(sl)) continue;
    for (TensorId o : node_at(slots[static_cast<size_t>(sl)].pos).outputs) {
      const auto r = static_cast<size_t>(root(o));
      host_out_at[r] = sl;
      if (A[r].first < 0) continue;  // read on the host alone: never copied in
      host_out_use[r] = A[r].first;
      A[r].first = std::min(A[r].first, sl + 1);
    }
  }
  // A tensor read only through views is still the program's (a paged
  // weight a view reads must be copied in).
  for (size_t t = 0; t < n_t; ++t)
    if (touched[t]) touched[static_cast<size_t>(al.root[t])] = 1;
  // View outputs read by no launch still belong to the program (outputs).
  for (int p = 0; p < n_pos; ++p)
    if (al.is_view[static_cast<size_t>(p)])
      for (TensorId o : node_at(p).outputs) touched[static_cast<size_t>(o)] = 1;
  std::vector<char> made(n_t, 0);
  for (int p = 0; p < n_pos; ++p)
    for (TensorId y : node_at(p).outputs) made[static_cast<size_t>(y)] = 1;
  for (TensorId o : req.outputs) {
    const TensorDesc& d = g.tensor(o);
    if (!made[static_cast<size_t>(o)] && d.role != Role::input && !persistent(d))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("output '{}' is not computed by this program", d.name));
    if (layout.host_offset[static_cast<size_t>(o)] == kUnplaced)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("output '{}' has no host staging slot in this session", d.name));
    touched[static_cast<size_t>(o)] = 1;
    A[static_cast<size_t>(root(o))].last = kLiveForever;
  }

  // Paged weights and optimizer state: each group of uses is copied in from
  // the home slot `prefetch_lead` launches before its first use (after the
  // previous group's region is gone), and, when a node of the group writes
  // it (the optimizer update), copied back home after its last use, its
  // region released `release_lag` launches later once that copy is done.
  struct PagedGroup {
    int page_in = -1, first_use = -1, last_use = -1, release_wait = -1;
    bool written = false;
  };
  std::vector<std::array<PagedGroup, 3>> pg;
  bool any_paged = false;
  for (size_t t = 0; t < n_t && !any_paged; ++t) any_paged = touched[t] && paged(t);
  if (any_paged) {
    pg.resize(n_t);
    for (int sl = 0; sl < n_slots; ++sl) {
      if (runs_on_host(sl)) continue;  // writes the home itself
      const Node& nd = node_at(slots[static_cast<size_t>(sl)].pos);
      for (int m : pc.def[static_cast<size_t>(slots[static_cast<size_t>(sl)].pos)]->mutates) {
        const auto r = static_cast<size_t>(root(nd.inputs[static_cast<size_t>(m)]));
        if (paged(r)) pg[r][static_cast<size_t>(group_of(r, sl))].written = true;
      }
    }
    const int lead = std::max(0, req.prefetch_lead), lag = std::max(0, req.release_lag);
    for (size_t t = 0; t < n_t; ++t) {
      if (!touched[t] || !paged(t)) continue;
      int floor_slot = 0;
      for (int gi = 0; gi < 3; ++gi) {
        Interval& iv = group_interval(t, gi);
        if (iv.first < 0) continue;
        PagedGroup& G = pg[t][static_cast<size_t>(gi)];
        G.first_use = iv.first;
        G.last_use = iv.last;
        G.page_in = std::max(floor_slot, iv.first - lead);
        iv.first = G.page_in;
        if (G.written) {
          iv.last = std::min(n_slots - 1, iv.last + lag);
          if (iv.last + 1 < n_slots) G.release_wait = iv.last + 1;
        }
        floor_slot = iv.last + 1;
      }
    }
  }

  // What a host node reads that lives on the device (an update's gradient,
  // the clipping norm, a row gradient's output gradient) is copied out to a
  // host slot after its last device use;
  // its region is held `lag` launches more for the copy, and the compute
  // stream waits for the copy before the region's next owner.
  const int host_lag = std::max(1, req.release_lag);
  // A program input a host node reads where it is staged.
  auto staged_input = [&](size_t t) {
    return g.tensor(static_cast<TensorId>(t)).role == Role::input &&
           layout.host_offset[t] != kUnplaced;
  };
  std::vector<int> host_copy_after(n_t, -1), host_copy_until(n_t, -1), host_read_until(n_t, -1);
  for (int sl = 0; sl < n_slots; ++sl) {
    if (!runs_on_host(sl)) continue;
    for (TensorId x : node_at(slots[static_cast<size_t>(sl)].pos).inputs) {
      const auto r = static_cast<size_t>(root(x));
      if (host_out_at[r] >= 0) host_read_until[r] = sl;  // made on the host
      if (paged(r) || staged_input(r) || host_out_at[r] >= 0) continue;
      host_copy_until[r] = sl;
    }
  }
  for (int sl = 0; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;
    const Node& nd = node_at(slots[static_cast<size_t>(sl)].pos);
    for (const auto* list : {&nd.inputs, &nd.outputs})
      for (TensorId x : *list) {
        const auto r = static_cast<size_t>(root(x));
        if (host_copy_until[r] >= 0 && sl < host_copy_until[r]) host_copy_after[r] = sl;
      }
  }
  for (size_t t = 0; t < n_t; ++t) {
    if (host_copy_until[t] < 0) continue;
    if (host_copy_after[t] < 0)
      throw Error(POOCH_ERR_INTERNAL,
                  fmt::format("a host node reads '{}', which nothing before it on the device "
                              "makes",
                              g.tensor(static_cast<TensorId>(t)).name));
    Interval& iv = interval(static_cast<TensorId>(t), host_copy_after[t]);
    if (iv.last != kLiveForever)
      iv.last = std::max(iv.last, std::min(n_slots - 1, host_copy_after[t] + host_lag));
  }

  // One request per interval of a non-persistent root.
  std::vector<BufferRequest> reqs;
  for (size_t t = 0; t < n_t; ++t) {
    if (!touched[t] || root(static_cast<TensorId>(t)) != static_cast<TensorId>(t)) continue;
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (persistent(d) && !paged(t)) continue;
    if (d.role == Role::input) {
      A[t].first = 0;  // copied in before the first launch
      if (A[t].last < 0) A[t].last = 0;
      s.copied_in.push_back(static_cast<TensorId>(t));
      if (layout.host_offset[t] == kUnplaced)
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("input '{}' has no host staging slot in this session", d.name));
    } else if (A[t].first < 0 && !paged(t)) {
      throw Error(
          POOCH_ERR_INTERNAL,
          fmt::format("tensor '{}' is read by the program but nothing in it writes it", d.name));
    }
    for (Interval* iv : {&A[t], &B[t], &C[t]}) {
      if (iv->first < 0) continue;
      BufferRequest r;
      r.bytes = d.bytes();
      r.role = d.role;
      if (names)
        r.name = paged(t)      ? d.name + " (paged)"
                 : iv != &A[t] ? d.name + " (" + residency_name(s.residency[t]) + ")"
                               : d.name;
      r.first = iv->first;
      r.last = iv->last == kLiveForever ? kLiveForever : std::max(iv->first, iv->last);
      iv->request = static_cast<int>(reqs.size());
      reqs.push_back(r);
      s.transient_tensor.push_back(static_cast<TensorId>(t));
    }
    if (s.residency[t] == Residency::swap) s.swapped_bytes += d.bytes();
    if (s.residency[t] == Residency::recompute) s.recomputed_bytes += d.bytes();
    if (paged(t)) {
      for (const PagedGroup& G : pg[t]) {
        if (G.page_in >= 0) s.paged_in_bytes += d.bytes();
        if (G.page_in >= 0 && G.written) s.paged_out_bytes += d.bytes();
      }
    }
  }
  // Every paged tensor lives at home, whether this program copies it in or
  // not (the optimizer state of an update on the host never comes in).
  for (size_t t = 0; t < n_t; ++t)
    if (paged(t)) s.paged_bytes += g.tensor(static_cast<TensorId>(t)).bytes();

  // In place: an op allowed to overwrite an input that dies at that op (never
  // a swapped tensor's first interval, which its copy out may still read).
  for (int sl = 0; sl < n_slots; ++sl) {
    const Slot& slot = slots[static_cast<size_t>(sl)];
    const Node& nd = node_at(slot.pos);
    const OpDef& def = *pc.def[static_cast<size_t>(slot.pos)];
    if (def.inplace_input < 0 || nd.outputs.empty() || runs_on_host(sl)) continue;
    const TensorId x = root(nd.inputs[static_cast<size_t>(def.inplace_input)]);
    const Role rx = g.tensor(x).role;
    if (rx != Role::activation && rx != Role::gradient) continue;
    const Interval& ix = interval(x, sl);
    const TensorId y = root(nd.outputs[0]);
    const Interval& iy = slot.target != kNoTensor ? B[static_cast<size_t>(y)] : interval(y, sl);
    if (ix.request < 0 || iy.request < 0) continue;
    if (s.residency[static_cast<size_t>(x)] == Residency::swap && &ix == &A[static_cast<size_t>(x)])
      continue;
    BufferRequest& rqx = reqs[static_cast<size_t>(ix.request)];
    BufferRequest& rqy = reqs[static_cast<size_t>(iy.request)];
    if (rqx.last != sl || rqy.first != sl || rqx.bytes < rqy.bytes) continue;
    rqy.inplace_of = ix.request;
  }

  // Launches: kernel, arguments and workspace of every slot.
  std::vector<int> ws_req;
  std::vector<size_t> host_ws(static_cast<size_t>(n_slots), 0);
  for (int sl = 0; sl < n_slots; ++sl) {
    const Slot& slot = slots[static_cast<size_t>(sl)];
    const int ni = req.nodes[static_cast<size_t>(slot.pos)];
    const Node& nd = nodes[static_cast<size_t>(ni)];
    s.launch_node.push_back(ni);
    const bool host = runs_on_host(sl);
    if (!host && cache && cache->launch.size() == nodes.size() &&
        cache->launch[static_cast<size_t>(ni)].kernel) {
      const Launch& l = cache->launch[static_cast<size_t>(ni)];
      ws_req.push_back(static_cast<int>(reqs.size()));
      BufferRequest wr{l.args.workspace_bytes, sl, sl, Role::activation, -1, {}};
      if (names) wr.name = fmt::format("workspace of node {} ({})", ni, nd.op);
      reqs.push_back(std::move(wr));
      s.transient_tensor.push_back(kNoTensor);
      if (!candidate) s.launches.push_back(l);
      continue;
    }
    Launch l;
    l.node = ni;
    kern::KernelArgs& a = l.args;
    if (nd.inputs.size() > kern::kMaxOperands || nd.outputs.size() > kern::kMaxOperands)
      throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}' (node {}) has more than {} operands",
                                                     nd.op, ni, kern::kMaxOperands));
    a.n_in = static_cast<int>(nd.inputs.size());
    a.n_out = static_cast<int>(nd.outputs.size());
    for (int j = 0; j < a.n_in; ++j) a.in[j] = view_of(g.tensor(nd.inputs[static_cast<size_t>(j)]));
    for (int j = 0; j < a.n_out; ++j)
      a.out[j] = view_of(g.tensor(nd.outputs[static_cast<size_t>(j)]));
    for (const auto& [name, value] : nd.attrs.items())
      if (!a.attrs.set(name.c_str(), value))
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("op '{}' (node {}): too many attributes or attribute name '{}' "
                                "longer than 23 characters",
                                nd.op, ni, name));
    a.device = host ? nullptr : backend.kernel_device();
    l.kernel = host ? &choose_host_kernel(backend, nd, a, opt.deterministic)
                    : &choose_kernel(backend, nd, a, opt.deterministic);
    l.on_host = host;
    a.workspace_bytes = l.kernel->workspace ? l.kernel->workspace(a) : 0;
    ws_req.push_back(static_cast<int>(reqs.size()));
    // A host kernel's workspace is in the host pool (below), none in the arena.
    if (host) host_ws[static_cast<size_t>(sl)] = a.workspace_bytes;
    reqs.push_back({host ? 0 : a.workspace_bytes, sl, sl, Role::activation, -1,
                    fmt::format("workspace of node {} ({})", ni, nd.op)});
    s.transient_tensor.push_back(kNoTensor);
    if (!candidate) s.launches.push_back(l);
    if (host) ++s.host_launches;
    if (host && !pc.def[static_cast<size_t>(slot.pos)]->mutates.empty()) ++s.host_updates;
    if (cache && !host) {
      cache->launch.resize(nodes.size());
      cache->launch[static_cast<size_t>(ni)] = l;
    }
  }

  const size_t align = layout.alignment;
  s.transient = plan_arena(reqs, align);
  const size_t base = align_up(layout.persistent.peak, align);
  s.arena_bytes = base + s.transient.peak;
  auto offset_of = [&](const Interval& iv) {
    return base + s.transient.offsets[static_cast<size_t>(iv.request)];
  };
  s.tensor_offset.assign(n_t, kUnplaced);
  for (size_t t = 0; t < n_t; ++t) {
    const auto r = static_cast<size_t>(al.root[t]);
    if (layout.device_offset[r] != kUnplaced)
      s.tensor_offset[t] = layout.device_offset[r];
    else if (A[r].request >= 0)
      s.tensor_offset[t] = offset_of(A[r]);
    else if (B[r].request >= 0)
      s.tensor_offset[t] = offset_of(B[r]);  // a paged tensor the backward part alone uses
    else if (C[r].request >= 0)
      s.tensor_offset[t] = offset_of(C[r]);
  }
  auto device_offset = [&](TensorId x, int sl, bool written) {
    const auto r = static_cast<size_t>(root(x));
    if (layout.device_offset[r] != kUnplaced) return layout.device_offset[r];
    const bool remake = written && slots[static_cast<size_t>(sl)].target != kNoTensor;
    return offset_of(remake ? B[r] : interval(x, sl));
  };
  for (int sl = 0; sl < n_slots && !candidate; ++sl) {
    Launch& l = s.launches[static_cast<size_t>(sl)];
    if (l.on_host) continue;  // host pool offsets, below
    const Node& nd = nodes[static_cast<size_t>(l.node)];
    for (int j = 0; j < l.args.n_in; ++j)
      l.in_offset[j] = device_offset(nd.inputs[static_cast<size_t>(j)], sl, false);
    for (int j = 0; j < l.args.n_out; ++j)
      l.out_offset[j] = device_offset(nd.outputs[static_cast<size_t>(j)], sl, true);
    if (l.args.workspace_bytes && !l.on_host)
      l.workspace_offset =
          base + s.transient.offsets[static_cast<size_t>(ws_req[static_cast<size_t>(sl)])];
  }

  // Host slots for swapped tensors, above the session's staging slots.
  std::vector<BufferRequest> host_reqs;
  std::vector<TensorId> host_ids;
  for (size_t t = 0; t < n_t; ++t) {
    if (s.residency[t] != Residency::swap) continue;
    host_reqs.push_back(
        {g.tensor(static_cast<TensorId>(t)).bytes(),
         slot_of_pos[static_cast<size_t>(saved_of[t]->producer)], back_at[t], Role::activation, -1,
         names ? "swap slot of " + g.tensor(static_cast<TensorId>(t)).name : std::string()});
    host_ids.push_back(static_cast<TensorId>(t));
  }
  // And for what host updates read from the device, from its copy out to
  // the last host update that reads it.
  const size_t n_swap_slots = host_reqs.size();
  for (size_t t = 0; t < n_t; ++t) {
    if (host_copy_until[t] < 0) continue;
    host_reqs.push_back(
        {g.tensor(static_cast<TensorId>(t)).bytes(), host_copy_after[t], host_copy_until[t],
         Role::gradient, -1,
         names ? "host copy of " + g.tensor(static_cast<TensorId>(t)).name : std::string()});
    host_ids.push_back(static_cast<TensorId>(t));
    s.host_update_copy_bytes += g.tensor(static_cast<TensorId>(t)).bytes();
  }
  const size_t n_copy_slots = host_reqs.size();
  for (size_t t = 0; t < n_t; ++t) {
    if (host_out_at[t] < 0) continue;
    host_reqs.push_back(
        {g.tensor(static_cast<TensorId>(t)).bytes(), host_out_at[t],
         std::max({host_out_at[t], host_out_use[t], host_read_until[t]}),
         g.tensor(static_cast<TensorId>(t)).role, -1,
         names ? "host output " + g.tensor(static_cast<TensorId>(t)).name : std::string()});
    host_ids.push_back(static_cast<TensorId>(t));
  }
  const size_t n_out_slots = host_reqs.size();
  std::vector<int> host_ws_slot;  // per host workspace request: its launch slot
  for (int sl = 0; sl < n_slots; ++sl) {
    if (!host_ws[static_cast<size_t>(sl)]) continue;
    host_reqs.push_back({host_ws[static_cast<size_t>(sl)], sl, sl, Role::activation, -1,
                         names ? fmt::format("host workspace of slot {}", sl) : std::string()});
    host_ws_slot.push_back(sl);
  }
  for (size_t i = n_swap_slots; i < host_reqs.size(); ++i)
    s.host_side_bytes += align_up(host_reqs[i].bytes, align);
  const ArenaPlan host_plan = plan_arena(host_reqs, align);
  const size_t host_base = align_up(layout.host.peak, align);
  s.host_bytes = host_reqs.empty() ? layout.host.peak : host_base + host_plan.peak;
  std::vector<size_t> host_slot(n_t, kUnplaced), host_copy(n_t, kUnplaced),
      host_out(n_t, kUnplaced);
  for (size_t i = 0; i < host_ids.size(); ++i)
    (i < n_swap_slots   ? host_slot
     : i < n_copy_slots ? host_copy
                        : host_out)[static_cast<size_t>(host_ids[i])] =
        host_base + host_plan.offsets[i];
  std::vector<size_t> host_ws_offset(static_cast<size_t>(n_slots), kUnplaced);
  for (size_t i = 0; i < host_ws_slot.size(); ++i)
    host_ws_offset[static_cast<size_t>(host_ws_slot[i])] =
        host_base + host_plan.offsets[n_out_slots + i];
  // A host launch's operands: a paged tensor at home, anything else at its
  // host copy.
  for (int sl = 0; sl < n_slots && !candidate; ++sl) {
    Launch& l = s.launches[static_cast<size_t>(sl)];
    if (!l.on_host) continue;
    const Node& nd = nodes[static_cast<size_t>(l.node)];
    for (int j = 0; j < l.args.n_in; ++j) {
      const auto r = static_cast<size_t>(root(nd.inputs[static_cast<size_t>(j)]));
      l.in_offset[j] = paged(r)              ? layout.home_offset[r]
                       : staged_input(r)     ? layout.host_offset[r]
                       : host_out_at[r] >= 0 ? host_out[r]
                                             : host_copy[r];
    }
    for (int j = 0; j < l.args.n_out; ++j)
      l.out_offset[j] = host_out[static_cast<size_t>(root(nd.outputs[static_cast<size_t>(j)]))];
    if (l.args.workspace_bytes) l.workspace_offset = host_ws_offset[static_cast<size_t>(sl)];
  }

  // Steps: inputs in; per slot, the swap and prefetch traffic around its
  // launch; outputs back.
  for (TensorId t : s.copied_in)
    s.add_copy(StepKind::copy_in, Stream::h2d,
               {t, offset_of(A[static_cast<size_t>(t)]), layout.host_offset[static_cast<size_t>(t)],
                g.tensor(t).bytes()});
  if (!s.copied_in.empty()) {
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, Stream::h2d, e});
    s.steps.push_back({StepKind::wait, Stream::compute, e});
  }
  // Per slot, the copies around its launch: a swapped tensor (group -1) or
  // a paged tensor's group of uses (0: forward, 1: backward), in tensor
  // order, so plans stay deterministic; one pass over the tensors instead of
  // one per slot.
  struct Traffic {
    size_t t;
    int group;  // a paged tensor's group (0, 1, 2), or one of these:
  };
  constexpr int kSwap = -1, kHostCopy = -2, kHostOut = -3;
  std::vector<std::vector<Traffic>> before_slot(static_cast<size_t>(n_slots)),
      after_slot(static_cast<size_t>(n_slots));
  auto at = [&](std::vector<std::vector<Traffic>>& v, int sl, Traffic x) {
    if (sl < 0 || sl >= n_slots) return;
    auto& l = v[static_cast<size_t>(sl)];
    if (l.empty() || l.back().t != x.t || l.back().group != x.group) l.push_back(x);
  };
  for (size_t t = 0; t < n_t; ++t) {
    if (s.residency[t] == Residency::swap) {
      for (int sl : {release[t] + 1, prefetch[t], back_at[t]}) at(before_slot, sl, {t, kSwap});
      at(after_slot, slot_of_pos[static_cast<size_t>(saved_of[t]->producer)], {t, kSwap});
    }
    if (host_copy_until[t] >= 0) {
      at(after_slot, host_copy_after[t], {t, kHostCopy});
      at(before_slot, host_copy_after[t] + host_lag + 1, {t, kHostCopy});
    }
    if (host_out_use[t] >= 0)
      for (int sl : {host_out_at[t] + 1, host_out_use[t]}) at(before_slot, sl, {t, kHostOut});
    if (!pg.empty() && touched[t] && paged(t))
      for (int gi = 0; gi < 3; ++gi) {
        const PagedGroup& G = pg[t][static_cast<size_t>(gi)];
        if (G.page_in < 0) continue;
        for (int sl : {G.release_wait, G.page_in, G.first_use}) at(before_slot, sl, {t, gi});
        if (G.written) at(after_slot, G.last_use, {t, gi});
      }
  }
  std::vector<int> out_done(n_t, -1), in_done(n_t, -1), host_copy_done(n_t, -1);
  std::vector<int> host_done(static_cast<size_t>(n_slots), -1);  // a host launch's end
  std::vector<int> paged_out_done(pg.empty() ? 0 : 3 * n_t, -1),
      paged_in_done(pg.empty() ? 0 : 3 * n_t, -1);
  for (int sl = 0; sl < n_slots; ++sl) {
    const auto& before = before_slot[static_cast<size_t>(sl)];
    // Regions released before this slot are free once their copies out are
    // done: every such wait comes before a copy in may land there.
    for (const Traffic& x : before) {
      const size_t t = x.t;
      if (x.group == kHostCopy && host_copy_after[t] + host_lag + 1 == sl)
        s.steps.push_back({StepKind::wait, Stream::compute, host_copy_done[t]});
      if (x.group == kSwap && release[t] + 1 == sl)
        s.steps.push_back({StepKind::wait, Stream::compute, out_done[t]});
      if (x.group >= 0 && pg[t][static_cast<size_t>(x.group)].release_wait == sl)
        s.steps.push_back({StepKind::wait, Stream::compute,
                           paged_out_done[3 * t + static_cast<size_t>(x.group)]});
    }
    for (const Traffic& x : before) {
      const size_t t = x.t;
      if (x.group == kHostOut && host_out_at[t] + 1 == sl) {
        // Made on the host: in once the host kernel is done and its landing
        // region is free.
        const int free = s.add_event();
        s.steps.push_back({StepKind::record, Stream::compute, free});
        s.steps.push_back({StepKind::wait, Stream::h2d, free});
        s.steps.push_back({StepKind::wait, Stream::h2d, host_done[host_out_at[t]]});
        s.add_copy(StepKind::copy_in, Stream::h2d,
                   {static_cast<TensorId>(t), offset_of(A[t]), host_out[t],
                    g.tensor(static_cast<TensorId>(t)).bytes()});
        in_done[t] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::h2d, in_done[t]});
        continue;
      }
      const bool swap_in = x.group == kSwap && prefetch[t] == sl;
      const bool page_in = x.group >= 0 && pg[t][static_cast<size_t>(x.group)].page_in == sl;
      if (!swap_in && !page_in) continue;
      const int free = s.add_event();
      s.steps.push_back({StepKind::record, Stream::compute, free});
      s.steps.push_back({StepKind::wait, Stream::h2d, free});
      const size_t bytes = g.tensor(static_cast<TensorId>(t)).bytes();
      if (swap_in) {
        s.add_copy(StepKind::copy_in, Stream::h2d,
                   {static_cast<TensorId>(t), offset_of(B[t]), host_slot[t], bytes});
        in_done[t] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::h2d, in_done[t]});
      } else {
        const size_t k = 3 * t + static_cast<size_t>(x.group);
        s.add_copy(StepKind::copy_in, Stream::h2d,
                   {static_cast<TensorId>(t), offset_of(group_interval(t, x.group)),
                    layout.home_offset[t], bytes});
        paged_in_done[k] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::h2d, paged_in_done[k]});
      }
    }
    for (const Traffic& x : before) {
      const size_t t = x.t;
      if (x.group == kHostOut && host_out_use[t] == sl)
        s.steps.push_back({StepKind::wait, Stream::compute, in_done[t]});
      if (x.group == kSwap && back_at[t] == sl)
        s.steps.push_back({StepKind::wait, Stream::compute, in_done[t]});
      if (x.group >= 0 && pg[t][static_cast<size_t>(x.group)].first_use == sl)
        s.steps.push_back(
            {StepKind::wait, Stream::compute, paged_in_done[3 * t + static_cast<size_t>(x.group)]});
    }
    if (runs_on_host(sl)) {
      // On the d2h stream, after its operands' copies out (queued there
      // before it) and once the compute stream is past every earlier launch
      // (so every copy in from the homes it writes is done).
      const int reached = s.add_event();
      s.steps.push_back({StepKind::record, Stream::compute, reached});
      s.steps.push_back({StepKind::wait, Stream::d2h, reached});
      s.steps.push_back({StepKind::launch, Stream::d2h, sl});
      host_done[static_cast<size_t>(sl)] = s.add_event();
      s.steps.push_back({StepKind::record, Stream::d2h, host_done[static_cast<size_t>(sl)]});
    } else {
      s.steps.push_back({StepKind::launch, Stream::compute, sl});
    }
    for (const Traffic& x : after_slot[static_cast<size_t>(sl)]) {
      const size_t t = x.t;
      const int made = s.add_event();
      s.steps.push_back({StepKind::record, Stream::compute, made});
      s.steps.push_back({StepKind::wait, Stream::d2h, made});
      const size_t bytes = g.tensor(static_cast<TensorId>(t)).bytes();
      if (x.group == kHostCopy) {
        const TensorId tt = static_cast<TensorId>(t);
        const size_t from = layout.device_offset[t] != kUnplaced
                                ? layout.device_offset[t]
                                : offset_of(interval(tt, host_copy_after[t]));
        s.add_copy(StepKind::copy_out, Stream::d2h, {tt, from, host_copy[t], bytes});
        host_copy_done[t] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::d2h, host_copy_done[t]});
      } else if (x.group == kSwap) {
        s.add_copy(StepKind::copy_out, Stream::d2h,
                   {static_cast<TensorId>(t), offset_of(A[t]), host_slot[t], bytes});
        out_done[t] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::d2h, out_done[t]});
      } else {
        // The updated weight or state goes back home.
        const size_t k = 3 * t + static_cast<size_t>(x.group);
        s.add_copy(StepKind::copy_out, Stream::d2h,
                   {static_cast<TensorId>(t), offset_of(group_interval(t, x.group)),
                    layout.home_offset[t], bytes});
        paged_out_done[k] = s.add_event();
        s.steps.push_back({StepKind::record, Stream::d2h, paged_out_done[k]});
      }
    }
  }
  s.transient_requests = std::move(reqs);
  s.copied_out = req.outputs;
  if (!s.copied_out.empty()) {
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, Stream::compute, e});
    s.steps.push_back({StepKind::wait, Stream::d2h, e});
    for (TensorId t : s.copied_out)
      s.add_copy(StepKind::copy_out, Stream::d2h,
                 {t, s.tensor_offset[static_cast<size_t>(t)],
                  layout.host_offset[static_cast<size_t>(t)], g.tensor(t).bytes()});
  }
  return s;
}

}  // namespace pooch
