// Optimizer update ops (docs/OPS.md, "Optimizer updates"). They produce no
// tensors: they write the weight and its state in place, which `mutates`
// tells the arena planner so those buffers stay live and unshared. Attribute
// ranges are those torch.optim accepts.
#include <fmt/format.h>

#include <cmath>

#include "../op_registry.h"

namespace pooch {
namespace {

void check_same(std::string_view op, const TensorDesc& w, const TensorDesc& t, const char* role) {
  expect_dtype(op, t, w.dtype, role);
  if (t.shape != w.shape)
    op_error(op, fmt::format("{} '{}' {} must have the shape of weight '{}' {}", role, t.name,
                             shape_str(t.shape), w.name, shape_str(w.shape)));
}

void check_weight(std::string_view op, const TensorDesc& w) {
  if (w.dtype != DType::f32 && w.dtype != DType::f64)
    op_error(op, fmt::format("weight '{}' must be f32 (or f64 for checking), got {}", w.name,
                             dtype_name(w.dtype)));
}

// [lo, hi] or [lo, hi) when hi_open; every attribute must be finite.
void check_attr(std::string_view op, const Attrs& a, const char* key, double fallback, double lo,
                double hi, bool hi_open) {
  const double v = a.get(key, fallback);
  const bool ok = std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
  if (!ok)
    op_error(op, fmt::format("attribute {} = {} is out of range; it must lie in [{}, {}{}", key, v,
                             lo, hi, hi_open ? ")" : "]"));
}

constexpr double kInf = HUGE_VAL;

void check_sgd_attrs(std::string_view op, const Attrs& a) {
  const double lr = a.require(op, "lr");
  if (!std::isfinite(lr) || lr < 0)
    op_error(op, fmt::format("attribute lr = {} must be finite and >= 0", lr));
  check_attr(op, a, "momentum", 0.0, 0.0, kInf, true);
  check_attr(op, a, "weight_decay", 0.0, 0.0, kInf, true);
}

void check_adam_attrs(std::string_view op, const Attrs& a) {
  const double lr = a.require(op, "lr");
  if (!std::isfinite(lr) || lr < 0)
    op_error(op, fmt::format("attribute lr = {} must be finite and >= 0", lr));
  check_attr(op, a, "beta1", 0.9, 0.0, 1.0, true);
  check_attr(op, a, "beta2", 0.999, 0.0, 1.0, true);
  check_attr(op, a, "eps", 1e-8, 0.0, kInf, true);
  check_attr(op, a, "weight_decay", 0.0, 0.0, kInf, true);
  const double d = a.get("decoupled", 0.0);
  if (d != 0.0 && d != 1.0)
    op_error(op, fmt::format("attribute decoupled = {} must be 0 (Adam) or 1 (AdamW)", d));
}

// A running sum of squared gradient elements: f32 [1].
void check_sumsq(std::string_view op, const TensorDesc& t, const char* role) {
  expect_dtype(op, t, DType::f32, role);
  if (t.shape != Shape{1})
    op_error(op, fmt::format("{} '{}' {} must be f32 [1]", role, t.name, shape_str(t.shape)));
}

// w, g and the states all alike (dense update), then optionally the
// gradients' sum of squares, with which the update clips its gradient to
// the attribute max_norm (torch.nn.utils.clip_grad_norm_).
void check_dense(std::string_view op, InDescs in, const Attrs& a, int n_states) {
  const TensorDesc& w = *in[0];
  check_weight(op, w);
  check_same(op, w, *in[1], "gradient");
  for (int s = 0; s < n_states; ++s) check_same(op, w, *in[2 + s], "state");
  if (static_cast<int>(in.size()) > 2 + n_states) {
    check_sumsq(op, *in[2 + n_states], "gradient sum of squares");
    const double c = a.require(op, "max_norm");
    if (!std::isfinite(c) || c <= 0)
      op_error(op, fmt::format("attribute max_norm = {} must be finite and > 0", c));
  }
}

// w[F,O], rows i32[1+R], g[R,O], states[F,O].
void check_rows(std::string_view op, InDescs in, int n_states) {
  const TensorDesc& w = *in[0];
  const TensorDesc& rows = *in[1];
  const TensorDesc& g = *in[2];
  check_weight(op, w);
  expect_rank(op, w, 2, "weight");
  expect_rank(op, rows, 1, "rows");
  expect_dtype(op, rows, DType::i32, "rows");
  if (rows.shape[0] < 1)
    op_error(op, fmt::format("rows '{}' {} must hold at least the count rows[0]", rows.name,
                             shape_str(rows.shape)));
  expect_rank(op, g, 2, "gradient");
  expect_dtype(op, g, w.dtype, "gradient");
  const int64_t r = rows.shape[0] - 1;
  if (g.shape[0] != r || g.shape[1] != w.shape[1])
    op_error(op, fmt::format("gradient '{}' {} must be [{},{}]: one row per slot of rows '{}' {} "
                             "and the width of weight '{}' {}",
                             g.name, shape_str(g.shape), r, w.shape[1], rows.name,
                             shape_str(rows.shape), w.name, shape_str(w.shape)));
  for (int s = 0; s < n_states; ++s) check_same(op, w, *in[3 + s], "state");
}

// Per-element cost of one update.
double sgd_cost(const Attrs& a) {
  return a.get("momentum", 0.0) != 0.0 ? 6 : 4;
}
constexpr double kAdamCost = 15;

// The row-sparse updates touch at most R rows; R*O bounds the work.
double rows_elems(InDescs in) {
  return static_cast<double>(in[2]->numel());
}
// And of the weight and each state, at most those R rows move, read and
// written.
double rows_bytes(InDescs in) {
  const int64_t r = in[1]->shape[0] - 1;
  double b = static_cast<double>(in[1]->bytes() + in[2]->bytes());
  for (size_t i = 0; i < in.size(); ++i)
    if (i != 1 && i != 2) b += 2 * table_rows_bytes(in[i], r);
  return b;
}

}  // namespace

void register_optimizer_ops(OpRegistry& r) {
  {
    // Gradient clipping by global norm: s = acc + Σ g² (acc 0 when absent),
    // chained over every gradient so the last link holds ‖g‖².
    OpDef d;
    d.name = "grad_sumsq";
    d.min_inputs = 1;  // g [, acc]
    d.max_inputs = 2;
    d.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
      expect_float("grad_sumsq", *in[0], "gradient");
      if (in.size() > 1) check_sumsq("grad_sumsq", *in[1], "running sum");
      return {OutSpec{DType::f32, Shape{1}}};
    };
    d.flops = [](InDescs in, InDescs, const Attrs&) { return 2.0 * numel(in[0]); };
    d.early = true;
    r.add(std::move(d));
  }
  {
    OpDef d;
    d.name = "sgd_update";
    d.min_inputs = 3;  // w, g, mom [, gradient sum of squares]
    d.max_inputs = 4;
    d.mutates = {0, 2};
    d.infer = [](InDescs in, const Attrs& a) -> std::vector<OutSpec> {
      check_dense("sgd_update", in, a, 1);
      check_sgd_attrs("sgd_update", a);
      return {};
    };
    d.flops = [](InDescs in, InDescs, const Attrs& a) {
      return sgd_cost(a) * static_cast<double>(in[0]->numel());
    };
    r.add(std::move(d));
  }
  {
    OpDef d;
    d.name = "adam_update";
    d.min_inputs = 4;  // w, g, m, v [, gradient sum of squares]
    d.max_inputs = 5;
    d.mutates = {0, 2, 3};
    d.infer = [](InDescs in, const Attrs& a) -> std::vector<OutSpec> {
      check_dense("adam_update", in, a, 2);
      check_adam_attrs("adam_update", a);
      return {};
    };
    d.flops = [](InDescs in, InDescs, const Attrs&) {
      return kAdamCost * static_cast<double>(in[0]->numel());
    };
    r.add(std::move(d));
  }
  {
    OpDef d;
    d.name = "sgd_update_rows";
    d.min_inputs = d.max_inputs = 4;  // w, rows, g, mom
    d.mutates = {0, 3};
    d.infer = [](InDescs in, const Attrs& a) -> std::vector<OutSpec> {
      check_rows("sgd_update_rows", in, 1);
      check_sgd_attrs("sgd_update_rows", a);
      return {};
    };
    d.flops = [](InDescs in, InDescs, const Attrs& a) { return sgd_cost(a) * rows_elems(in); };
    d.bytes = [](InDescs in, InDescs, const Attrs&) { return rows_bytes(in); };
    r.add(std::move(d));
  }
  {
    OpDef d;
    d.name = "adam_update_rows";
    d.min_inputs = d.max_inputs = 5;  // w, rows, g, m, v
    d.mutates = {0, 3, 4};
    d.infer = [](InDescs in, const Attrs& a) -> std::vector<OutSpec> {
      check_rows("adam_update_rows", in, 2);
      check_adam_attrs("adam_update_rows", a);
      return {};
    };
    d.flops = [](InDescs in, InDescs, const Attrs&) { return kAdamCost * rows_elems(in); };
    d.bytes = [](InDescs in, InDescs, const Attrs&) { return rows_bytes(in); };
    r.add(std::move(d));
  }
}

}  // namespace pooch
