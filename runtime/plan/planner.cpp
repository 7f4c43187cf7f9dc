#include "planner.h"

#include <fmt/format.h>

#include <algorithm>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"
#include "program_facts.h"

namespace pooch {

namespace {

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
  std::vector<BufferRequest> dev, homes, staging;
  std::vector<TensorId> dev_ids, host_ids;
  std::vector<TensorId> home_ids;
  for (size_t t = 0; t < n_t; ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (!persistent(d)) continue;
    if (t < paged.size() && paged[t]) {
      homes.push_back({d.bytes(), 0, kLiveForever, d.role, -1, "home of " + d.name});
      home_ids.push_back(static_cast<TensorId>(t));
      continue;
    }
    dev.push_back({d.bytes(), 0, kLiveForever, d.role, -1, d.name});
    dev_ids.push_back(static_cast<TensorId>(t));
  }
  for (TensorId t : staged) {
    if (std::find(host_ids.begin(), host_ids.end(), t) != host_ids.end()) continue;
    const TensorDesc& d = g.tensor(t);
    staging.push_back({d.bytes(), 0, kLiveForever, d.role, -1, "staging of " + d.name});
    host_ids.push_back(t);
  }
  l.persistent = plan_arena(dev, alignment);
  // The staging slots first, the homes after them: a staging slot's offset
  // does not depend on what is paged, so a session that changes its paging
  // (Session::repage_from_measured) keeps its inputs and outputs in place.
  l.host = plan_arena(staging, alignment);
  const ArenaPlan home_plan = plan_arena(homes, alignment);
  const size_t home_base = home_ids.empty() ? 0 : align_up(l.host.peak, alignment);
  for (size_t off : home_plan.offsets) l.host.offsets.push_back(home_base + off);
  if (!home_ids.empty()) l.host.peak = home_base + home_plan.peak;
  l.host.live_peak += home_plan.live_peak;
  for (int r = 0; r < kNumRoles; ++r) l.host.bytes_by_role[r] += home_plan.bytes_by_role[r];
  l.device_offset.assign(n_t, kUnplaced);
  l.host_offset.assign(n_t, kUnplaced);
  l.home_offset.assign(n_t, kUnplaced);
  for (size_t i = 0; i < dev_ids.size(); ++i)
    l.device_offset[static_cast<size_t>(dev_ids[i])] = l.persistent.offsets[i];
  for (size_t i = 0; i < host_ids.size(); ++i)
    l.host_offset[static_cast<size_t>(host_ids[i])] = l.host.offsets[i];
  for (size_t i = 0; i < home_ids.size(); ++i)
    l.home_offset[static_cast<size_t>(home_ids[i])] = l.host.offsets[host_ids.size() + i];
  return l;
}

ProgramRequest program_request(const Graph& g, const std::vector<TensorId>& wanted, bool training) {
  ProgramRequest rq;
  rq.nodes = select_nodes(g, wanted, training);
  rq.outputs = wanted;
  rq.training = training;
  return rq;
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
  return def.view(node_operands(g, n).in, n.attrs);
}

const kern::KernelVariant* find_kernel(std::span<const kern::KernelVariant> kernels,
                                       const Node& node, const kern::KernelArgs& args,
                                       bool deterministic) {
  for (const kern::KernelVariant& k : kernels)
    if (node.op == k.op && (!k.supports || k.supports(args)) && (!deterministic || k.deterministic))
      return &k;
  return nullptr;
}

const kern::KernelVariant& choose_kernel(const Backend& b, const Node& node,
                                         const kern::KernelArgs& args, bool deterministic) {
  if (const kern::KernelVariant* k = find_kernel(b.kernels(), node, args, deterministic)) return *k;
  // Why there is none.
  bool any = false, supported = false;
  for (const kern::KernelVariant& k : b.kernels()) {
    if (node.op != k.op) continue;
    any = true;
    if (k.supports && !k.supports(args)) continue;
    supported = true;
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
  if (const kern::KernelVariant* k = find_kernel(b.host_kernels(), node, args, deterministic))
    return *k;
  throw Error(POOCH_ERR_UNSUPPORTED,
              fmt::format("the {} backend has no host kernel for op '{}' with the operands {}",
                          b.name(), node.op, operands_str(args)));
}

}  // namespace pooch
