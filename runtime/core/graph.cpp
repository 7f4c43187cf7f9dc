#include "graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../../kernels/common/kernel_abi.h"
#include "error.h"
#include "op_registry.h"

namespace pooch {

const char* role_name(Role r) {
  switch (r) {
    case Role::input:
      return "input";
    case Role::weight:
      return "weight";
    case Role::activation:
      return "activation";
    case Role::gradient:
      return "gradient";
    case Role::optimizer_state:
      return "optimizer state";
  }
  return "?";
}

int64_t TensorDesc::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ","));
}

double Attrs::get(std::string_view k, double fallback) const {
  auto it = kv_.find(k);
  return it == kv_.end() ? fallback : it->second;
}

double Attrs::require(std::string_view op, std::string_view k) const {
  auto it = kv_.find(k);
  if (it == kv_.end())
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}' needs the attribute '{}'", op, k));
  return it->second;
}

TensorId Graph::add_tensor(TensorDesc desc) {
  if (desc.name.empty()) desc.name = unique_name("t");
  if (by_name_.count(desc.name))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("a tensor named '{}' already exists in the graph", desc.name));
  for (int64_t d : desc.shape)
    if (d < 0)
      throw Error(POOCH_ERR_INVALID_ARG, fmt::format("tensor '{}' has a negative dimension in {}",
                                                     desc.name, shape_str(desc.shape)));
  if (desc.shape.size() > kern::kMaxDims)
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("tensor '{}' has {} dimensions; at most {}",
                                                   desc.name, desc.shape.size(), kern::kMaxDims));
  if (dtype_size(desc.dtype) == 0)
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("tensor '{}' has the unknown dtype {}",
                                                   desc.name, static_cast<int>(desc.dtype)));
  // numel() and bytes() multiply the dimensions in order without checks, and
  // the arena is sized from them: a product past this bound would wrap into a
  // small buffer that kernels then overrun. Zero dimensions are skipped, as a
  // running product may overflow before a later 0 is reached.
  uint64_t elems = 1;
  for (int64_t d : desc.shape)
    if (d != 0) {
      if (static_cast<uint64_t>(d) > kMaxTensorBytes / dtype_size(desc.dtype) / elems)
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("tensor '{}' {} {} would take more than 2^62 bytes; use smaller "
                                "dimensions (batch size, layer widths, label count)",
                                desc.name, dtype_name(desc.dtype), shape_str(desc.shape)));
      elems *= static_cast<uint64_t>(d);
    }
  const auto id = static_cast<TensorId>(tensors_.size());
  by_name_.emplace(desc.name, id);
  tensors_.push_back(std::move(desc));
  return id;
}

std::vector<TensorId> Graph::add_op(std::string_view op, std::vector<TensorId> inputs, Attrs attrs,
                                    std::vector<std::string> out_names, Role out_role) {
  const OpDef& def = op_registry().get(op);
  const int n_in = static_cast<int>(inputs.size());
  if (n_in < def.min_inputs || n_in > def.max_inputs)
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}' takes {} to {} inputs, got {}", op,
                                                   def.min_inputs, def.max_inputs, n_in));
  std::vector<const TensorDesc*> in;
  for (TensorId id : inputs) {
    if (id < 0 || static_cast<size_t>(id) >= tensors_.size())
      throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}' got an unknown input tensor", op));
    in.push_back(&tensors_[static_cast<size_t>(id)]);
  }
  std::vector<OutSpec> specs = def.infer(in, attrs);
  if (specs.size() > kern::kMaxOperands)
    throw Error(POOCH_ERR_INTERNAL, fmt::format("op '{}' declares too many outputs", op));
  Node node{std::string(op), std::move(attrs), std::move(inputs), {}};
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string name =
        i < out_names.size() && !out_names[i].empty()
            ? out_names[i]
            : unique_name(fmt::format("{}{}", op, specs.size() > 1 ? fmt::format(".{}", i) : ""));
    node.outputs.push_back(add_tensor(
        TensorDesc{std::move(name), specs[i].dtype, std::move(specs[i].shape), out_role}));
  }
  nodes_.push_back(node);
  return node.outputs;
}

TensorId Graph::add_op1(std::string_view op, std::vector<TensorId> inputs, Attrs attrs,
                        std::string out_name, Role out_role) {
  auto outs = add_op(op, std::move(inputs), std::move(attrs), {std::move(out_name)}, out_role);
  if (outs.empty()) throw Error(POOCH_ERR_INTERNAL, fmt::format("op '{}' has no output", op));
  return outs[0];
}

std::optional<TensorId> Graph::find(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

void Graph::mark_output(TensorId id) {
  POOCH_CHECK(id >= 0 && static_cast<size_t>(id) < tensors_.size());
  for (TensorId o : outputs_)
    if (o == id) return;
  outputs_.push_back(id);
}

std::string Graph::unique_name(std::string_view prefix) const {
  std::string base(prefix);
  if (!by_name_.count(base)) return base;
  for (int i = 1;; ++i) {
    std::string candidate = fmt::format("{}#{}", base, i);
    if (!by_name_.count(candidate)) return candidate;
  }
}

Graph Graph::prefix(size_t tensors, size_t nodes) const {
  if (tensors > tensors_.size() || nodes > nodes_.size())
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("a graph prefix of {} tensors and {} nodes is longer than the graph "
                            "({} and {})",
                            tensors, nodes, tensors_.size(), nodes_.size()));
  Graph g;
  for (size_t t = 0; t < tensors; ++t) g.add_tensor(tensors_[t]);
  for (size_t i = 0; i < nodes; ++i) {
    bool inside = true;
    for (TensorId x : nodes_[i].inputs) inside = inside && static_cast<size_t>(x) < tensors;
    for (TensorId x : nodes_[i].outputs) inside = inside && static_cast<size_t>(x) < tensors;
    if (inside) {
      g.nodes_.push_back(nodes_[i]);
      continue;
    }
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("node {} ({}) of the graph's first {} reads or writes a tensor past "
                            "its first {}",
                            i, nodes_[i].op, nodes, tensors));
  }
  for (TensorId o : outputs_)
    if (static_cast<size_t>(o) < tensors) g.outputs_.push_back(o);
  return g;
}

}  // namespace pooch
