// Language-model ops (docs/OPS.md, "Language models"): token and position
// embeddings (a gather with a row-sparse or dense weight gradient), GPT-2's
// tanh GELU, fused causal multi-head self-attention, and the output
// projection fused with softmax cross-entropy over the vocabulary (the
// [tokens x vocabulary] logits are never stored). Float operands are f32;
// f64 is accepted too because the kernel checker builds the same graphs in
// double for finite differences. Kernels trust what passes here.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "../../../kernels/common/kernel_abi.h"
#include "../op_registry.h"

namespace pooch {
namespace {

constexpr double kInt32Max = static_cast<double>(std::numeric_limits<int32_t>::max());

int64_t whole_attr(std::string_view op, const Attrs& a, const char* key, double lo, double hi) {
  const double v = a.require(op, key);
  if (!(v >= lo && v <= hi && v == std::floor(v)))
    op_error(op,
             fmt::format("attribute {} = {} must be a whole number in [{}, {}]", key, v, lo, hi));
  return static_cast<int64_t>(v);
}

// Token ids i32 of rank 1 to 3 (the output adds a dimension: at most rank 4).
void expect_ids(std::string_view op, const TensorDesc& ids) {
  expect_dtype(op, ids, DType::i32, "token ids");
  if (ids.shape.empty() || ids.shape.size() > 3)
    op_error(op, fmt::format("token ids '{}' must have 1 to 3 dimensions, got {}", ids.name,
                             shape_str(ids.shape)));
  if (static_cast<double>(ids.numel()) > kInt32Max)
    op_error(
        op, fmt::format("token ids '{}' {}: more than 2^31-1 ids", ids.name, shape_str(ids.shape)));
}

Shape append(const Shape& s, int64_t last) {
  Shape r = s;
  r.push_back(last);
  return r;
}

// dy[ids..., C] as the embedding's output gradient for these ids.
void expect_embedding_dy(std::string_view op, const TensorDesc& ids, const TensorDesc& dy) {
  expect_float(op, dy, "output gradient");
  if (dy.shape.size() != ids.shape.size() + 1 ||
      !std::equal(ids.shape.begin(), ids.shape.end(), dy.shape.begin()))
    op_error(op, fmt::format("output gradient '{}' {} must be shaped as token ids '{}' {} plus a "
                             "width",
                             dy.name, shape_str(dy.shape), ids.name, shape_str(ids.shape)));
}

void add_embedding(OpRegistry& r) {
  OpDef e;
  e.name = "embedding";
  e.min_inputs = e.max_inputs = 2;
  e.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "embedding";
    expect_ids(op, *in[0]);
    expect_rank(op, *in[1], 2, "table");
    expect_float(op, *in[1], "table");
    if (static_cast<double>(in[1]->shape[0]) > kInt32Max + 1)
      op_error(op, fmt::format("table '{}' {} has more rows than i32 ids can address", in[1]->name,
                               shape_str(in[1]->shape)));
    if (attrs.has("dense_grad")) whole_attr(op, attrs, "dense_grad", 0, 1);
    return {OutSpec{in[1]->dtype, append(in[0]->shape, in[1]->shape[1])}};
  };
  e.flops = [](InDescs, InDescs, const Attrs&) { return 0.0; };  // a gather moves, never computes
  // Of the table, only the rows the ids name.
  e.bytes = [](InDescs in, InDescs out, const Attrs&) {
    return op_bytes(in, out) - static_cast<double>(in[1]->bytes()) +
           table_rows_bytes(in[1], in[0]->numel());
  };
  // Row-sparse by default: a batch touches few of a vocabulary's rows, and a
  // table tied to a dense use (the output projection) gets the rows added
  // into that dense gradient (scatter_add_rows). dense_grad = 1: a dense
  // gradient (position tables, which every batch touches from the start).
  e.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                  const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[1]) return;
    const TensorId ids = fwd.inputs[0], w = fwd.inputs[1];
    const Attrs a{{"vocab", static_cast<double>(g.tensor(w).shape[0])}};
    if (fwd.attrs.get("dense_grad", 0) != 0) {
      dx[1] = g.add_op1("embedding_grad_dense", {ids, dy[0]}, a, grad_name(g, w), Role::gradient);
      return;
    }
    const std::vector<TensorId> outs =
        g.add_op("embedding_grad_rows", {ids, dy[0]}, a,
                 {g.unique_name(g.tensor(w).name + ".grad.rows"), grad_name(g, w)}, Role::gradient);
    g.tensor(outs[1]).sparse_rows = outs[0];
    dx[1] = outs[1];
  };
  r.add(std::move(e));

  OpDef gr;
  gr.name = "embedding_grad_rows";
  gr.min_inputs = gr.max_inputs = 2;
  gr.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "embedding_grad_rows";
    expect_ids(op, *in[0]);
    expect_embedding_dy(op, *in[0], *in[1]);
    const int64_t vocab = whole_attr(op, attrs, "vocab", 0, kInt32Max + 1);
    // A batch touches at most min(V, ids) distinct rows.
    const int64_t rows = std::min(vocab, in[0]->numel());
    return {OutSpec{DType::i32, Shape{1 + rows}},
            OutSpec{in[1]->dtype, Shape{rows, in[1]->shape.back()}}};
  };
  gr.flops = [](InDescs in, InDescs, const Attrs&) { return numel(in[1]); };
  r.add(std::move(gr));

  OpDef gd;
  gd.name = "embedding_grad_dense";
  gd.min_inputs = gd.max_inputs = 2;
  gd.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "embedding_grad_dense";
    expect_ids(op, *in[0]);
    expect_embedding_dy(op, *in[0], *in[1]);
    const int64_t vocab = whole_attr(op, attrs, "vocab", 0, kInt32Max + 1);
    return {OutSpec{in[1]->dtype, Shape{vocab, in[1]->shape.back()}}};
  };
  gd.flops = [](InDescs in, InDescs, const Attrs&) { return numel(in[1]); };
  r.add(std::move(gd));
}

void add_gelu_tanh(OpRegistry& r) {
  OpDef f;
  f.name = "gelu_tanh";
  f.min_inputs = f.max_inputs = 1;
  f.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    expect_float("gelu_tanh", *in[0], "input");
    if (in[0]->shape.size() > static_cast<size_t>(kern::kMaxDims))
      op_error("gelu_tanh",
               fmt::format("input '{}' has more than {} dimensions", in[0]->name, kern::kMaxDims));
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  // x³, the affine map, tanh, 1 + t, the two products.
  f.flops = [](InDescs in, InDescs, const Attrs&) { return 8.0 * numel(in[0]); };
  f.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                  const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    dx[0] = g.add_op1("gelu_tanh_grad", {dy[0], fwd.inputs[0]}, {}, grad_name(g, fwd.inputs[0]),
                      Role::gradient);
  };
  r.add(std::move(f));

  OpDef gg;
  gg.name = "gelu_tanh_grad";
  gg.min_inputs = gg.max_inputs = 2;
  gg.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    expect_float("gelu_tanh_grad", *in[0], "output gradient");
    expect_like("gelu_tanh_grad", *in[1], "gelu input", *in[0], "output gradient");
    return {OutSpec{in[0]->dtype, in[0]->shape}};
  };
  gg.flops = [](InDescs in, InDescs, const Attrs&) { return 14.0 * numel(in[0]); };
  r.add(std::move(gg));
}

// qkv[B,T,3C] with `heads` dividing C; returns {B, T, C}.
std::array<int64_t, 3> check_qkv(std::string_view op, const TensorDesc& qkv, const Attrs& attrs) {
  expect_rank(op, qkv, 3, "qkv");
  expect_float(op, qkv, "qkv");
  const int64_t c3 = qkv.shape[2];
  if (c3 % 3 != 0)
    op_error(op, fmt::format("qkv '{}' {}: the last dimension must be 3C (q, k and v side by side)",
                             qkv.name, shape_str(qkv.shape)));
  const int64_t C = c3 / 3;
  const int64_t H = whole_attr(op, attrs, "heads", 1, kInt32Max);
  if (C % H != 0)
    op_error(op, fmt::format("qkv '{}' {}: the width C = {} is not a multiple of heads = {}",
                             qkv.name, shape_str(qkv.shape), C, H));
  if (C == 0)
    op_error(op, fmt::format("qkv '{}' {}: the width C must be positive", qkv.name,
                             shape_str(qkv.shape)));
  return {qkv.shape[0], qkv.shape[1], C};
}

void add_attention(OpRegistry& r) {
  OpDef a;
  a.name = "causal_attention";
  a.min_inputs = a.max_inputs = 1;
  a.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const auto [B, T, C] = check_qkv("causal_attention", *in[0], attrs);
    const int64_t H = attrs.geti("heads", 1);
    return {OutSpec{in[0]->dtype, Shape{B, T, C}}, OutSpec{in[0]->dtype, Shape{B, H, T}}};
  };
  // QKᵀ and PV over the causal half (T(T+1)/2 pairs), 2 flops per
  // multiply-add, and the softmax (about 5 per score).
  a.flops = [](InDescs in, InDescs, const Attrs&) {
    const double B = static_cast<double>(in[0]->shape[0]), T = static_cast<double>(in[0]->shape[1]);
    const double C = static_cast<double>(in[0]->shape[2]) / 3;
    return B * (T * (T + 1) / 2) * (4.0 * C + 5.0);
  };
  // lse (the log-sum-exp of each query row's scores) is saved for the
  // backward pass, not a value a loss depends on: only dy flows back.
  a.backward = [](Graph& g, const Node& fwd, std::span<const TensorId> dy,
                  const std::vector<char>& needs, std::span<TensorId> dx) {
    if (dy[0] == kNoTensor || !needs[0]) return;
    dx[0] = g.add_op1(
        "causal_attention_grad", {dy[0], fwd.inputs[0], fwd.outputs[0], fwd.outputs[1]},
        Attrs{{"heads", fwd.attrs.get("heads", 1)}}, grad_name(g, fwd.inputs[0]), Role::gradient);
  };
  r.add(std::move(a));

  OpDef ag;
  ag.name = "causal_attention_grad";
  ag.min_inputs = ag.max_inputs = 4;
  ag.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "causal_attention_grad";
    const auto [B, T, C] = check_qkv(op, *in[1], attrs);
    const int64_t H = attrs.geti("heads", 1);
    const TensorDesc& qkv = *in[1];
    for (int i : {0, 2}) {
      const char* role = i == 0 ? "output gradient" : "attention output";
      expect_dtype(op, *in[i], qkv.dtype, role);
      if (in[i]->shape != Shape{B, T, C})
        op_error(op, fmt::format("{} '{}' {} must be [{}, {}, {}]", role, in[i]->name,
                                 shape_str(in[i]->shape), B, T, C));
    }
    expect_dtype(op, *in[3], qkv.dtype, "lse");
    if (in[3]->shape != Shape{B, H, T})
      op_error(op, fmt::format("lse '{}' {} must be [{}, {}, {}]", in[3]->name,
                               shape_str(in[3]->shape), B, H, T));
    return {OutSpec{qkv.dtype, qkv.shape}};
  };
  // Scores recomputed, dP = dY·Vᵀ, dV, dQ and dK: five products over the causal half.
  ag.flops = [](InDescs in, InDescs, const Attrs&) {
    const double B = static_cast<double>(in[1]->shape[0]), T = static_cast<double>(in[1]->shape[1]);
    const double C = static_cast<double>(in[1]->shape[2]) / 3;
    return B * (T * (T + 1) / 2) * (10.0 * C + 6.0);
  };
  r.add(std::move(ag));
}

// One step of incremental decoding: the new token's q, k and v, k and v
// written into the layer's cache at the token's position, and attention
// over the cache up to it (the cache is the op's own persistent state, so
// the step costs O(pos) instead of re-reading the prefix).
void add_attention_decode(OpRegistry& r) {
  OpDef a;
  a.name = "attention_decode";
  a.min_inputs = a.max_inputs = 3;
  a.mutates = {1};
  a.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "attention_decode";
    const auto [B, T, C] = check_qkv(op, *in[0], attrs);
    if (T != 1)
      op_error(op, fmt::format("qkv '{}' {} must hold one token per row ([B, 1, 3C])", in[0]->name,
                               shape_str(in[0]->shape)));
    const TensorDesc& cache = *in[1];
    expect_rank(op, cache, 3, "cache");
    expect_dtype(op, cache, in[0]->dtype, "cache");
    if (cache.shape[0] != B || cache.shape[2] != 2 * C)
      op_error(op, fmt::format("cache '{}' {} must be [{}, positions, {}] (k and v side by side)",
                               cache.name, shape_str(cache.shape), B, 2 * C));
    const TensorDesc& pos = *in[2];
    expect_dtype(op, pos, DType::i32, "position");
    if (pos.shape != Shape{B, 1})
      op_error(op,
               fmt::format("position '{}' {} must be [{}, 1]", pos.name, shape_str(pos.shape), B));
    return {OutSpec{in[0]->dtype, Shape{B, 1, C}}};
  };
  a.flops = [](InDescs in, InDescs, const Attrs&) {
    return 4.0 * numel(in[1]) / 2.0;  // at most every cached position: q·k and p·v
  };
  // The cache is read (at most up to the position) but written at one
  // position only, so not priced as a whole tensor written, as `mutates` is.
  a.bytes = [](InDescs in, InDescs out, const Attrs&) {
    const TensorDesc& cache = *in[1];
    const double written = static_cast<double>(cache.shape[0] * cache.shape[2]) *
                           static_cast<double>(dtype_size(cache.dtype));
    return op_bytes(in, out) + written;
  };
  r.add(std::move(a));
}

// x[..., C] float, W[V, C], class ids i32[...] (x's shape without its last
// dimension).
void check_lm_head(std::string_view op, InDescs in) {
  const TensorDesc& x = *in[0];
  const TensorDesc& w = *in[1];
  const TensorDesc& t = *in[2];
  if (x.shape.size() < 2 || x.shape.size() > static_cast<size_t>(kern::kMaxDims))
    op_error(op, fmt::format("input '{}' must have 2 to {} dimensions ([..., C]), got {}", x.name,
                             kern::kMaxDims, shape_str(x.shape)));
  expect_float(op, x, "input");
  expect_rank(op, w, 2, "weight");
  expect_dtype(op, w, x.dtype, "weight");
  expect_dim(op, w, 1, "weight", x, static_cast<int>(x.shape.size()) - 1, "input");
  if (static_cast<double>(w.shape[0]) > kInt32Max)
    op_error(op, fmt::format("weight '{}' {}: more classes than i32 class ids can name", w.name,
                             shape_str(w.shape)));
  expect_dtype(op, t, DType::i32, "class ids");
  const Shape lead(x.shape.begin(), x.shape.end() - 1);
  if (t.shape != lead)
    op_error(op,
             fmt::format("class ids '{}' {} must have the shape {} of input '{}' {} without "
                         "its last dimension",
                         t.name, shape_str(t.shape), shape_str(lead), x.name, shape_str(x.shape)));
}

void add_lm_head(OpRegistry& r) {
  OpDef l;
  l.name = "linear_xent_index";
  l.min_inputs = l.max_inputs = 3;
  l.is_loss = true;
  // Output 1 is each row's log-sum-exp over the vocabulary (0 on rows that
  // do not count), saved for the backward pass so that it computes the
  // logits once instead of twice: [rows] floats against [rows × V] logits.
  l.infer = [](InDescs in, const Attrs&) -> std::vector<OutSpec> {
    check_lm_head("linear_xent_index", in);
    return {OutSpec{in[0]->dtype, Shape{}}, OutSpec{in[0]->dtype, in[2]->shape}};
  };
  // The logits (2·rows·V·C) and the softmax over them (about 4 per logit).
  l.flops = [](InDescs in, InDescs, const Attrs&) {
    const double rows = numel(in[2]), V = static_cast<double>(in[1]->shape[0]);
    return rows * V * (2.0 * static_cast<double>(in[0]->shape.back()) + 4.0);
  };
  // The class ids are data: x and W get gradients, both from one op.
  l.backward = [](Graph& g, const Node& fwd, std::span<const TensorId>,
                  const std::vector<char>& needs, std::span<TensorId> dx) {
    if (!needs[0] && !needs[1]) return;
    const TensorId x = fwd.inputs[0], w = fwd.inputs[1];
    // A frozen W (LoRA's tied embedding) gets no [V, C] gradient: an empty
    // one, and a third less work.
    Attrs a{{"scale", 1.0}};
    if (!needs[1]) a.set("weight_grad", 0.0);
    std::vector<TensorId> in = fwd.inputs;
    in.push_back(fwd.outputs[1]);  // the saved log-sum-exp
    const std::vector<TensorId> d = g.add_op("linear_xent_index_grad", std::move(in), a,
                                             {grad_name(g, x), grad_name(g, w)}, Role::gradient);
    if (needs[0]) dx[0] = d[0];
    if (needs[1]) dx[1] = d[1];
  };
  r.add(std::move(l));

  OpDef lg;
  lg.name = "linear_xent_index_grad";
  lg.min_inputs = lg.max_inputs = 4;
  lg.infer = [](InDescs in, const Attrs& attrs) -> std::vector<OutSpec> {
    const std::string_view op = "linear_xent_index_grad";
    check_lm_head(op, in);
    const TensorDesc& lse = *in[3];
    expect_dtype(op, lse, in[0]->dtype, "log-sum-exp");
    if (lse.shape != in[2]->shape)
      op_error(op, fmt::format("log-sum-exp '{}' {} must have the shape {} of the class ids",
                               lse.name, shape_str(lse.shape), shape_str(in[2]->shape)));
    const double s = attrs.get("scale", 1.0);
    if (!std::isfinite(s)) op_error(op, fmt::format("attribute scale must be finite, got {}", s));
    const double wg = attrs.get("weight_grad", 1.0);
    if (wg != 0.0 && wg != 1.0)
      op_error(op, fmt::format("attribute weight_grad = {} must be 0 or 1", wg));
    // weight_grad 0: dW is empty [0, C] (W is frozen), and not computed.
    const Shape dw = wg != 0.0 ? in[1]->shape : Shape{0, in[1]->shape[1]};
    return {OutSpec{in[0]->dtype, in[0]->shape}, OutSpec{in[1]->dtype, dw}};
  };
  // The logits once (the normaliser is the saved lse), then dx and dW.
  lg.flops = [](InDescs in, InDescs out, const Attrs&) {
    const double rows = numel(in[2]), V = static_cast<double>(in[1]->shape[0]);
    const double gemms = out[1]->numel() > 0 ? 6.0 : 4.0;
    return rows * V * (gemms * static_cast<double>(in[0]->shape.back()) + 8.0);
  };
  r.add(std::move(lg));
}

}  // namespace

void register_lm_ops(OpRegistry& r) {
  add_embedding(r);
  add_gelu_tanh(r);
  add_attention(r);
  add_attention_decode(r);
  add_lm_head(r);
}

}  // namespace pooch
