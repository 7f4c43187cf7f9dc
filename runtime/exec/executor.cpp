#include "executor.h"

#include <fmt/format.h>

#include <algorithm>

#include "../core/error.h"
#include "../core/op_registry.h"

namespace pooch {

namespace {

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

kern::TensorView view_of(const TensorDesc& d, std::byte* data) {
  kern::TensorView v;
  v.data = data;
  v.dtype = d.dtype;
  v.ndim = static_cast<int>(d.shape.size());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = d.shape[static_cast<size_t>(i)];
  return v;
}

}  // namespace

Executor::Executor(const Graph& g, Backend& backend, const ExecutorParams& p)
    : graph_(g), backend_(backend), params_(p) {
  ctx_.seed = p.seed;
  ctx_.step = 0;
  ctx_.threads = std::max(1, p.threads);
  const auto& nodes = g.nodes();
  const size_t n_t = g.num_tensors();
  const size_t n_nodes = nodes.size();

  // Kernels first: their workspaces are part of the arena plan.
  kernels_.resize(n_nodes);
  args_.resize(n_nodes);
  for (size_t i = 0; i < n_nodes; ++i) {
    const Node& nd = nodes[i];
    const kern::KernelVariant* k = backend.find_kernel(nd.op, {}, p.deterministic);
    if (!k && p.deterministic) k = backend.find_kernel(nd.op);
    if (!k)
      throw Error(POOCH_ERR_UNSUPPORTED,
                  fmt::format("the {} backend has no kernel for op '{}' (node {})", backend.name(),
                              nd.op, i));
    kernels_[i] = k;
    kern::KernelArgs& a = args_[i];
    a.n_in = static_cast<int>(nd.inputs.size());
    a.n_out = static_cast<int>(nd.outputs.size());
    for (int j = 0; j < a.n_in; ++j)
      a.in[j] = view_of(g.tensor(nd.inputs[static_cast<size_t>(j)]), nullptr);
    for (int j = 0; j < a.n_out; ++j)
      a.out[j] = view_of(g.tensor(nd.outputs[static_cast<size_t>(j)]), nullptr);
    for (const auto& [name, value] : nd.attrs.items())
      if (!a.attrs.set(name.c_str(), value))
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("op '{}' (node {}): too many attributes or attribute name '{}' "
                                "longer than 23 characters",
                                nd.op, i, name));
    a.workspace_bytes = k->workspace ? k->workspace(a) : 0;
    a.ctx = &ctx_;
  }

  // Live intervals over the node order.
  std::vector<int> first(n_t, -1), last(n_t, -1);
  for (size_t i = 0; i < n_nodes; ++i) {
    for (TensorId x : nodes[i].inputs) last[static_cast<size_t>(x)] = static_cast<int>(i);
    for (TensorId o : nodes[i].outputs)
      if (first[static_cast<size_t>(o)] < 0) first[static_cast<size_t>(o)] = static_cast<int>(i);
  }
  std::vector<BufferRequest> req;
  req.reserve(n_t + n_nodes);
  for (size_t t = 0; t < n_t; ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    BufferRequest r;
    r.bytes = d.bytes();
    r.role = d.role;
    r.name = d.name;
    const bool persistent = d.role == Role::weight || d.role == Role::optimizer_state;
    const bool is_output = std::find(g.outputs().begin(), g.outputs().end(),
                                     static_cast<TensorId>(t)) != g.outputs().end();
    if (persistent) {
      r.first = 0;
      r.last = kLiveForever;
    } else if (d.role == Role::input) {
      r.first = 0;  // copied in before the first kernel
      r.last = is_output ? kLiveForever : std::max(0, last[t]);
    } else {
      r.first = std::max(0, first[t]);
      r.last = is_output ? kLiveForever : std::max(r.first, last[t]);
    }
    req.push_back(r);
  }
  // In place: an op allowed to overwrite an input that dies at that op.
  for (size_t i = 0; i < n_nodes; ++i) {
    const OpDef& def = op_registry().get(nodes[i].op);
    if (def.inplace_input < 0 || nodes[i].outputs.empty()) continue;
    const auto x = static_cast<size_t>(nodes[i].inputs[static_cast<size_t>(def.inplace_input)]);
    const auto y = static_cast<size_t>(nodes[i].outputs[0]);
    const TensorDesc& dx = g.tensor(static_cast<TensorId>(x));
    if (dx.role != Role::activation && dx.role != Role::gradient) continue;
    if (req[x].last != static_cast<int>(i) || req[x].bytes < req[y].bytes) continue;
    req[y].inplace_of = static_cast<int>(x);
  }
  for (size_t i = 0; i < n_nodes; ++i) {
    BufferRequest r;
    r.bytes = args_[i].workspace_bytes;
    r.first = r.last = static_cast<int>(i);
    r.role = Role::activation;
    r.name = fmt::format("workspace of node {} ({})", i, nodes[i].op);
    req.push_back(r);
  }

  const size_t align = backend.caps().alignment;
  plan_ = plan_arena(req, align);
  const size_t budget = p.budget ? p.budget : backend.memory_info().budget;
  if (budget) check_budget(plan_, budget);
  backend.arena_reserve(std::max<size_t>(plan_.peak, align));
  std::byte* base = backend.arena_base();

  tensor_offset_.assign(plan_.offsets.begin(), plan_.offsets.begin() + static_cast<long>(n_t));
  for (size_t i = 0; i < n_nodes; ++i) {
    kern::KernelArgs& a = args_[i];
    for (int j = 0; j < a.n_in; ++j)
      a.in[j].data = device_ptr(nodes[i].inputs[static_cast<size_t>(j)]);
    for (int j = 0; j < a.n_out; ++j)
      a.out[j].data = device_ptr(nodes[i].outputs[static_cast<size_t>(j)]);
    a.workspace = a.workspace_bytes ? base + plan_.offsets[n_t + i] : nullptr;
  }

  // Host staging: one slot per input and per output.
  staging_offset_.assign(n_t, SIZE_MAX);
  size_t host_bytes = 0;
  auto stage = [&](TensorId t) {
    if (staging_offset_[static_cast<size_t>(t)] != SIZE_MAX) return;
    staging_offset_[static_cast<size_t>(t)] = host_bytes;
    host_bytes = align_up(host_bytes + g.tensor(t).bytes(), align);
  };
  for (size_t t = 0; t < n_t; ++t)
    if (g.tensor(static_cast<TensorId>(t)).role == Role::input) {
      inputs_.push_back(static_cast<TensorId>(t));
      stage(static_cast<TensorId>(t));
    }
  for (TensorId o : g.outputs()) stage(o);
  backend.host_pool_reserve(std::max(host_bytes, align));
  std::memset(backend.host_pool_base(), 0, host_bytes);

  inputs_ready_ = backend.event_create();
  compute_done_ = backend.event_create();
}

Executor::~Executor() {
  try {
    backend_.sync_all();
  } catch (...) {
    // A destructor must not throw; the error was reported by the run that raised it.
  }
}

std::byte* Executor::device_ptr(TensorId t) const {
  return backend_.arena_base() + tensor_offset_[static_cast<size_t>(t)];
}

Program Executor::program(const std::vector<TensorId>& wanted, bool with_updates) const {
  const auto& nodes = graph_.nodes();
  std::vector<char> need_t(graph_.num_tensors(), 0), need_n(nodes.size(), 0);
  for (TensorId t : wanted) need_t[static_cast<size_t>(t)] = 1;
  for (size_t i = nodes.size(); i-- > 0;) {
    bool keep = with_updates && !op_registry().get(nodes[i].op).mutates.empty();
    for (TensorId o : nodes[i].outputs) keep = keep || need_t[static_cast<size_t>(o)];
    if (!keep) continue;
    need_n[i] = 1;
    for (TensorId x : nodes[i].inputs) need_t[static_cast<size_t>(x)] = 1;
  }
  Program p;
  p.is_training = with_updates;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (need_n[i]) p.nodes.push_back(static_cast<int>(i));
  return p;
}

void* Executor::input_staging(TensorId t) {
  const size_t off = staging_offset_.at(static_cast<size_t>(t));
  POOCH_CHECK(off != SIZE_MAX && graph_.tensor(t).role == Role::input, "(not an input)");
  return backend_.host_pool_base() + off;
}

const void* Executor::output_staging(TensorId t) const {
  const size_t off = staging_offset_.at(static_cast<size_t>(t));
  POOCH_CHECK(off != SIZE_MAX, "(not a graph output)");
  return backend_.host_pool_base() + off;
}

void Executor::write_tensor(TensorId t, const void* src, size_t bytes) {
  POOCH_CHECK(bytes == graph_.tensor(t).bytes(), "(size mismatch)");
  backend_.copy_async(Stream::h2d, device_ptr(t), src, bytes);
  backend_.stream_sync(Stream::h2d);
}

void Executor::read_tensor(TensorId t, void* dst, size_t bytes) const {
  POOCH_CHECK(bytes == graph_.tensor(t).bytes(), "(size mismatch)");
  backend_.sync_all();
  backend_.copy_async(Stream::d2h, dst, device_ptr(t), bytes);
  backend_.stream_sync(Stream::d2h);
}

const std::byte* Executor::host_view(TensorId t) const {
  if (!backend_.caps().host_is_device) return nullptr;
  backend_.sync_all();
  return device_ptr(t);
}

void Executor::run(const Program& prog) {
  if (prog.is_training) ++ctx_.step;
  ctx_.training = prog.is_training ? 1 : 0;
  std::byte* host = backend_.host_pool_base();
  for (TensorId t : inputs_)
    backend_.copy_async(Stream::h2d, device_ptr(t), host + staging_offset_[static_cast<size_t>(t)],
                        graph_.tensor(t).bytes());
  backend_.event_record(Stream::h2d, inputs_ready_);
  backend_.stream_wait(Stream::compute, inputs_ready_);
  for (int i : prog.nodes)
    backend_.launch(Stream::compute, *kernels_[static_cast<size_t>(i)],
                    args_[static_cast<size_t>(i)]);
  backend_.event_record(Stream::compute, compute_done_);
  backend_.stream_wait(Stream::d2h, compute_done_);
  for (TensorId o : graph_.outputs())
    backend_.copy_async(Stream::d2h, host + staging_offset_[static_cast<size_t>(o)], device_ptr(o),
                        graph_.tensor(o).bytes());
  backend_.sync_all();
}

}  // namespace pooch
