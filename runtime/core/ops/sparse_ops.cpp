// Sparse ops (docs/OPS.md, "Sparse"): the CSR input layer (sparse_linear),
// the fixed fan-in output layer (ffi_linear), top-k, and the gradient ops
// their backward builders emit. Float operands are f32; f64 is accepted too
// because the kernel checker builds the same graphs in double for finite
// differences, and all float operands of one op must agree on it. Kernels
// trust what passes here (they never check), so every size a kernel indexes
// with is checked against the operand it indexes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../op_registry.h"
#include "op_checks.h"

namespace pooch {
namespace {

constexpr double kInt32Max = static_cast<double>(std::numeric_limits<int32_t>::max());
// A u16 index addresses hidden units 0..65535.
constexpr int64_t kU16Hidden = 65536;

// A whole-number attribute in [lo, hi].
int64_t int_attr(std::string_view op, const Attrs& a, const char* key, double lo, double hi) {
  const double v = a.require(op, key);
  if (!(v >= lo && v <= hi && v == std::floor(v)))
    op_error(op,
             fmt::format("attribute {} = {} must be a whole number in [{}, {}]", key, v, lo, hi));
  return static_cast<int64_t>(v);
}

// ---- CSR batches ------------------------------------------------------------

// ptr i32[B+1], idx i32[N], val[N]; returns B. The offsets are i32, so the
// capacity must fit in one.
int64_t check_csr(std::string_view op, const TensorDesc& ptr, const TensorDesc& idx,
                  const TensorDesc& val) {
  expect_rank(op, ptr, 1, "row offsets");
  expect_dtype(op, ptr, DType::i32, "row offsets");
  if (ptr.shape[0] < 1)
    op_error(op, fmt::format("row offsets '{}' {} must hold B+1 >= 1 entries (ptr[0] = 0)",
                             ptr.name, shape_str(ptr.shape)));
  expect_rank(op, idx, 1, "feature ids");
  expect_dtype(op, idx, DType::i32, "feature ids");
  expect_rank(op, val, 1, "values");
  expect_float(op, val, "values");
  if (val.shape != idx.shape)
    op_error(op, fmt::format("values '{}' {} and feature ids '{}' {} must have the same length N",
                             val.name, shape_str(val.shape), idx.name, shape_str(idx.shape)));
  if (static_cast<double>(idx.shape[0]) > kInt32Max)
    op_error(op, fmt::format("feature ids '{}' {}: a capacity above 2^31-1 does not fit the i32 "
                             "row offsets",
                             idx.name, shape_str(idx.shape)));
  return ptr.shape[0] - 1;
}

void add_sparse_linear(OpRegistry& r) {
  OpDef fwd;
  fwd.name = "sparse_linear";
  fwd.min_inputs = fwd.max_inputs = 5;
  fwd.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "sparse_linear";
    const TensorDesc& val = *in[2];
    const TensorDesc& w = *in[3];
    const TensorDesc& b = *in[4];
    const int64_t batch = check_csr(op, *in[0], *in[1], val);
    expect_rank(op, w, 2, "weight");
    expect_dtype(op, w, val.dtype, "weight");
    if (static_cast<double>(w.shape[0]) > kInt32Max + 1)
      op_error(op, fmt::format("weight '{}' {} has more rows than i32 feature ids can address",
                               w.name, shape_str(w.shape)));
    expect_rank(op, b, 1, "bias");
    expect_dtype(op, b, val.dtype, "bias");
    expect_dim(op, b, 0, "bias", w, 1, "weight");
    return {OutSpec{val.dtype, Shape{batch, w.shape[1]}}};
  };
  // The nonzero count is only known per batch: the capacity N bounds it.
  fwd.flops = [](InDescs in, InDescs out, const Attrs&) {
    return 2.0 * numel(in[1]) * static_cast<double>(in[3]->shape[1]) + numel(out[0]);
  };
  // Of the weight, only the rows the N nonzeros name.
  fwd.bytes = [](InDescs in, InDescs out, const Attrs&) {
    return op_bytes(in, out) - static_cast<double>(in[3]->bytes()) +
           table_rows_bytes(in[3], in[1]->shape[0]);
  };
  fwd.backward = [](Graph& g, const Node& node, std::span<const TensorId> dy,
                    const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || (!needs[3] && !needs[4])) return;
    const TensorId w = node.inputs[3], b = node.inputs[4];
    const int64_t features = g.tensor(w).shape[0];
    // The values of a batch are data, not parameters: no gradient for them.
    const std::vector<TensorId> outs = g.add_op(
        "sparse_linear_grad_weight", {node.inputs[0], node.inputs[1], node.inputs[2], dy[0]},
        Attrs{{"features", static_cast<double>(features)}},
        {g.unique_name(g.tensor(w).name + ".grad.rows"), grad_name(g, w), grad_name(g, b)},
        Role::gradient);
    g.tensor(outs[1]).sparse_rows = outs[0];
    if (needs[3]) dx[3] = outs[1];
    if (needs[4]) dx[4] = outs[2];
  };
  fwd.row_weight = 3;
  r.add(std::move(fwd));

  OpDef gw;
  gw.name = "sparse_linear_grad_weight";
  gw.min_inputs = gw.max_inputs = 4;
  gw.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "sparse_linear_grad_weight";
    const TensorDesc& dy = *in[3];
    const int64_t batch = check_csr(op, *in[0], *in[1], *in[2]);
    expect_rank(op, dy, 2, "output gradient");
    expect_dtype(op, dy, in[2]->dtype, "output gradient");
    if (dy.shape[0] != batch)
      op_error(op, fmt::format("output gradient '{}' {} must have B = {} rows, as row offsets "
                               "'{}' {} say",
                               dy.name, shape_str(dy.shape), batch, in[0]->name,
                               shape_str(in[0]->shape)));
    const int64_t features = int_attr(op, attrs, "features", 0, kInt32Max + 1);
    // A batch touches at most min(F, N) distinct rows of the weight.
    const int64_t rows = std::min(features, in[1]->shape[0]);
    return {OutSpec{DType::i32, Shape{1 + rows}}, OutSpec{dy.dtype, Shape{rows, dy.shape[1]}},
            OutSpec{dy.dtype, Shape{dy.shape[1]}}};
  };
  gw.flops = [](InDescs in, InDescs, const Attrs&) {
    return 2.0 * numel(in[1]) * static_cast<double>(in[3]->shape[1]) + numel(in[3]);
  };
  gw.host_for_host_readers = true;
  r.add(std::move(gw));
}

// ---- fixed fan-in layer -------------------------------------------------------

}  // namespace

// index[L,K] is u16 or i32; u16 only when every hidden unit is addressable.
// The transposed kernels count slots in i32, so L*K must fit one.
void check_index(std::string_view op, const TensorDesc& index, int64_t hidden) {
  expect_rank(op, index, 2, "index");
  if (index.dtype != DType::u16 && index.dtype != DType::i32)
    op_error(op, fmt::format("index '{}' must be u16 or i32, got {}", index.name,
                             dtype_name(index.dtype)));
  if (index.dtype == DType::u16 && hidden > kU16Hidden)
    op_error(op, fmt::format("index '{}' {} is u16, which addresses at most {} inputs; the input "
                             "width H is {}: use an i32 index",
                             index.name, shape_str(index.shape), kU16Hidden, hidden));
  if (static_cast<double>(hidden) > kInt32Max + 1)
    op_error(op, fmt::format("input width H = {} is more than i32 indices can address", hidden));
  if (static_cast<double>(index.shape[0]) * static_cast<double>(index.shape[1]) > kInt32Max)
    op_error(op, fmt::format("index '{}' {} has more than 2^31-1 slots", index.name,
                             shape_str(index.shape)));
}

// w[L,K] (or any float operand laid out like the index) of dtype dt.
void expect_like_index(std::string_view op, const TensorDesc& t, const char* role,
                       const TensorDesc& index, DType dt) {
  expect_dtype(op, t, dt, role);
  if (t.shape != index.shape)
    op_error(op, fmt::format("{} '{}' {} must have the shape of index '{}' {}", role, t.name,
                             shape_str(t.shape), index.name, shape_str(index.shape)));
}

namespace {

double ffi_macs(const TensorDesc* batch_rows, const TensorDesc* index) {
  return static_cast<double>(batch_rows->shape[0]) * numel(index);
}

void add_ffi(OpRegistry& r) {
  OpDef fwd;
  fwd.name = "ffi_linear";
  fwd.min_inputs = fwd.max_inputs = 4;
  fwd.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "ffi_linear";
    const TensorDesc& x = *in[0];
    const TensorDesc& index = *in[1];
    const TensorDesc& b = *in[3];
    expect_rank(op, x, 2, "input");
    expect_float(op, x, "input");
    check_index(op, index, x.shape[1]);
    expect_like_index(op, *in[2], "weight", index, x.dtype);
    expect_rank(op, b, 1, "bias");
    expect_dtype(op, b, x.dtype, "bias");
    expect_dim(op, b, 0, "bias", index, 0, "index");
    return {OutSpec{x.dtype, Shape{x.shape[0], index.shape[0]}}};
  };
  fwd.flops = [](InDescs in, InDescs out, const Attrs&) {
    return 2.0 * ffi_macs(in[0], in[1]) + numel(out[0]);
  };
  fwd.backward = [](Graph& g, const Node& node, std::span<const TensorId> dy,
                    const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor) return;
    const TensorId x = node.inputs[0], index = node.inputs[1], w = node.inputs[2],
                   b = node.inputs[3];
    // The index is structure (rewired by dynamic sparse training), not a parameter.
    if (needs[0]) {
      const auto hidden = static_cast<double>(g.tensor(x).shape[1]);
      dx[0] = g.add_op1("ffi_grad_input", {dy[0], index, w}, Attrs{{"hidden", hidden}},
                        grad_name(g, x), Role::gradient);
    }
    if (needs[2] || needs[3]) {
      const std::vector<TensorId> outs =
          g.add_op("ffi_grad_weight", {dy[0], x, index}, {}, {grad_name(g, w), grad_name(g, b)},
                   Role::gradient);
      if (needs[2]) dx[2] = outs[0];
      if (needs[3]) dx[3] = outs[1];
    }
  };
  r.add(std::move(fwd));

  OpDef gi;
  gi.name = "ffi_grad_input";
  gi.min_inputs = gi.max_inputs = 3;
  gi.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "ffi_grad_input";
    const TensorDesc& dy = *in[0];
    const TensorDesc& index = *in[1];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    const int64_t hidden = int_attr(op, attrs, "hidden", 0, kInt32Max + 1);
    check_index(op, index, hidden);
    expect_dim(op, index, 0, "index", dy, 1, "output gradient");
    expect_like_index(op, *in[2], "weight", index, dy.dtype);
    return {OutSpec{dy.dtype, Shape{dy.shape[0], hidden}}};
  };
  gi.flops = [](InDescs in, InDescs, const Attrs&) { return 2.0 * ffi_macs(in[0], in[1]); };
  r.add(std::move(gi));

  OpDef gw;
  gw.name = "ffi_grad_weight";
  gw.min_inputs = gw.max_inputs = 3;
  gw.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "ffi_grad_weight";
    const TensorDesc& dy = *in[0];
    const TensorDesc& x = *in[1];
    const TensorDesc& index = *in[2];
    expect_rank(op, dy, 2, "output gradient");
    expect_float(op, dy, "output gradient");
    expect_rank(op, x, 2, "input");
    expect_dtype(op, x, dy.dtype, "input");
    expect_dim(op, x, 0, "input", dy, 0, "output gradient");
    check_index(op, index, x.shape[1]);
    expect_dim(op, index, 0, "index", dy, 1, "output gradient");
    return {OutSpec{dy.dtype, index.shape}, OutSpec{dy.dtype, Shape{index.shape[0]}}};
  };
  gw.flops = [](InDescs in, InDescs, const Attrs&) {
    return 2.0 * ffi_macs(in[0], in[2]) + numel(in[0]);
  };
  r.add(std::move(gw));
}

// ---- top-k --------------------------------------------------------------------

void add_topk(OpRegistry& r) {
  OpDef d;
  d.name = "topk";
  d.min_inputs = d.max_inputs = 1;
  d.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "topk";
    const TensorDesc& x = *in[0];
    expect_rank(op, x, 2, "input");
    expect_float(op, x, "input");
    if (static_cast<double>(x.shape[1]) > kInt32Max)
      op_error(op, fmt::format("input '{}' {} has more labels than i32 indices can hold", x.name,
                               shape_str(x.shape)));
    const double k = attrs.require(op, "k");
    if (!(k >= 1 && k <= static_cast<double>(x.shape[1]) && k == std::floor(k)))
      op_error(op, fmt::format("attribute k = {} must be a whole number in [1, L] = [1, {}] for "
                               "input '{}' {}",
                               k, x.shape[1], x.name, shape_str(x.shape)));
    const Shape s{x.shape[0], static_cast<int64_t>(k)};
    return {OutSpec{x.dtype, s}, OutSpec{DType::i32, s}};
  };
  // Comparisons, not arithmetic, but a scan touches every element once.
  d.flops = [](InDescs in, InDescs, const Attrs&) { return numel(in[0]); };
  r.add(std::move(d));
}

// ---- a row-sparse gradient added into a dense one ----------------------------

// dense[F,O] + the rows of a row-sparse tensor (rows i32[1+R], g[R,O], as
// sparse_linear_grad_weight writes them): autodiff's sum of the gradients of
// a weight read both densely and as a sparse layer's weight (tied weights).
void add_scatter_add_rows(OpRegistry& r) {
  OpDef d;
  d.name = "scatter_add_rows";
  d.min_inputs = d.max_inputs = 3;  // dense, rows, g
  d.inplace_input = 0;
  d.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    const std::string_view op = "scatter_add_rows";
    const TensorDesc& dense = *in[0];
    const TensorDesc& rows = *in[1];
    const TensorDesc& g = *in[2];
    expect_rank(op, dense, 2, "dense tensor");
    expect_float(op, dense, "dense tensor");
    if (static_cast<double>(dense.shape[0]) > kInt32Max + 1)
      op_error(op, fmt::format("dense tensor '{}' {} has more rows than i32 row ids can address",
                               dense.name, shape_str(dense.shape)));
    expect_rank(op, rows, 1, "rows");
    expect_dtype(op, rows, DType::i32, "rows");
    if (rows.shape[0] < 1)
      op_error(op, fmt::format("rows '{}' {} must hold at least the count rows[0]", rows.name,
                               shape_str(rows.shape)));
    expect_rank(op, g, 2, "row gradient");
    expect_dtype(op, g, dense.dtype, "row gradient");
    if (g.shape[0] != rows.shape[0] - 1 || g.shape[1] != dense.shape[1])
      op_error(op,
               fmt::format("row gradient '{}' {} must be [{},{}]: one row per slot of rows "
                           "'{}' {} and the width of dense tensor '{}' {}",
                           g.name, shape_str(g.shape), rows.shape[0] - 1, dense.shape[1], rows.name,
                           shape_str(rows.shape), dense.name, shape_str(dense.shape)));
    return {OutSpec{dense.dtype, dense.shape}};
  };
  // One add per element of g (at most; only the listed rows are added).
  d.flops = [](InDescs in, InDescs, const Attrs&) { return numel(in[2]); };
  r.add(std::move(d));
}

}  // namespace

void register_sparse_ops(OpRegistry& r) {
  add_sparse_linear(r);
  add_ffi(r);
  add_topk(r);
  add_scatter_add_rows(r);
}

}  // namespace pooch
