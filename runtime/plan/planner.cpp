#include "planner.h"

#include <fmt/format.h>

#include <algorithm>

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
                                  size_t alignment) {
  SessionLayout l;
  l.alignment = alignment;
  const size_t n_t = g.num_tensors();
  std::vector<BufferRequest> dev, host;
  std::vector<TensorId> dev_ids, host_ids;
  for (size_t t = 0; t < n_t; ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (!persistent(d)) continue;
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
  for (size_t i = 0; i < dev_ids.size(); ++i)
    l.device_offset[static_cast<size_t>(dev_ids[i])] = l.persistent.offsets[i];
  for (size_t i = 0; i < host_ids.size(); ++i)
    l.host_offset[static_cast<size_t>(host_ids[i])] = l.host.offsets[i];
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
  std::vector<int> out;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (need_n[i]) out.push_back(static_cast<int>(i));
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

Schedule plan_schedule(const Graph& g, const ProgramRequest& req, const Backend& backend,
                       const SessionLayout& layout, const PlanOptions& opt) {
  const auto& nodes = g.nodes();
  const size_t n_t = g.num_tensors();
  const int n_pos = static_cast<int>(req.nodes.size());
  Schedule s;
  s.training = req.training;

  // Views share their input's buffer: every tensor maps to the root it aliases.
  std::vector<TensorId> root(n_t);
  for (size_t t = 0; t < n_t; ++t) root[t] = static_cast<TensorId>(t);
  std::vector<char> is_view(static_cast<size_t>(n_pos), 0);
  for (int p = 0; p < n_pos; ++p) {
    const Node& nd = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
    if (!runs_as_view(g, nd)) continue;
    is_view[static_cast<size_t>(p)] = 1;
    root[static_cast<size_t>(nd.outputs[0])] = root[static_cast<size_t>(nd.inputs[0])];
  }

  // Live intervals of the roots over the program's positions.
  std::vector<int> first(n_t, -1), last(n_t, -1);
  std::vector<char> written(n_t, 0), touched(n_t, 0);
  for (int p = 0; p < n_pos; ++p) {
    const Node& nd = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
    for (TensorId x : nd.inputs) {
      const auto r = static_cast<size_t>(root[static_cast<size_t>(x)]);
      last[r] = std::max(last[r], p);
      touched[static_cast<size_t>(x)] = 1;
    }
    for (TensorId o : nd.outputs) {
      const auto r = static_cast<size_t>(root[static_cast<size_t>(o)]);
      if (first[r] < 0) first[r] = p;
      last[r] = std::max(last[r], p);
      written[static_cast<size_t>(o)] = 1;
      touched[static_cast<size_t>(o)] = 1;
    }
  }
  for (TensorId o : req.outputs) {
    const TensorDesc& d = g.tensor(o);
    if (!written[static_cast<size_t>(o)] && d.role != Role::input && !persistent(d))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("output '{}' is not computed by this program", d.name));
    if (layout.host_offset[static_cast<size_t>(o)] == kUnplaced)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("output '{}' has no host staging slot in this session", d.name));
    touched[static_cast<size_t>(o)] = 1;
    last[static_cast<size_t>(root[static_cast<size_t>(o)])] = kLiveForever;
  }

  // One request per non-persistent root the program touches.
  std::vector<BufferRequest> reqs;
  std::vector<int> req_of(n_t, -1);
  for (size_t t = 0; t < n_t; ++t) {
    if (!touched[t] || root[t] != static_cast<TensorId>(t)) continue;
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (persistent(d)) continue;
    BufferRequest r;
    r.bytes = d.bytes();
    r.role = d.role;
    r.name = d.name;
    if (d.role == Role::input) {
      r.first = 0;  // copied in before the first launch
      s.copied_in.push_back(static_cast<TensorId>(t));
      if (layout.host_offset[t] == kUnplaced)
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("input '{}' has no host staging slot in this session", d.name));
    } else {
      if (first[t] < 0)
        throw Error(POOCH_ERR_INTERNAL,
                    fmt::format("tensor '{}' is read by the program but nothing in it writes it",
                                d.name));
      r.first = first[t];
    }
    r.last = last[t] == kLiveForever ? kLiveForever : std::max(r.first, last[t]);
    req_of[t] = static_cast<int>(reqs.size());
    reqs.push_back(r);
  }
  // In place: an op allowed to overwrite an input that dies at that op.
  for (int p = 0; p < n_pos; ++p) {
    if (is_view[static_cast<size_t>(p)]) continue;
    const Node& nd = nodes[static_cast<size_t>(req.nodes[static_cast<size_t>(p)])];
    const OpDef& def = op_registry().get(nd.op);
    if (def.inplace_input < 0 || nd.outputs.empty()) continue;
    const auto x = static_cast<size_t>(root[static_cast<size_t>(nd.inputs[static_cast<size_t>(def.inplace_input)])]);
    const auto y = static_cast<size_t>(root[static_cast<size_t>(nd.outputs[0])]);
    const Role rx = g.tensor(static_cast<TensorId>(x)).role;
    if (rx != Role::activation && rx != Role::gradient) continue;
    if (req_of[x] < 0 || req_of[y] < 0) continue;
    BufferRequest& rqx = reqs[static_cast<size_t>(req_of[x])];
    BufferRequest& rqy = reqs[static_cast<size_t>(req_of[y])];
    if (rqx.last != p || rqy.first != p || rqx.bytes < rqy.bytes) continue;
    rqy.inplace_of = req_of[x];
  }

  // Launches: kernel, arguments and workspace of every node that is not a view.
  std::vector<int> ws_req;
  for (int p = 0; p < n_pos; ++p) {
    if (is_view[static_cast<size_t>(p)]) continue;
    const int ni = req.nodes[static_cast<size_t>(p)];
    const Node& nd = nodes[static_cast<size_t>(ni)];
    Launch l;
    l.node = ni;
    kern::KernelArgs& a = l.args;
    if (nd.inputs.size() > kern::kMaxOperands || nd.outputs.size() > kern::kMaxOperands)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("op '{}' (node {}) has more than {} operands", nd.op, ni,
                              kern::kMaxOperands));
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
    a.device = backend.kernel_device();
    l.kernel = &choose_kernel(backend, nd, a, opt.deterministic);
    a.workspace_bytes = l.kernel->workspace ? l.kernel->workspace(a) : 0;
    ws_req.push_back(static_cast<int>(reqs.size()));
    reqs.push_back({a.workspace_bytes, p, p, Role::activation, -1,
                    fmt::format("workspace of node {} ({})", ni, nd.op)});
    s.launches.push_back(l);
  }

  const size_t align = layout.alignment;
  s.transient = plan_arena(reqs, align);
  const size_t base = (layout.persistent.peak + align - 1) / align * align;
  s.arena_bytes = base + s.transient.peak;
  s.tensor_offset.assign(n_t, kUnplaced);
  for (size_t t = 0; t < n_t; ++t) {
    const auto r = static_cast<size_t>(root[t]);
    if (layout.device_offset[r] != kUnplaced)
      s.tensor_offset[t] = layout.device_offset[r];
    else if (req_of[r] >= 0)
      s.tensor_offset[t] = base + s.transient.offsets[static_cast<size_t>(req_of[r])];
  }
  for (size_t i = 0; i < s.launches.size(); ++i) {
    Launch& l = s.launches[i];
    const Node& nd = nodes[static_cast<size_t>(l.node)];
    for (int j = 0; j < l.args.n_in; ++j)
      l.in_offset[j] = s.tensor_offset[static_cast<size_t>(nd.inputs[static_cast<size_t>(j)])];
    for (int j = 0; j < l.args.n_out; ++j)
      l.out_offset[j] = s.tensor_offset[static_cast<size_t>(nd.outputs[static_cast<size_t>(j)])];
    if (l.args.workspace_bytes)
      l.workspace_offset = base + s.transient.offsets[static_cast<size_t>(ws_req[i])];
  }

  // Steps: inputs in, kernels, outputs back.
  if (!s.copied_in.empty()) {
    for (TensorId t : s.copied_in) s.steps.push_back({StepKind::copy_in, Stream::h2d, t});
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, Stream::h2d, e});
    s.steps.push_back({StepKind::wait, Stream::compute, e});
  }
  for (size_t i = 0; i < s.launches.size(); ++i)
    s.steps.push_back({StepKind::launch, Stream::compute, static_cast<int32_t>(i)});
  s.copied_out = req.outputs;
  if (!s.copied_out.empty()) {
    const int e = s.add_event();
    s.steps.push_back({StepKind::record, Stream::compute, e});
    s.steps.push_back({StepKind::wait, Stream::d2h, e});
    for (TensorId t : s.copied_out) s.steps.push_back({StepKind::copy_out, Stream::d2h, t});
  }
  return s;
}

}  // namespace pooch
