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
