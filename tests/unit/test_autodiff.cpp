#include <gtest/gtest.h>

#include <algorithm>

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
