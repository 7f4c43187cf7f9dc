#include "op_registry.h"

#include <fmt/format.h>

#include "error.h"

namespace pooch {

double op_bytes(InDescs in, InDescs out) {
  double b = 0;
  for (const TensorDesc* t : in) b += static_cast<double>(t->bytes());
  for (const TensorDesc* t : out) b += static_cast<double>(t->bytes());
  return b;
}

double op_bytes(const OpDef& def, InDescs in, InDescs out, const Attrs& attrs) {
  if (def.bytes) return def.bytes(in, out, attrs);
  // An input the op writes into (an optimizer's weight and state) is read
  // and written: Adam moves 7 floats an element, not 4.
  double b = op_bytes(in, out);
  for (int i : def.mutates) b += static_cast<double>(in[static_cast<size_t>(i)]->bytes());
  return b;
}

NodeOperands node_operands(const Graph& g, const Node& n) {
  NodeOperands o;
  for (TensorId x : n.inputs) o.in.push_back(&g.tensor(x));
  for (TensorId y : n.outputs) o.out.push_back(&g.tensor(y));
  return o;
}

double node_flops(const Graph& g, const Node& n) {
  const OpDef& def = op_registry().get(n.op);
  if (!def.flops) return 0;
  const NodeOperands o = node_operands(g, n);
  return def.flops(o.in, o.out, n.attrs);
}

double node_bytes(const Graph& g, const Node& n) {
  const NodeOperands o = node_operands(g, n);
  return op_bytes(op_registry().get(n.op), o.in, o.out, n.attrs);
}

void OpRegistry::add(OpDef def) {
  POOCH_CHECK(!def.name.empty() && find(def.name) == nullptr, "(duplicate op)");
  POOCH_CHECK(static_cast<bool>(def.infer), "(op without shape inference)");
  defs_.push_back(std::move(def));
}

const OpDef* OpRegistry::find(std::string_view name) const {
  for (const OpDef& d : defs_)
    if (d.name == name) return &d;
  return nullptr;
}

const OpDef& OpRegistry::get(std::string_view name) const {
  const OpDef* d = find(name);
  if (!d) throw Error(POOCH_ERR_UNSUPPORTED, fmt::format("unknown op kind '{}'", name));
  return *d;
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> out;
  for (const OpDef& d : defs_) out.push_back(&d);
  return out;
}

const OpRegistry& op_registry() {
  // Filled once, on first use, by explicit calls: static initialisers in a
  // static library would be dropped by the linker.
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_dense_ops(r);
    register_sparse_ops(r);
    register_ffi_head_ops(r);
    register_loss_ops(r);
    register_optimizer_ops(r);
    register_conv_ops(r);
    register_lm_ops(r);
    return r;
  }();
  return registry;
}

void op_error(std::string_view op, const std::string& what) {
  throw Error(POOCH_ERR_INVALID_ARG, fmt::format("op '{}': {}", op, what));
}

void expect_rank(std::string_view op, const TensorDesc& t, int rank, const char* role) {
  if (static_cast<int>(t.shape.size()) != rank)
    op_error(op, fmt::format("{} '{}' must have {} dimension{}, got {}", role, t.name, rank,
                             rank == 1 ? "" : "s", shape_str(t.shape)));
}

void expect_dtype(std::string_view op, const TensorDesc& t, DType dt, const char* role) {
  if (t.dtype != dt)
    op_error(op, fmt::format("{} '{}' must be {}, got {}", role, t.name, dtype_name(dt),
                             dtype_name(t.dtype)));
}

void expect_float(std::string_view op, const TensorDesc& t, const char* role) {
  if (t.dtype != DType::f32 && t.dtype != DType::f64)
    op_error(op, fmt::format("{} '{}' must be f32 (or f64 for checking), got {}", role, t.name,
                             dtype_name(t.dtype)));
}

void expect_like(std::string_view op, const TensorDesc& t, const char* role, const TensorDesc& ref,
                 const char* ref_role) {
  expect_dtype(op, t, ref.dtype, role);
  if (t.shape != ref.shape)
    op_error(op, fmt::format("{} '{}' {} must have the shape of {} '{}' {}", role, t.name,
                             shape_str(t.shape), ref_role, ref.name, shape_str(ref.shape)));
}

void expect_dim(std::string_view op, const TensorDesc& t, int dim, const char* role,
                const TensorDesc& ref, int ref_dim, const char* ref_role) {
  const auto d = static_cast<size_t>(dim), rd = static_cast<size_t>(ref_dim);
  if (t.shape[d] != ref.shape[rd])
    op_error(op, fmt::format("{} '{}' {} does not fit {} '{}' {}: its dimension {} must be {}",
                             role, t.name, shape_str(t.shape), ref_role, ref.name,
                             shape_str(ref.shape), dim, ref.shape[rd]));
}

std::string grad_name(const Graph& g, TensorId t) {
  return g.unique_name(g.tensor(t).name + ".grad");
}

}  // namespace pooch
