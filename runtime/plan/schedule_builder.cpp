// plan_schedule (planner.h): one program's Schedule, built in stages that
// each read what the earlier ones decided:
//
//   1. which nodes run on the host (updates where their state lives);
//   2. what happens to each saved activation (keep, swap, recompute);
//   3. the launch slots, with recompute launches inserted;
//   4. each tensor's intervals in the arena, paged groups, host copies;
//   5. buffer requests, in-place reuse and each slot's launch;
//   6. placement in the arena and the host pool;
//   7. the steps: copies and events on the three streams around each launch.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"
#include "layouts.h"
#include "planner.h"
#include "program_facts.h"

namespace pooch {
namespace {

kern::TensorView view_of(const TensorDesc& d) {
  kern::TensorView v;
  v.dtype = d.dtype;
  v.ndim = static_cast<int>(d.shape.size());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = d.shape[static_cast<size_t>(i)];
  return v;
}

// One stretch of time a tensor spends in the arena, in launch slots.
struct Interval {
  int first = -1, last = -1;
  int request = -1;
};

// A launch slot: a node that is not a view, in program order, or a
// recompute launch of a node inserted where a backward node first needs a
// tensor that was recomputed away.
struct Slot {
  int pos;                      // program position of the node
  TensorId target = kNoTensor;  // a recompute launch: the tensor it remakes
  bool replay = false;          // the recompute launches the node's replay (OpDef::replay)
};

// One group of a paged tensor's uses (0: forward, 1: backward, 2: the later
// backward group): copied in at `page_in`, and, when a node of the group
// writes it, back home after `last_use`, its region free at `release_wait`.
struct PagedGroup {
  int page_in = -1, first_use = -1, last_use = -1, release_wait = -1;
  bool written = false;
};

// A copy around a launch: a paged tensor's group of uses (0, 1, 2), or one
// of the kinds below.
struct Traffic {
  size_t t;
  int group;
};
constexpr int kSwap = -1, kHostCopy = -2, kHostOut = -3;

class ScheduleBuilder {
 public:
  ScheduleBuilder(const Graph& g, const ProgramRequest& req, const Backend& backend,
                  const SessionLayout& layout, const PlanOptions& opt, PlanCache* cache)
      : g(g),
        req(req),
        backend(backend),
        layout(layout),
        opt(opt),
        cache(cache),
        candidate(cache && cache->candidate),
        names(!candidate),
        nodes(g.nodes()),
        n_t(g.num_tensors()),
        n_pos(static_cast<int>(req.nodes.size())),
        pc(cache ? *cache : local) {}

  // The program's facts alone, for its tensors' layouts.
  std::vector<kern::Layout> layouts() {
    learn_facts();
    return pc.layouts;
  }

  Schedule build() {
    learn_facts();
    place_host_nodes();
    choose_residency();
    lay_out_slots();
    split_paged_uses();
    find_intervals();
    check_outputs();
    plan_paged_groups();
    plan_host_copies();
    request_buffers();
    allow_in_place();
    make_launches();
    place_on_device();
    place_on_host();
    collect_traffic();
    emit_steps();
    return std::move(s);
  }

 private:
  // ---- inputs
  const Graph& g;
  const ProgramRequest& req;
  const Backend& backend;
  const SessionLayout& layout;
  const PlanOptions& opt;
  PlanCache* cache;
  const bool candidate;  // a search candidate: no names, launches or offsets
  const bool names;
  const std::vector<Node>& nodes;
  const size_t n_t;
  const int n_pos;
  PlanCache local;
  PlanCache& pc;
  Schedule s;

  // ---- stages 1-3
  std::vector<char> on_host;  // per program position
  std::vector<const SavedActivation*> saved_of;
  std::vector<const SavedActivation*> through_of;  // per tensor: its PlanCache::through entry
  std::vector<Slot> slots;
  int n_slots = 0;
  std::vector<int> slot_of_pos;
  std::vector<int> back_at;      // the slot that first reads it again
  int first_backward_slot = -1;  // the first slot after the split (recomputes included)

  // ---- stage 4
  std::vector<int> late_group;  // per paged tensor: its later backward group's first slot
  // A before the gap (or the whole life of a kept tensor), B after; a paged
  // tensor's forward uses in A, its backward ones in B, or in B and C.
  std::vector<Interval> A, B, C;
  std::vector<int> release, prefetch;  // swap: last slot of A, first of B
  std::vector<char> touched;
  std::vector<int> host_out_at, host_out_use;
  std::vector<std::array<PagedGroup, 3>> pg;  // empty: nothing is paged
  int host_lag = 1;
  std::vector<int> host_copy_after, host_copy_until, host_read_until;

  // ---- stages 5-6
  std::vector<BufferRequest> reqs;
  std::vector<int> ws_req;      // per slot: its workspace's request
  std::vector<size_t> host_ws;  // per slot: a host launch's workspace bytes
  size_t base = 0;              // the transient region's start in the arena
  std::vector<size_t> host_slot, host_copy, host_out;

  // ---- stage 7
  std::vector<std::vector<Traffic>> before_slot, after_slot;  // per slot

  const Node& node_at(int p) const {
    return nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
  }
  // What slot `sl` launches: its node, or the node's replay.
  const Node& slot_node(int sl) const {
    const Slot& x = slots[static_cast<size_t>(sl)];
    return x.replay ? pc.replay[static_cast<size_t>(x.pos)] : node_at(x.pos);
  }
  const OpDef& slot_def(int sl) const {
    const Slot& x = slots[static_cast<size_t>(sl)];
    return x.replay ? *pc.replay_def[static_cast<size_t>(x.pos)] : def_at(x.pos);
  }
  TensorId root(TensorId t) const { return pc.root[static_cast<size_t>(t)]; }
  bool is_view(int p) const { return pc.is_view[static_cast<size_t>(p)] != 0; }
  const OpDef& def_at(int p) const { return *pc.def[static_cast<size_t>(p)]; }
  bool paged(size_t t) const { return layout.paged(static_cast<TensorId>(t)); }
  size_t bytes_of(size_t t) const { return g.tensor(static_cast<TensorId>(t)).bytes(); }
  // A slot whose launch runs on the host: it uses no device memory.
  bool runs_on_host(int sl) const {
    const Slot& x = slots[static_cast<size_t>(sl)];
    return x.target == kNoTensor && on_host[static_cast<size_t>(x.pos)] != 0;
  }
  bool persistent_inputs_paged(const Node& nd) const {
    for (TensorId x : nd.inputs)
      if (persistent(g.tensor(root(x))) && !layout.paged(root(x))) return false;
    return true;
  }
  // A program input a host node reads where it is staged.
  bool staged_input(size_t t) const {
    return g.tensor(static_cast<TensorId>(t)).role == Role::input &&
           layout.host_offset[t] != kUnplaced;
  }
  // A paged tensor's group of uses at `slot` (0: forward, 1: backward, 2:
  // the later backward group), and the interval of each.
  int group_of(size_t r, int slot) const {
    return slot < first_backward_slot ? 0 : late_group[r] >= 0 && slot >= late_group[r] ? 2 : 1;
  }
  Interval& group_interval(size_t t, int group) {
    return group == 0 ? A[t] : group == 1 ? B[t] : C[t];
  }
  // Which interval an access at `slot` uses.
  Interval& interval(TensorId x, int slot) {
    const auto r = static_cast<size_t>(root(x));
    if (paged(r)) return group_interval(r, group_of(r, slot));
    if (s.residency[r] != Residency::keep && slot >= B[r].first) return B[r];
    return A[r];
  }
  size_t offset_of(const Interval& iv) const {
    return base + s.transient.offsets[static_cast<size_t>(iv.request)];
  }
  // Stream `waiter` waits until `signaller` has reached this point.
  void sync(Stream signaller, Stream waiter) {
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, signaller, e});
    s.steps.push_back({StepKind::wait, waiter, e});
  }
  // A copy on `stream`, and the event its end records.
  int copy(StepKind kind, Stream stream, ScheduledCopy c) {
    s.add_copy(kind, stream, c);
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, stream, e});
    return e;
  }

  // A launch's arguments for node nd, its operands in the program's layouts
  // (no data, workspace or kernel yet).
  kern::KernelArgs args_of(const Node& nd, int ni) const;
  void learn_facts();
  void choose_layouts_of_program(const Aliases& al);
  void place_host_nodes();
  void choose_residency();
  void lay_out_slots();
  void split_paged_uses();
  void find_intervals();
  void check_outputs();
  void plan_paged_groups();
  void plan_host_copies();
  void request_buffers();
  void allow_in_place();
  void make_launches();
  void place_on_device();
  void place_on_host();
  void collect_traffic();
  void emit_steps();
};

// The program's facts, once per cache.
void ScheduleBuilder::learn_facts() {
  s.training = req.training;
  if (pc.facts) return;
  Aliases a = find_aliases(g, req);
  pc.saved = saved_activations(g, req, a, &pc.through);
  pc.root = a.root;
  pc.is_view = a.is_view;
  pc.has_alias = a.has_alias;
  pc.def.resize(static_cast<size_t>(n_pos));
  pc.replay.resize(static_cast<size_t>(n_pos));
  pc.replay_def.assign(static_cast<size_t>(n_pos), nullptr);
  for (int p = 0; p < n_pos; ++p) {
    const auto i = static_cast<size_t>(p);
    pc.def[i] = &op_registry().get(node_at(p).op);
    if (is_view(p) || !recompute_replays(node_at(p), *pc.def[i]) || pc.def[i]->replay.op.empty())
      continue;
    pc.replay[i] = recompute_node(node_at(p), *pc.def[i]);
    pc.replay_def[i] = &op_registry().get(pc.replay[i].op);
  }
  choose_layouts_of_program(a);
  pc.facts = true;
}

// Which tensors lie in a blocked layout (layouts.h), from the kernels
// choose_kernel picks for every position and replay with plain operands
// (none found: the launch itself says why, later).
void ScheduleBuilder::choose_layouts_of_program(const Aliases& al) {
  pc.layouts.assign(n_t, kern::Layout::plain);
  LayoutLaunches ll;
  ll.kernel.assign(static_cast<size_t>(n_pos), {});
  ll.replay.assign(static_cast<size_t>(n_pos), nullptr);
  ll.replay_kernel.assign(static_cast<size_t>(n_pos), {});
  auto takes = [&](const Node& nd, int ni) {
    const kern::KernelArgs a = args_of(nd, ni);
    return launch_layouts(find_kernel(backend.kernels(), nd, a, opt.deterministic), a);
  };
  for (int p = 0; p < n_pos; ++p) {
    if (is_view(p)) continue;
    const auto i = static_cast<size_t>(p);
    const int ni = req.nodes[i];
    ll.kernel[i] = takes(node_at(p), ni);
    if (pc.replay_def[i] == nullptr) continue;
    ll.replay[i] = &pc.replay[i];
    ll.replay_kernel[i] = takes(pc.replay[i], ni);
  }
  pc.layouts = choose_layouts(g, req, al, ll, opt.blocked_layouts, layout.layouts);
}

kern::KernelArgs ScheduleBuilder::args_of(const Node& nd, int ni) const {
  kern::KernelArgs a;
  if (nd.inputs.size() > kern::kMaxOperands || nd.outputs.size() > kern::kMaxOperands)
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}' (node {}) has more than {} operands",
                                                   nd.op, ni, kern::kMaxOperands));
  a.n_in = static_cast<int>(nd.inputs.size());
  a.n_out = static_cast<int>(nd.outputs.size());
  auto view = [&](TensorId t) {
    kern::TensorView v = view_of(g.tensor(t));
    if (!pc.layouts.empty()) v.layout = pc.layouts[static_cast<size_t>(t)];
    return v;
  };
  for (int j = 0; j < a.n_in; ++j) a.in[j] = view(nd.inputs[static_cast<size_t>(j)]);
  for (int j = 0; j < a.n_out; ++j) a.out[j] = view(nd.outputs[static_cast<size_t>(j)]);
  for (const auto& [name, value] : nd.attrs.items())
    if (!a.attrs.set(name.c_str(), value))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("op '{}' (node {}): too many attributes or attribute name '{}' "
                              "longer than 23 characters",
                              nd.op, ni, name));
  a.device = backend.kernel_device();
  return a;
}

// Nodes that run on the host: optimizer updates whose weight's update is
// SessionLayout::host_update's (it and its state paged), and ops that read
// rows of such a weight (a sparse input layer), whose other persistent
// inputs are paged too. Their operands are at home, in a staging slot or
// copied out; a row reader's output is copied in.
void ScheduleBuilder::place_host_nodes() {
  on_host.assign(static_cast<size_t>(n_pos), 0);
  if (layout.host_update.empty()) return;
  for (int p = 0; p < n_pos; ++p) {
    const OpDef& d = def_at(p);
    if (d.row_weight >= 0 && !is_view(p)) {
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
  std::vector<int> device_readers(n_t, 0), host_readers(n_t, 0);
  for (int p = 0; p < n_pos; ++p) {
    if (is_view(p)) continue;
    for (TensorId x : node_at(p).inputs)
      ++(on_host[static_cast<size_t>(p)] ? host_readers
                                         : device_readers)[static_cast<size_t>(root(x))];
  }
  for (int p = 0; p < n_pos; ++p) {
    const Node& nd = node_at(p);
    if (!def_at(p).host_for_host_readers || on_host[static_cast<size_t>(p)] || nd.outputs.empty() ||
        is_view(p))
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
void ScheduleBuilder::choose_residency() {
  s.residency.assign(n_t, Residency::keep);
  saved_of.assign(n_t, nullptr);
  through_of.assign(n_t, nullptr);
  if (req.residency.empty()) return;
  for (const SavedActivation& sa : pc.through)
    if (req.remake_unsaved && !on_host[static_cast<size_t>(sa.producer)])
      through_of[static_cast<size_t>(sa.tensor)] = &sa;
  for (const SavedActivation& sa : pc.saved) {
    // A gradient whose update runs on the host goes there once, not back;
    // what a host node makes is copied in once and kept.
    if (sa.gradient && on_host[static_cast<size_t>(sa.first_backward)]) continue;
    if (on_host[static_cast<size_t>(sa.producer)]) continue;
    const Residency r = req.residency[static_cast<size_t>(sa.tensor)];
    if (r == Residency::recompute && !sa.recomputable) continue;
    s.residency[static_cast<size_t>(sa.tensor)] = r;
    saved_of[static_cast<size_t>(sa.tensor)] = &sa;
  }
}

// The launch slots: every node that is not a view, in program order, with
// recompute launches inserted where a backward node first needs a tensor
// that was recomputed away (its producer's own inputs first, recursively).
// A recompute's input that was never saved (through_of) is remade too,
// rather than kept on the device from the forward pass.
void ScheduleBuilder::lay_out_slots() {
  slot_of_pos.assign(static_cast<size_t>(n_pos), -1);
  std::vector<char> back(n_t, 0);  // an out-of-core tensor is back on the device
  back_at.assign(n_t, -1);
  std::function<void(TensorId)> bring_back = [&](TensorId x) {
    const auto r = static_cast<size_t>(root(x));
    if (s.residency[r] == Residency::keep || back[r]) return;
    back[r] = 1;
    if (s.residency[r] == Residency::recompute) {
      const int p = saved_of[r]->producer;
      const bool replay = recompute_replays(node_at(p), def_at(p));
      for (TensorId in : (replay ? pc.replay[static_cast<size_t>(p)] : node_at(p)).inputs) {
        const auto q = static_cast<size_t>(root(in));
        if (through_of[q] && s.residency[q] == Residency::keep) {
          s.residency[q] = Residency::recompute;
          saved_of[q] = through_of[q];
        }
        bring_back(in);
      }
      slots.push_back({p, static_cast<TensorId>(r), replay});
    }
    back_at[r] = static_cast<int>(slots.size());  // the next slot reads it
  };
  for (int p = 0; p < n_pos; ++p) {
    if (is_view(p)) continue;
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
  n_slots = static_cast<int>(slots.size());
  if (first_backward_slot < 0) first_backward_slot = n_slots;
}

// A paged tensor's backward uses split in two groups where they have a long
// gap (with clipping, between a weight's read in the backward pass and its
// update at the end): the later group is paged in again rather than keep
// the weight on the device through the gap. Long: the copy's lead and lag
// fit in it with two launches to spare.
void ScheduleBuilder::split_paged_uses() {
  late_group.assign(n_t, -1);
  if (layout.home_offset.empty()) return;
  std::vector<int> last_use(n_t, -1), gap(n_t, 0);
  const int long_gap = std::max(0, req.prefetch_lead) + std::max(0, req.release_lag) + 2;
  for (int sl = first_backward_slot; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;
    const Node& nd = slot_node(sl);
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

// Each tensor's intervals from the slots that use it.
void ScheduleBuilder::find_intervals() {
  A.assign(n_t, {});
  B.assign(n_t, {});
  C.assign(n_t, {});
  release.assign(n_t, -1);
  prefetch.assign(n_t, -1);
  touched.assign(n_t, 0);
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
  auto note = [](Interval& iv, int slot) {
    if (iv.first < 0 || slot < iv.first) iv.first = slot;
    if (iv.last != kLiveForever) iv.last = std::max(iv.last, slot);
  };
  for (int sl = 0; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;
    const Node& nd = slot_node(sl);
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
  host_out_at.assign(n_t, -1);
  host_out_use.assign(n_t, -1);
  for (int sl = 0; sl < n_slots; ++sl) {
    if (!runs_on_host(sl)) continue;
    for (TensorId o : slot_node(sl).outputs) {
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
    if (touched[t]) touched[static_cast<size_t>(pc.root[t])] = 1;
  // View outputs read by no launch still belong to the program (outputs).
  for (int p = 0; p < n_pos; ++p)
    if (is_view(p))
      for (TensorId o : node_at(p).outputs) touched[static_cast<size_t>(o)] = 1;
}

// Every output is made by the program (or is an input or persistent) and
// has a staging slot; it lives to the end.
void ScheduleBuilder::check_outputs() {
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
}

// Paged weights and optimizer state: each group of uses is copied in from
// the home slot `prefetch_lead` launches before its first use (after the
// previous group's region is gone), and, when a node of the group writes
// it (the optimizer update), copied back home after its last use, its
// region released `release_lag` launches later once that copy is done.
void ScheduleBuilder::plan_paged_groups() {
  bool any_paged = false;
  for (size_t t = 0; t < n_t && !any_paged; ++t) any_paged = touched[t] && paged(t);
  if (!any_paged) return;
  pg.resize(n_t);
  for (int sl = 0; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;  // writes the home itself
    const Node& nd = slot_node(sl);
    for (int m : slot_def(sl).mutates) {
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
// host slot after its last device use before its first host reader; its
// region is held `host_lag` launches more for the copy, and the compute
// stream waits for the copy before the region's next owner. Host and device
// readers may interleave (with clipping every update reads the norm, and
// the largest weights update on the host, the rest on the device): the
// copy goes out before the first host reader, since the host launches run
// in order behind it on the same stream, and no device node may write the
// tensor between its host readers.
void ScheduleBuilder::plan_host_copies() {
  host_lag = std::max(1, req.release_lag);
  host_copy_after.assign(n_t, -1);
  host_copy_until.assign(n_t, -1);
  host_read_until.assign(n_t, -1);
  std::vector<int> first_host_read(n_t, -1);
  for (int sl = 0; sl < n_slots; ++sl) {
    if (!runs_on_host(sl)) continue;
    for (TensorId x : slot_node(sl).inputs) {
      const auto r = static_cast<size_t>(root(x));
      if (host_out_at[r] >= 0) host_read_until[r] = sl;  // made on the host
      if (paged(r) || staged_input(r) || host_out_at[r] >= 0) continue;
      if (first_host_read[r] < 0) first_host_read[r] = sl;
      host_copy_until[r] = sl;
    }
  }
  for (int sl = 0; sl < n_slots; ++sl) {
    if (runs_on_host(sl)) continue;
    const Node& nd = slot_node(sl);
    const OpDef& def = op_registry().get(nd.op);
    for (size_t i = 0; i < nd.inputs.size() + nd.outputs.size(); ++i) {
      const bool output = i >= nd.inputs.size();
      const TensorId x = output ? nd.outputs[i - nd.inputs.size()] : nd.inputs[i];
      const auto r = static_cast<size_t>(root(x));
      if (first_host_read[r] < 0) continue;
      if (sl < first_host_read[r]) {
        host_copy_after[r] = sl;
      } else if (sl < host_copy_until[r] &&
                 (output || std::find(def.mutates.begin(), def.mutates.end(),
                                      static_cast<int>(i)) != def.mutates.end())) {
        throw Error(POOCH_ERR_INTERNAL,
                    fmt::format("'{}' is written on the device ({}) between its host readers",
                                g.tensor(static_cast<TensorId>(r)).name, nd.op));
      }
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
}

// One request per interval of a non-persistent root, and the byte tallies.
void ScheduleBuilder::request_buffers() {
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
    // Saved activations alone: those remade on the way are not in the
    // report's table of decisions.
    if (s.residency[t] == Residency::recompute && saved_of[t]->first_backward >= 0)
      s.recomputed_bytes += d.bytes();
    if (paged(t))
      for (const PagedGroup& G : pg[t]) {
        if (G.page_in >= 0) s.paged_in_bytes += d.bytes();
        if (G.page_in >= 0 && G.written) s.paged_out_bytes += d.bytes();
      }
  }
  // Every paged tensor lives at home, whether this program copies it in or
  // not (the optimizer state of an update on the host never comes in).
  for (size_t t = 0; t < n_t; ++t)
    if (paged(t)) s.paged_bytes += bytes_of(t);
}

// In place: an op allowed to overwrite an input that dies at that op (never
// a swapped tensor's first interval, which its copy out may still read, nor
// a tensor copied out for host readers, for the same reason: the compute
// stream waits for that copy only after the region's last slot).
void ScheduleBuilder::allow_in_place() {
  for (int sl = 0; sl < n_slots; ++sl) {
    const Slot& slot = slots[static_cast<size_t>(sl)];
    const Node& nd = slot_node(sl);
    const OpDef& def = slot_def(sl);
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
    if (host_copy_until[static_cast<size_t>(x)] >= 0) continue;
    // Element by element in place only where both lie the same way.
    if (pc.layouts[static_cast<size_t>(x)] != pc.layouts[static_cast<size_t>(y)]) continue;
    BufferRequest& rqx = reqs[static_cast<size_t>(ix.request)];
    BufferRequest& rqy = reqs[static_cast<size_t>(iy.request)];
    if (rqx.last != sl || rqy.first != sl || rqx.bytes < rqy.bytes) continue;
    rqy.inplace_of = ix.request;
  }
}

// Launches: kernel, arguments and workspace of every slot.
void ScheduleBuilder::make_launches() {
  host_ws.assign(static_cast<size_t>(n_slots), 0);
  for (int sl = 0; sl < n_slots; ++sl) {
    const Slot& slot = slots[static_cast<size_t>(sl)];
    const int ni = req.nodes[static_cast<size_t>(slot.pos)];
    const Node& nd = slot_node(sl);
    s.launch_node.push_back(ni);
    s.launch_replay.push_back(slot.replay ? 1 : 0);
    const bool host = runs_on_host(sl);
    std::vector<Launch>* cached =
        cache ? slot.replay ? &cache->replay_launch : &cache->launch : nullptr;
    if (!host && cached && cached->size() == nodes.size() &&
        (*cached)[static_cast<size_t>(ni)].kernel) {
      const Launch& l = (*cached)[static_cast<size_t>(ni)];
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
    a = args_of(nd, ni);
    if (host) a.device = nullptr;
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
    if (host && !def_at(slot.pos).mutates.empty()) ++s.host_updates;
    if (cached && !host) {
      cached->resize(nodes.size());
      (*cached)[static_cast<size_t>(ni)] = l;
    }
  }
}

// The arena: the transient requests above the persistent region; every
// tensor's offset, and each device launch's operand offsets.
void ScheduleBuilder::place_on_device() {
  const size_t align = layout.alignment;
  s.transient = plan_arena(reqs, align);
  base = align_up(layout.persistent.peak, align);
  s.arena_bytes = base + s.transient.peak;
  s.tensor_offset.assign(n_t, kUnplaced);
  for (size_t t = 0; t < n_t; ++t) {
    const auto r = static_cast<size_t>(pc.root[t]);
    if (layout.device_offset[r] != kUnplaced)
      s.tensor_offset[t] = layout.device_offset[r];
    else if (A[r].request >= 0)
      s.tensor_offset[t] = offset_of(A[r]);
    else if (B[r].request >= 0)
      s.tensor_offset[t] = offset_of(B[r]);  // a paged tensor the backward part alone uses
    else if (C[r].request >= 0)
      s.tensor_offset[t] = offset_of(C[r]);
  }
  if (candidate) return;
  auto device_offset = [&](TensorId x, int sl, bool written) {
    const auto r = static_cast<size_t>(root(x));
    if (layout.device_offset[r] != kUnplaced) return layout.device_offset[r];
    const bool remake = written && slots[static_cast<size_t>(sl)].target != kNoTensor;
    return offset_of(remake ? B[r] : interval(x, sl));
  };
  for (int sl = 0; sl < n_slots; ++sl) {
    Launch& l = s.launches[static_cast<size_t>(sl)];
    if (l.on_host) continue;  // host pool offsets, in place_on_host
    const Node& nd = slot_node(sl);
    for (int j = 0; j < l.args.n_in; ++j)
      l.in_offset[j] = device_offset(nd.inputs[static_cast<size_t>(j)], sl, false);
    for (int j = 0; j < l.args.n_out; ++j)
      l.out_offset[j] = device_offset(nd.outputs[static_cast<size_t>(j)], sl, true);
    if (l.args.workspace_bytes)
      l.workspace_offset =
          base + s.transient.offsets[static_cast<size_t>(ws_req[static_cast<size_t>(sl)])];
  }
}

// The host pool, above the session's staging slots: swap slots, copies of
// what host updates read from the device, what host nodes make, and host
// workspaces; then each host launch's operand offsets.
void ScheduleBuilder::place_on_host() {
  const size_t align = layout.alignment;
  std::vector<BufferRequest> host_reqs;
  std::vector<TensorId> host_ids;
  for (size_t t = 0; t < n_t; ++t) {
    if (s.residency[t] != Residency::swap) continue;
    host_reqs.push_back(
        {bytes_of(t), slot_of_pos[static_cast<size_t>(saved_of[t]->producer)], back_at[t],
         Role::activation, -1,
         names ? "swap slot of " + g.tensor(static_cast<TensorId>(t)).name : std::string()});
    host_ids.push_back(static_cast<TensorId>(t));
  }
  // What host updates read from the device, from its copy out to the last
  // host update that reads it.
  const size_t n_swap_slots = host_reqs.size();
  for (size_t t = 0; t < n_t; ++t) {
    if (host_copy_until[t] < 0) continue;
    host_reqs.push_back(
        {bytes_of(t), host_copy_after[t], host_copy_until[t], Role::gradient, -1,
         names ? "host copy of " + g.tensor(static_cast<TensorId>(t)).name : std::string()});
    host_ids.push_back(static_cast<TensorId>(t));
    s.host_update_copy_bytes += bytes_of(t);
  }
  const size_t n_copy_slots = host_reqs.size();
  for (size_t t = 0; t < n_t; ++t) {
    if (host_out_at[t] < 0) continue;
    host_reqs.push_back(
        {bytes_of(t), host_out_at[t],
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
  host_slot.assign(n_t, kUnplaced);
  host_copy.assign(n_t, kUnplaced);
  host_out.assign(n_t, kUnplaced);
  for (size_t i = 0; i < host_ids.size(); ++i)
    (i < n_swap_slots   ? host_slot
     : i < n_copy_slots ? host_copy
                        : host_out)[static_cast<size_t>(host_ids[i])] =
        host_base + host_plan.offsets[i];
  if (candidate) return;
  std::vector<size_t> host_ws_offset(static_cast<size_t>(n_slots), kUnplaced);
  for (size_t i = 0; i < host_ws_slot.size(); ++i)
    host_ws_offset[static_cast<size_t>(host_ws_slot[i])] =
        host_base + host_plan.offsets[n_out_slots + i];
  // A host launch's operands: a paged tensor at home, anything else at its
  // host copy.
  for (int sl = 0; sl < n_slots; ++sl) {
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
}

// Per slot, the copies around its launch, in tensor order, so plans stay
// deterministic; one pass over the tensors instead of one per slot.
void ScheduleBuilder::collect_traffic() {
  before_slot.assign(static_cast<size_t>(n_slots), {});
  after_slot.assign(static_cast<size_t>(n_slots), {});
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
}

// Steps: inputs in; per slot, the swap, paging and host traffic around its
// launch; outputs back.
void ScheduleBuilder::emit_steps() {
  for (TensorId t : s.copied_in)
    s.add_copy(StepKind::copy_in, Stream::h2d,
               {t, offset_of(A[static_cast<size_t>(t)]), layout.host_offset[static_cast<size_t>(t)],
                g.tensor(t).bytes()});
  if (!s.copied_in.empty()) sync(Stream::h2d, Stream::compute);
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
        sync(Stream::compute, Stream::h2d);
        s.steps.push_back({StepKind::wait, Stream::h2d, host_done[host_out_at[t]]});
        in_done[t] = copy(StepKind::copy_in, Stream::h2d,
                          {static_cast<TensorId>(t), offset_of(A[t]), host_out[t], bytes_of(t)});
        continue;
      }
      const bool swap_in = x.group == kSwap && prefetch[t] == sl;
      const bool page_in = x.group >= 0 && pg[t][static_cast<size_t>(x.group)].page_in == sl;
      if (!swap_in && !page_in) continue;
      sync(Stream::compute, Stream::h2d);  // the landing region is free
      if (swap_in)
        in_done[t] = copy(StepKind::copy_in, Stream::h2d,
                          {static_cast<TensorId>(t), offset_of(B[t]), host_slot[t], bytes_of(t)});
      else
        paged_in_done[3 * t + static_cast<size_t>(x.group)] =
            copy(StepKind::copy_in, Stream::h2d,
                 {static_cast<TensorId>(t), offset_of(group_interval(t, x.group)),
                  layout.home_offset[t], bytes_of(t)});
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
      sync(Stream::compute, Stream::d2h);
      s.steps.push_back({StepKind::launch, Stream::d2h, sl});
      host_done[static_cast<size_t>(sl)] = s.add_event();
      s.steps.push_back({StepKind::record, Stream::d2h, host_done[static_cast<size_t>(sl)]});
    } else {
      s.steps.push_back({StepKind::launch, Stream::compute, sl});
    }
    for (const Traffic& x : after_slot[static_cast<size_t>(sl)]) {
      const size_t t = x.t;
      sync(Stream::compute, Stream::d2h);  // the tensor is made
      const TensorId tt = static_cast<TensorId>(t);
      if (x.group == kHostCopy) {
        const size_t from = layout.device_offset[t] != kUnplaced
                                ? layout.device_offset[t]
                                : offset_of(interval(tt, host_copy_after[t]));
        host_copy_done[t] =
            copy(StepKind::copy_out, Stream::d2h, {tt, from, host_copy[t], bytes_of(t)});
      } else if (x.group == kSwap) {
        out_done[t] =
            copy(StepKind::copy_out, Stream::d2h, {tt, offset_of(A[t]), host_slot[t], bytes_of(t)});
      } else {
        // The updated weight or state goes back home.
        paged_out_done[3 * t + static_cast<size_t>(x.group)] =
            copy(StepKind::copy_out, Stream::d2h,
                 {tt, offset_of(group_interval(t, x.group)), layout.home_offset[t], bytes_of(t)});
      }
    }
  }
  s.transient_requests = std::move(reqs);
  s.copied_out = req.outputs;
  if (!s.copied_out.empty()) {
    sync(Stream::compute, Stream::d2h);
    for (TensorId t : s.copied_out)
      s.add_copy(StepKind::copy_out, Stream::d2h,
                 {t, s.tensor_offset[static_cast<size_t>(t)],
                  layout.host_offset[static_cast<size_t>(t)], g.tensor(t).bytes()});
  }
}

}  // namespace

std::vector<kern::Layout> program_layouts(const Graph& g, const ProgramRequest& req,
                                          const Backend& backend, const SessionLayout& layout,
                                          const PlanOptions& opt) {
  return ScheduleBuilder(g, req, backend, layout, opt, nullptr).layouts();
}

Schedule plan_schedule(const Graph& g, const ProgramRequest& req, const Backend& backend,
                       const SessionLayout& layout, const PlanOptions& opt, PlanCache* cache) {
  return ScheduleBuilder(g, req, backend, layout, opt, cache).build();
}

}  // namespace pooch
