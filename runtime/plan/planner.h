// Turns (graph, program, backend, layout) into a Schedule. The planner makes
// every decision the executor used to make in its constructor: which kernel
// variant runs each node (asking each variant whether it supports the
// operands), where each buffer lives (plan_arena over exact live intervals,
// in place where an op allows, views aliased), which inputs are copied in and
// which outputs are copied back, and the events between streams.
#pragma once
#include <vector>

#include "../backend/backend.h"
#include "../core/graph.h"
#include "../memory/arena_plan.h"
#include "schedule.h"

namespace pooch {

// Where the tensors that outlive a program live: weights and optimizer state
// at the bottom of the arena (the persistent region, the same for every
// program), and a host staging slot for every input and output.
struct SessionLayout {
  ArenaPlan persistent;               // its peak is the persistent region's size
  std::vector<size_t> device_offset;  // per tensor: its persistent offset, or kUnplaced
  ArenaPlan host;                     // the host pool
  std::vector<size_t> host_offset;    // per tensor: its staging slot, or kUnplaced
  // Per tensor: the host slot that is the home of a paged weight or
  // optimizer state (it has no device offset: each program copies it in
  // before its uses and, when it writes it, back home after), or kUnplaced.
  std::vector<size_t> home_offset;
  // Per tensor: a paged weight whose optimizer update runs on the host, where
  // it and its state live (ZeRO-Offload): its gradient is copied out to the
  // host pool, and the update runs there as a host kernel on the d2h stream.
  // Its optimizer state never comes to the device. Empty: none.
  std::vector<char> host_update;
  // Per tensor: the layout a weight or optimizer state lies in, in the arena
  // and at home alike (kern::Layout; layouts.h, persistent_layouts), for every
  // program. Empty: each program chooses (program_layouts asks that way).
  std::vector<kern::Layout> layouts;
  size_t alignment = 256;
  bool paged(TensorId t) const {
    return !home_offset.empty() && home_offset[static_cast<size_t>(t)] != kUnplaced;
  }
  bool updated_on_host(TensorId t) const {
    return !host_update.empty() && host_update[static_cast<size_t>(t)] != 0;
  }
};

// `staged`: the tensors that get a host slot (inputs and readable outputs).
// `paged` (per tensor, may be empty): weights and optimizer states whose home
// is the host pool instead of the persistent region.
SessionLayout plan_session_layout(const Graph& g, const std::vector<TensorId>& staged,
                                  size_t alignment, const std::vector<char>& paged = {});

// The nodes needed to compute `wanted`, plus (with `with_updates`) every
// node that writes into its inputs (optimizer updates) and what they need; in
// graph order.
std::vector<int> select_nodes(const Graph& g, const std::vector<TensorId>& wanted,
                              bool with_updates);

struct ProgramRequest {
  std::vector<int> nodes;         // in execution order
  std::vector<TensorId> outputs;  // copied back to their host slots after the last launch
  bool training = false;
  // Out of core. `split`: the program position of the last forward node (the
  // loss); activations made up to it and read after it are "saved". -1: none.
  int split = -1;
  // Per tensor (empty: keep all): what to do with each saved activation in the
  // gap between its last forward use and its first backward use. The planner
  // keeps what cannot be swapped or recomputed (views, outputs, multi-output
  // producers for recompute).
  std::vector<Residency> residency;
  // A swapped tensor's region is released this many launches after its last
  // forward use (time for the copy out), and it is prefetched this many
  // launches before its first backward use (time for the copy in).
  int release_lag = 1;
  int prefetch_lead = 1;
  // A recompute remakes the never-saved activations it reads (saved_activations'
  // `through`) just before, instead of keeping them from the forward pass.
  // Remaking frees their bytes for the gap at their producers' cost; keeping
  // costs nothing where memory allows (the out-of-core search tries both).
  bool remake_unsaved = true;
};

// The program computing `wanted` (select_nodes' nodes, with the updates when
// `training`), in graph order.
ProgramRequest program_request(const Graph& g, const std::vector<TensorId>& wanted, bool training);

// A tensor of a program that may leave the device for a gap in its uses: an
// activation made at or before the split and read after it, or a gradient
// that waits for its update (with gradient clipping, until every gradient's
// norm is known). A gradient is swapped or kept, never recomputed.
struct SavedActivation {
  TensorId tensor = kNoTensor;
  int producer = -1;      // program position of the node that makes it
  int last_forward = -1;  // its last use before the gap (at or before the split, for an activation)
  int first_backward = -1;  // its first use after the gap
  // A producer that may run again (one output, writes no input), or whose
  // replay remakes this output (OpDef::replay).
  bool recomputable = false;
  bool gradient = false;  // a gradient, not an activation
  size_t bytes = 0;
};
std::vector<SavedActivation> saved_activations(const Graph& g, const ProgramRequest& req);

struct PlanOptions {
  bool deterministic = true;  // only bitwise-reproducible kernels; none for an op is an error
  // Activations in a blocked layout where the kernels around them take it
  // (layouts.h); false: every tensor plain.
  bool blocked_layouts = true;
};

// What plan_schedule may reuse between calls on the same graph, program
// nodes and backend (the out-of-core search plans one step hundreds of
// times): each node's launch (kernel choice, arguments, workspace), which
// depends on nothing the search changes. `names`: false leaves the buffer
// requests' names empty (they are for reports; the search's candidates need
// none, and building them is a measurable share of a plan).
struct OpDef;
struct PlanCache {
  PlanCache() = default;
  explicit PlanCache(bool for_candidates) : candidate(for_candidates) {}
  std::vector<Launch> launch;  // per graph node; kernel == nullptr: not made yet
  // A search candidate: only what the simulator and the budget check read
  // (steps, copies, launch_node, the placement's peak); no buffer names, no
  // launch arguments (`launches` stays empty), no operand offsets.
  bool candidate = false;
  // Facts of the program that no residency changes, made by the first call
  // (the cache belongs to one program: the same nodes, split and outputs):
  // the root each tensor aliases, which positions run as views, which roots
  // views alias, its saved activations, and each position's op.
  bool facts = false;
  std::vector<TensorId> root;
  std::vector<char> is_view, has_alias;
  std::vector<SavedActivation> saved;
  // Activations a recompute remakes on its way (saved_activations' `through`).
  std::vector<SavedActivation> through;
  std::vector<const OpDef*> def;
  // Per program position: what a recompute of its output launches
  // (recompute_node), for the positions that replay instead of running again.
  std::vector<Node> replay;
  std::vector<const OpDef*> replay_def;
  std::vector<Launch> replay_launch;  // per graph node, as `launch`
  // Per tensor: the layout it lies in (layouts.h; a view's is its root's).
  std::vector<kern::Layout> layouts;
};

// The first of these kernels for node's op that supports `args` (and is
// deterministic when asked); null where none does.
const kern::KernelVariant* find_kernel(std::span<const kern::KernelVariant> kernels,
                                       const Node& node, const kern::KernelArgs& args,
                                       bool deterministic);

// The first kernel variant of the backend for this op that supports `args`
// (and is deterministic when asked). Throws Error(POOCH_ERR_UNSUPPORTED)
// naming the op, the operand shapes and the backend when there is none.
const kern::KernelVariant& choose_kernel(const Backend& b, const Node& node,
                                         const kern::KernelArgs& args, bool deterministic);

// The same among the backend's host kernels (an update where its state lives).
const kern::KernelVariant& choose_host_kernel(const Backend& b, const Node& node,
                                              const kern::KernelArgs& args, bool deterministic);

// The layout plan_schedule lays each of the program's tensors out in
// (layouts.h): only the program's facts are made, nothing is placed.
std::vector<kern::Layout> program_layouts(const Graph& g, const ProgramRequest& req,
                                          const Backend& backend, const SessionLayout& layout,
                                          const PlanOptions& opt);

// Throws Error(POOCH_ERR_INVALID_ARG) when an output is not produced by the
// program or staged, and the errors of choose_kernel.
Schedule plan_schedule(const Graph& g, const ProgramRequest& req, const Backend& backend,
                       const SessionLayout& layout, const PlanOptions& opt,
                       PlanCache* cache = nullptr);

// Whether node `i` runs as a view (its output aliases its input; no launch).
bool runs_as_view(const Graph& g, const Node& n);

}  // namespace pooch
