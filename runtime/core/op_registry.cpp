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
    register_loss_ops(r);
    register_optimizer_ops(r);
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

}  // namespace pooch
