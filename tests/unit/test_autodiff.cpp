#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "kernels/ref/ref_kernels.h"
#include "runtime/core/autodiff.h"
#include "runtime/core/error.h"
#include "runtime/core/op_registry.h"

using namespace pooch;

namespace {

TensorId weight(Graph& g, const char* name, Shape s, bool trainable = true) {
  TensorDesc d{name, DType::f32, std::move(s), Role::weight};
  d.trainable = trainable;
  return g.add_tensor(d);
}

int count_ops(const Graph& g, const char* op) {
  return static_cast<int>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

}  // namespace

TEST(Autodiff, GradientsForEveryTrainableWeightOnThePath) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {4, 3}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f32, {4, 2}, Role::input});
  const TensorId w1 = weight(g, "w1", {5, 3}), b1 = weight(g, "b1", {5});
  const TensorId w2 = weight(g, "w2", {2, 5}), b2 = weight(g, "b2", {2});
  const TensorId frozen = weight(g, "frozen", {7}, false);
  (void)frozen;
  TensorId h = g.add_op1("linear", {x, w1, b1});
  h = g.add_op1("relu", {h});
  const TensorId y = g.add_op1("linear", {h, w2, b2});
  const TensorId loss = g.add_op1("bce_logits", {y, t});
  const size_t n_fwd = g.nodes().size();
  const auto grads = build_backward(g, loss);
  ASSERT_EQ(grads.size(), 4u);
  for (const WeightGrad& wg : grads) {
    EXPECT_EQ(g.tensor(wg.grad).shape, g.tensor(wg.weight).shape) << g.tensor(wg.weight).name;
    EXPECT_EQ(g.tensor(wg.grad).role, Role::gradient);
  }
  EXPECT_GT(g.nodes().size(), n_fwd);
  // No gradient flows into the data: the first layer needs no input gradient.
  EXPECT_EQ(count_ops(g, "linear_grad_input"), 1);
}

TEST(Autodiff, SumsGradientsOfATensorReadTwice) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2, 3}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f32, {2, 3}, Role::input});
  const TensorId w = weight(g, "w", {3, 3});
  const TensorId h = g.add_op1("linear", {x, w});
  const TensorId r = g.add_op1("relu", {h});
  const TensorId s = g.add_op1("add", {h, r});  // h feeds two ops
  const TensorId loss = g.add_op1("squared_hinge", {s, t});
  const int adds_before = count_ops(g, "add");
  const auto grads = build_backward(g, loss);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(count_ops(g, "add"), adds_before + 1);
}

TEST(Autodiff, RequiresALossOp) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2, 3}, Role::input});
  const TensorId w = weight(g, "w", {3, 3});
  const TensorId y = g.add_op1("linear", {x, w});
  try {
    build_backward(g, y);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("loss"), std::string::npos);
  }
}

TEST(Autodiff, RowSparseGradientForTheSparseInputLayer) {
  Graph g;
  const TensorId ptr = g.add_tensor({"ptr", DType::i32, {5}, Role::input});
  const TensorId idx = g.add_tensor({"idx", DType::i32, {20}, Role::input});
  const TensorId val = g.add_tensor({"val", DType::f32, {20}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f32, {4, 6}, Role::input});
  const TensorId w = weight(g, "w", {100, 8}), b = weight(g, "b", {8});
  const TensorId h = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId y = g.add_op1("linear", {g.add_op1("relu", {h}), weight(g, "w2", {6, 8})});
  const auto grads = build_backward(g, g.add_op1("bce_logits", {y, t}));
  bool found = false;
  for (const WeightGrad& wg : grads)
    if (wg.weight == w) {
      found = true;
      EXPECT_NE(g.tensor(wg.grad).sparse_rows, kNoTensor);
    }
  EXPECT_TRUE(found);
}

// ---- gradients of a weight read twice, checked by numbers -------------------------

namespace {

// Runs a graph's nodes with the reference kernels. Float tensors are f64
// (the reference kernels take it), so finite differences are accurate.
class RefRun {
 public:
  explicit RefRun(const Graph& g) : g_(g), buf_(g.num_tensors()) {
    for (size_t t = 0; t < g.num_tensors(); ++t)
      buf_[t].assign((g.tensor(static_cast<TensorId>(t)).bytes() + 7) / 8, 0.0);
  }

  template <class T>
  T* data(TensorId t) {
    return reinterpret_cast<T*>(buf_[static_cast<size_t>(t)].data());
  }

  void run(size_t first, size_t last) {
    for (size_t n = first; n < last; ++n) {
      const Node& nd = g_.nodes()[n];
      const kern::KernelVariant* k = nullptr;
      for (const kern::KernelVariant& v : kern::ref_kernels())
        if (nd.op == v.op) k = &v;
      ASSERT_NE(k, nullptr) << nd.op;
      kern::KernelArgs a;
      a.n_in = static_cast<int>(nd.inputs.size());
      a.n_out = static_cast<int>(nd.outputs.size());
      for (int i = 0; i < a.n_in; ++i) a.in[i] = view(nd.inputs[static_cast<size_t>(i)]);
      for (int i = 0; i < a.n_out; ++i) a.out[i] = view(nd.outputs[static_cast<size_t>(i)]);
      for (const auto& [name, v] : nd.attrs.items()) ASSERT_TRUE(a.attrs.set(name.c_str(), v));
      std::vector<double> ws(k->workspace ? (k->workspace(a) + 7) / 8 : 0);
      a.workspace = ws.data();
      a.workspace_bytes = ws.size() * 8;
      a.ctx = &ctx_;
      k->fn(a);
    }
  }

 private:
  kern::TensorView view(TensorId t) {
    const TensorDesc& d = g_.tensor(t);
    kern::TensorView v;
    v.data = buf_[static_cast<size_t>(t)].data();
    v.dtype = d.dtype;
    v.ndim = static_cast<int>(d.shape.size());
    for (int i = 0; i < v.ndim; ++i) v.shape[i] = d.shape[static_cast<size_t>(i)];
    return v;
  }

  const Graph& g_;
  std::vector<std::vector<double>> buf_;
  kern::KernelContext ctx_;
};

TensorId weight64(Graph& g, const char* name, Shape s) {
  TensorDesc d{name, DType::f64, std::move(s), Role::weight};
  d.trainable = true;
  return g.add_tensor(d);
}

void fill(RefRun& run, const Graph& g, TensorId t, double scale, uint32_t seed) {
  double* p = run.data<double>(t);
  for (int64_t i = 0; i < g.tensor(t).numel(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = scale * (static_cast<double>(seed >> 8) / 16777216.0 - 0.5);
  }
}

// Compares the backward pass's gradient of `w` with central differences of
// the loss (the forward nodes [0, n_fwd) rerun at w ± h).
void expect_gradient_matches(const Graph& g, RefRun& run, size_t n_fwd, TensorId loss, TensorId w,
                             TensorId grad) {
  run.run(0, g.nodes().size());
  const int64_t n = g.tensor(w).numel();
  const std::vector<double> an(run.data<double>(grad), run.data<double>(grad) + n);
  double* wp = run.data<double>(w);
  for (int64_t i = 0; i < n; ++i) {
    const double w0 = wp[i], h = 1e-6;
    wp[i] = w0 + h;
    run.run(0, n_fwd);
    const double lp = *run.data<double>(loss);
    wp[i] = w0 - h;
    run.run(0, n_fwd);
    const double lm = *run.data<double>(loss);
    wp[i] = w0;
    const double fd = (lp - lm) / (2 * h);
    EXPECT_NEAR(an[static_cast<size_t>(i)], fd, 1e-7 * std::max(1.0, std::fabs(fd)))
        << g.tensor(w).name << " element " << i;
  }
}

}  // namespace

// Tied embeddings: one weight W[F,O] is the sparse input layer's weight (a
// row-sparse gradient over the batch's features) and the output projection
// of a linear layer (a dense gradient). The two are summed into one dense
// gradient, checked element by element against finite differences, rows
// outside the batch included.
TEST(Autodiff, TiedSparseAndDenseGradientsSumToOneDenseGradient) {
  Graph g;
  const int64_t B = 3, F = 6, O = 4, N = 7;
  const TensorId ptr = g.add_tensor({"ptr", DType::i32, {B + 1}, Role::input});
  const TensorId idx = g.add_tensor({"idx", DType::i32, {N}, Role::input});
  const TensorId val = g.add_tensor({"val", DType::f64, {N}, Role::input});
  const TensorId cls = g.add_tensor({"cls", DType::i32, {B}, Role::input});
  const TensorId w = weight64(g, "emb", {F, O}), b = weight64(g, "b", {O});
  const TensorId h = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId logits = g.add_op1("linear", {g.add_op1("gelu", {h}), w});
  const TensorId loss = g.add_op1("softmax_xent_index", {logits, cls});
  const size_t n_fwd = g.nodes().size();
  const auto grads = build_backward(g, loss);

  TensorId gw = kNoTensor, gb = kNoTensor;
  for (const WeightGrad& wg : grads) (wg.weight == w ? gw : gb) = wg.grad;
  ASSERT_NE(gw, kNoTensor);
  ASSERT_NE(gb, kNoTensor);
  EXPECT_EQ(g.tensor(gw).sparse_rows, kNoTensor);  // dense: the optimizer updates it densely
  EXPECT_EQ(g.tensor(gw).shape, g.tensor(w).shape);
  EXPECT_EQ(count_ops(g, "scatter_add_rows"), 1);

  RefRun run(g);
  const int32_t p[] = {0, 2, 3, 5};
  // Features 2 and 3 are in no row: their gradient comes from the output
  // projection alone. The tail past ptr[B] is never read.
  const int32_t ids[] = {1, 4, 4, 0, 5, 2, 3};
  const int32_t c[] = {2, -1, 5};  // row 1 is padding
  std::copy(std::begin(p), std::end(p), run.data<int32_t>(ptr));
  std::copy(std::begin(ids), std::end(ids), run.data<int32_t>(idx));
  std::copy(std::begin(c), std::end(c), run.data<int32_t>(cls));
  fill(run, g, val, 2.0, 1);
  fill(run, g, w, 1.5, 2);
  fill(run, g, b, 0.5, 3);
  expect_gradient_matches(g, run, n_fwd, loss, w, gw);
  expect_gradient_matches(g, run, n_fwd, loss, b, gb);
}

// Two dense uses of one weight: the gradients are added.
TEST(Autodiff, WeightReadTwiceDenselyGetsTheSumOfBothGradients) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f64, {2, 3}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f64, {2, 3}, Role::input});
  const TensorId w = weight64(g, "w", {3, 3});
  const TensorId y = g.add_op1("linear", {g.add_op1("linear", {x, w}), w});
  const TensorId loss = g.add_op1("bce_logits", {y, t});
  const size_t n_fwd = g.nodes().size();
  const int adds_before = count_ops(g, "add");
  const auto grads = build_backward(g, loss);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(count_ops(g, "add"), adds_before + 1);
  RefRun run(g);
  fill(run, g, x, 2.0, 4);
  fill(run, g, w, 1.0, 5);
  double* tv = run.data<double>(t);
  for (int i = 0; i < 6; ++i) tv[i] = i % 2;
  expect_gradient_matches(g, run, n_fwd, loss, w, grads[0].grad);
}

// The weight of two sparse layers, also read densely before them: the two
// row-sparse gradients arrive first (the backward pass walks the graph from
// the end) and wait for the dense one, into which both are added.
TEST(Autodiff, TwoRowSparseGradientsAreAddedIntoALaterDenseOne) {
  Graph g;
  const int64_t B = 2, F = 5, O = 3, N = 4;
  const TensorId ptr = g.add_tensor({"ptr", DType::i32, {B + 1}, Role::input});
  const TensorId idx = g.add_tensor({"idx", DType::i32, {N}, Role::input});
  const TensorId val = g.add_tensor({"val", DType::f64, {N}, Role::input});
  const TensorId x = g.add_tensor({"x", DType::f64, {B, O}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f64, {B, O}, Role::input});
  const TensorId w = weight64(g, "emb", {F, O}), b = weight64(g, "b", {O});
  const TensorId v = weight64(g, "v", {O, F});
  const TensorId u = g.add_op1("linear", {g.add_op1("linear", {x, w}), v});  // w read densely
  const TensorId h1 = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId h2 = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId s = g.add_op1("add", {g.add_op1("add", {h1, g.add_op1("gelu", {h2})}), u});
  const TensorId loss = g.add_op1("bce_logits", {s, t});
  const size_t n_fwd = g.nodes().size();
  const auto grads = build_backward(g, loss);
  TensorId gw = kNoTensor;
  for (const WeightGrad& wg : grads)
    if (wg.weight == w) gw = wg.grad;
  ASSERT_NE(gw, kNoTensor);
  EXPECT_EQ(g.tensor(gw).sparse_rows, kNoTensor);
  EXPECT_EQ(count_ops(g, "scatter_add_rows"), 2);

  RefRun run(g);
  const int32_t p[] = {0, 2, 3};
  const int32_t ids[] = {3, 0, 3, 1};
  std::copy(std::begin(p), std::end(p), run.data<int32_t>(ptr));
  std::copy(std::begin(ids), std::end(ids), run.data<int32_t>(idx));
  fill(run, g, val, 2.0, 6);
  fill(run, g, x, 2.0, 7);
  fill(run, g, w, 1.5, 8);
  fill(run, g, b, 0.5, 9);
  fill(run, g, v, 1.0, 10);
  double* tv = run.data<double>(t);
  for (int i = 0; i < B * O; ++i) tv[i] = i % 2;
  expect_gradient_matches(g, run, n_fwd, loss, w, gw);
}

// Two sparse layers sharing one weight, read by nothing dense: refused with
// the weight's name.
TEST(Autodiff, RowSparseGradientsAloneAreRefused) {
  Graph g;
  const TensorId ptr = g.add_tensor({"ptr", DType::i32, {3}, Role::input});
  const TensorId idx = g.add_tensor({"idx", DType::i32, {4}, Role::input});
  const TensorId val = g.add_tensor({"val", DType::f32, {4}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f32, {2, 5}, Role::input});
  const TensorId w = weight(g, "shared", {10, 5}), b = weight(g, "b", {5});
  const TensorId h1 = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId h2 = g.add_op1("sparse_linear", {ptr, idx, val, w, b});
  const TensorId loss = g.add_op1("bce_logits", {g.add_op1("add", {h1, h2}), t});
  try {
    build_backward(g, loss);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("shared"), std::string::npos);
  }
}
