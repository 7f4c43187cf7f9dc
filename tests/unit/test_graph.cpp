#include <gtest/gtest.h>

#include "runtime/core/error.h"
#include "runtime/core/graph.h"
#include "runtime/core/op_registry.h"

using namespace pooch;

TEST(Graph, InfersOutputShapesThroughTheRegistry) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {4, 3}, Role::input});
  const TensorId w = g.add_tensor({"w", DType::f32, {5, 3}, Role::weight});
  const TensorId b = g.add_tensor({"b", DType::f32, {5}, Role::weight});
  const TensorId y = g.add_op1("linear", {x, w, b}, {}, "y");
  EXPECT_EQ(g.tensor(y).shape, (Shape{4, 5}));
  EXPECT_EQ(g.tensor(y).role, Role::activation);
  EXPECT_EQ(g.tensor(y).bytes(), 4u * 5u * 4u);
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0].op, "linear");
  EXPECT_EQ(*g.find("y"), y);
}

TEST(Graph, ShapeMismatchNamesTheOp) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {4, 3}, Role::input});
  const TensorId w = g.add_tensor({"w", DType::f32, {5, 7}, Role::weight});
  try {
    g.add_op1("linear", {x, w});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(g.nodes().empty());
}

TEST(Graph, RejectsDuplicateNamesUnknownOpsAndWrongArity) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2}, Role::input});
  EXPECT_THROW(g.add_tensor({"x", DType::f32, {2}, Role::input}), Error);
  try {
    g.add_op1("no_such_op", {x});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("no_such_op"), std::string::npos);
  }
  EXPECT_THROW(g.add_op1("relu", {x, x}), Error);
  EXPECT_THROW(g.add_tensor({"neg", DType::f32, {2, -1}, Role::input}), Error);
}

TEST(Graph, UniqueNamesAndOutputs) {
  Graph g;
  g.add_tensor({"a", DType::f32, {1}, Role::input});
  EXPECT_EQ(g.unique_name("b"), "b");
  EXPECT_NE(g.unique_name("a"), "a");
  const TensorId x = g.add_tensor({"x", DType::f32, {3}, Role::input});
  const TensorId y = g.add_op1("relu", {x});
  g.mark_output(y);
  g.mark_output(y);
  EXPECT_EQ(g.outputs(), std::vector<TensorId>{y});
}

TEST(Attrs, GetRequireAndDefaults) {
  Attrs a{{"p", 0.25}};
  a.set("key", 7);
  EXPECT_DOUBLE_EQ(a.get("p", 0), 0.25);
  EXPECT_EQ(a.geti("key", 0), 7);
  EXPECT_DOUBLE_EQ(a.get("missing", 3.5), 3.5);
  EXPECT_THROW(a.require("dropout", "eps"), Error);
}

TEST(OpRegistry, EveryOpIsDescribed) {
  // The op families of docs/OPS.md are all registered, each with shape
  // inference; differentiable forward ops have backward builders.
  for (const char* op : {"linear", "relu", "gelu", "dropout", "layernorm", "add", "sparse_linear",
                         "ffi_linear", "bce_logits", "squared_hinge", "softmax_xent"}) {
    const OpDef* d = op_registry().find(op);
    ASSERT_NE(d, nullptr) << op;
    EXPECT_TRUE(static_cast<bool>(d->backward)) << op;
  }
  for (const char* op :
       {"topk", "sgd_update", "adam_update", "sgd_update_rows", "adam_update_rows"})
    ASSERT_NE(op_registry().find(op), nullptr) << op;
  EXPECT_FALSE(op_registry().get("adam_update").mutates.empty());
  EXPECT_TRUE(op_registry().get("bce_logits").is_loss);
}

TEST(Graph, RejectsTensorsTooLargeToAddress) {
  // The byte size must not wrap: the arena is sized from it.
  Graph g;
  const int64_t big = int64_t{1} << 40;
  try {
    g.add_tensor({"huge", DType::f32, {big, big}, Role::input});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("'huge'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2^62"), std::string::npos) << e.what();
  }
  // A zero dimension after the others does not hide their product.
  EXPECT_THROW(g.add_tensor({"empty", DType::f32, {big, big, 0}, Role::input}), Error);
  // An op whose inferred output is too large fails the same way.
  const TensorId x = g.add_tensor({"x", DType::f32, {int64_t{1} << 33, 4}, Role::input});
  const TensorId w = g.add_tensor({"w", DType::f32, {int64_t{1} << 31, 4}, Role::weight});
  EXPECT_THROW(g.add_op1("linear", {x, w}), Error);
  EXPECT_TRUE(g.nodes().empty());
  // The largest f32 tensor the bound admits is accepted.
  const int64_t edge = int64_t{1} << 30;
  EXPECT_NO_THROW(g.add_tensor({"edge", DType::f32, {edge, edge}, Role::input}));
}

TEST(Graph, LinearAndLayernormTakeLeadingDimensionsAsRows) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2, 3, 4}, Role::input});
  const TensorId w = g.add_tensor({"w", DType::f32, {5, 4}, Role::weight});
  const TensorId y = g.add_op1("linear", {x, w}, {}, "y");
  EXPECT_EQ(g.tensor(y).shape, (Shape{2, 3, 5}));
  const TensorId gamma = g.add_tensor({"gamma", DType::f32, {5}, Role::weight});
  const TensorId beta = g.add_tensor({"beta", DType::f32, {5}, Role::weight});
  const std::vector<TensorId> ln = g.add_op("layernorm", {y, gamma, beta}, {});
  EXPECT_EQ(g.tensor(ln[0]).shape, (Shape{2, 3, 5}));
  EXPECT_EQ(g.tensor(ln[1]).shape, (Shape{2, 3}));  // mean and rstd per row
  EXPECT_EQ(g.tensor(ln[2]).shape, (Shape{2, 3}));
  // The gradient ops follow: dW from dy[2,3,5] and x[2,3,4].
  const TensorId dy = g.add_tensor({"dy", DType::f32, {2, 3, 5}, Role::input});
  const std::vector<TensorId> gw = g.add_op("linear_grad_weight", {dy, x}, {});
  EXPECT_EQ(g.tensor(gw[0]).shape, (Shape{5, 4}));
  EXPECT_EQ(g.tensor(g.add_op1("linear_grad_input", {dy, w})).shape, (Shape{2, 3, 4}));
  // Leading dimensions must agree; a rank-1 input is not a matrix.
  const TensorId x2 = g.add_tensor({"x2", DType::f32, {3, 2, 4}, Role::input});
  EXPECT_THROW(g.add_op("linear_grad_weight", {dy, x2}, {}), Error);
  const TensorId v = g.add_tensor({"v", DType::f32, {4}, Role::input});
  EXPECT_THROW(g.add_op1("linear", {v, w}), Error);
}

TEST(Graph, ReshapeInfersOneDimensionAndKeepsTheElementCount) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2, 3, 4}, Role::input});
  const Attrs flat{{"rank", 2}, {"d0", -1}, {"d1", 4}};
  EXPECT_EQ(g.tensor(g.add_op1("reshape", {x}, flat)).shape, (Shape{6, 4}));
  EXPECT_THROW(g.add_op1("reshape", {x}, {{"rank", 2}, {"d0", -1}, {"d1", -1}}), Error);
  EXPECT_THROW(g.add_op1("reshape", {x}, {{"rank", 2}, {"d0", 5}, {"d1", 5}}), Error);
  EXPECT_THROW(g.add_op1("reshape", {x}, {{"rank", 1}, {"d0", -1}, {"d1", 4}}), Error);
  EXPECT_THROW(g.add_op1("reshape", {x}, {{"rank", 2}, {"d0", -1}, {"d1", 5}}), Error);
  EXPECT_THROW(g.add_op1("reshape", {x}, {{"rank", 5}}), Error);
  const OpDef& def = op_registry().get("reshape");
  ASSERT_TRUE(static_cast<bool>(def.view));
  const TensorDesc xd = g.tensor(x);
  const TensorDesc* in[] = {&xd};
  EXPECT_TRUE(def.view(in, flat));
}

TEST(Graph, TransposeIsAViewOnlyWhenSizeOneDimensionsMove) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {3, 1, 4}, Role::input});
  const Attrs swap01{{"p0", 1}, {"p1", 0}, {"p2", 2}};
  const Attrs swap02{{"p0", 2}, {"p1", 1}, {"p2", 0}};
  EXPECT_EQ(g.tensor(g.add_op1("transpose", {x}, swap01)).shape, (Shape{1, 3, 4}));
  EXPECT_EQ(g.tensor(g.add_op1("transpose", {x}, swap02)).shape, (Shape{4, 1, 3}));
  EXPECT_THROW(g.add_op1("transpose", {x}, {{"p0", 0}, {"p1", 0}, {"p2", 2}}), Error);
  EXPECT_THROW(g.add_op1("transpose", {x}, {{"p0", 0}, {"p1", 1}}), Error);
  EXPECT_THROW(g.add_op1("transpose", {x}, {{"p0", 0}, {"p1", 1}, {"p2", 3}}), Error);
  EXPECT_THROW(g.add_op1("transpose", {x}, {{"p0", 0}, {"p1", 1}, {"p2", 2}, {"p3", 3}}), Error);
  const OpDef& def = op_registry().get("transpose");
  ASSERT_TRUE(static_cast<bool>(def.view));
  const TensorDesc xd = g.tensor(x);
  const TensorDesc* in[] = {&xd};
  EXPECT_TRUE(def.view(in, swap01));   // moves only the size-1 dimension
  EXPECT_FALSE(def.view(in, swap02));  // 3 and 4 swap places
}
