// The fused fixed fan-in output layer (ffi_loss, ffi_topk) in a model: the
// same losses, weights and predictions as the unfused reference path
// (ffi_linear, then the label-CSR loss and topk) for every loss, and no
// [batch, labels] tensor anywhere in the fused model's graph; a train step's
// loss comes from ffi_loss_grad, bitwise ffi_loss's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "formats/xmc_data.h"
#include "runtime/core/error.h"
#include "runtime/core/graph.h"
#include "runtime/models/xmc.h"
#include "runtime/train/xmc_session.h"

using namespace pooch;

namespace {

constexpr int64_t kF = 300, kL = 70, kH = 40, kK = 8, kB = 16;

ModelSpec spec(LossKind loss, bool fused) {
  ModelSpec s = spec_from_flags(InputKind::sparse, kF, kL, kH, 0, kK, loss, 0);
  s.run.batch = kB;
  s.fused_head = fused;
  return s;
}

std::vector<float> floats(const XmcSession& s, const std::string& name) {
  const auto b = s.read(name);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

BatchView batch_of(const XmcDataset& d, int64_t first, int64_t rows) {
  BatchView b;
  b.rows = rows;
  b.row_ptr = d.row_ptr.data() + first;
  b.col = d.col.data();
  b.val = d.val.data();
  b.label_ptr = d.label_ptr.data() + first;
  b.label = d.label.data();
  return b;
}

XmcDataset planted(int64_t rows) {
  PlantedParams pp;
  pp.rows = rows;
  pp.features = kF;
  pp.labels = kL;
  return make_planted(pp);
}

SessionConfig two_threads() {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  return cfg;
}

class FusedHead : public ::testing::TestWithParam<LossKind> {};

TEST_P(FusedHead, TrainsAndPredictsAsTheUnfusedLayer) {
  const XmcDataset d = planted(8 * kB);
  const SessionConfig cfg = two_threads();
  XmcSession fused(build_xmc_model(spec(GetParam(), true)), cfg);
  XmcSession plain(build_xmc_model(spec(GetParam(), false)), cfg);
  // The same initial weights (drawn by tensor id: the fused graph lacks the
  // logits tensor, which comes after every weight).
  for (const char* w : {"fc0.weight", "fc0.bias", "head.weight", "head.bias"})
    ASSERT_EQ(floats(fused, w), floats(plain, w)) << w;
  for (int64_t step = 0; step < 8; ++step) {
    // A short last batch: padding rows take part in neither loss.
    const int64_t rows = step == 7 ? kB - 5 : kB;
    const BatchView b = batch_of(d, step * kB, rows);
    const float lf = fused.train_step(b), lp = plain.train_step(b);
    ASSERT_TRUE(std::isfinite(lf));
    EXPECT_NEAR(lf, lp, 1e-4 * std::fabs(lp) + 1e-5) << "step " << step;
  }
  for (const char* w : {"fc0.weight", "head.weight", "head.bias"}) {
    const std::vector<float> a = floats(fused, w), b = floats(plain, w);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-3 * std::fabs(b[i]) + 1e-4) << w << "[" << i << "]";
  }
  const int k = 5;
  std::vector<int32_t> lf(kB * k), lp(kB * k);
  std::vector<float> sf(kB * k), sp(kB * k);
  fused.predict(batch_of(d, 0, kB), k, lf.data(), sf.data());
  plain.predict(batch_of(d, 0, kB), k, lp.data(), sp.data());
  EXPECT_EQ(lf, lp);
  for (size_t i = 0; i < sf.size(); ++i) EXPECT_NEAR(sf[i], sp[i], 1e-3 * std::fabs(sp[i]) + 1e-4);
}

// A train step runs ffi_loss_grad alone and returns the loss it computes
// along with the gradient: bitwise what ffi_loss (the evaluate program) gives
// for the same batch and weights.
TEST_P(FusedHead, ATrainStepTakesItsLossFromTheGradientOp) {
  const XmcDataset d = planted(4 * kB);
  XmcSession s(build_xmc_model(spec(GetParam(), true)), two_threads());
  Session& ses = s.session();
  auto ops_of = [&](ProgramKind p) {
    std::vector<std::string> ops;
    for (const Launch& l : ses.schedule(p)->launches) ops.push_back(ses.graph().nodes()[l.node].op);
    return ops;
  };
  auto count = [](const std::vector<std::string>& ops, const char* op) {
    return std::count(ops.begin(), ops.end(), op);
  };
  EXPECT_EQ(count(ops_of(ProgramKind::train_step), "ffi_loss"), 0);
  EXPECT_EQ(count(ops_of(ProgramKind::train_step), "ffi_loss_grad"), 1);
  EXPECT_EQ(count(ops_of(ProgramKind::evaluate), "ffi_loss"), 1);
  EXPECT_EQ(count(ops_of(ProgramKind::evaluate), "ffi_loss_grad"), 0);
  for (int64_t step = 0; step < 4; ++step) {
    const int64_t rows = step == 3 ? kB - 3 : kB;
    const BatchView b = batch_of(d, step * kB, rows);
    s.stage(b, true);
    ses.run(ProgramKind::evaluate);
    float evaluated = 0;
    ses.get_output("loss", &evaluated, sizeof evaluated);
    // Another batch's loss in the slot, so that a step that wrote none fails.
    s.stage(batch_of(d, ((step + 1) % 4) * kB, kB - 1), true);
    ses.run(ProgramKind::evaluate);
    float other = 0;
    ses.get_output("loss", &other, sizeof other);
    ASSERT_NE(other, evaluated);
    const float trained = s.train_step(b);
    ASSERT_TRUE(std::isfinite(trained));
    EXPECT_EQ(std::memcmp(&evaluated, &trained, sizeof trained), 0)
        << "step " << step << ": " << evaluated << " evaluated, " << trained << " trained";
  }
}

// The CPU kernels take rows in blocks of 64 or 128 (64 where that fits the
// L2 cache and 128 does not; POOCH_FFI_BLOCK_ROWS sets it): every sum across
// rows is formed per 64 rows at either width, so the losses and weights are
// the same bits. A batch of 150 (three blocks of 64 or two of 128, the last
// padded) and a short last batch.
TEST_P(FusedHead, RowBlocksOf64And128TrainTheSameBits) {
  constexpr int64_t kBig = 150, kSteps = 3;
  const XmcDataset d = planted(kSteps * kBig);
  struct Run {
    std::vector<float> losses, weight, bias, input_weight;
    size_t arena = 0;
  };
  auto run = [&](const char* rows) {
    setenv("POOCH_FFI_BLOCK_ROWS", rows, 1);
    ModelSpec sp = spec(GetParam(), true);
    sp.run.batch = kBig;
    XmcSession s(build_xmc_model(sp), two_threads());
    Run r;
    r.arena = s.session().memory_plan().peak;
    for (int64_t step = 0; step < kSteps; ++step)
      r.losses.push_back(
          s.train_step(batch_of(d, step * kBig, step == kSteps - 1 ? kBig - 7 : kBig)));
    r.weight = floats(s, "head.weight");
    r.bias = floats(s, "head.bias");
    r.input_weight = floats(s, "fc0.weight");
    unsetenv("POOCH_FFI_BLOCK_ROWS");
    return r;
  };
  const Run a = run("64"), b = run("128");
  EXPECT_NE(a.arena, b.arena);  // the widths did differ (192 and 256 padded rows)
  for (float l : a.losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * 4), 0);
  EXPECT_EQ(a.weight, b.weight);
  EXPECT_EQ(a.bias, b.bias);
  EXPECT_EQ(a.input_weight, b.input_weight);
}

// ffi_loss_grad gives the loss only when asked (with_loss = 1, as the
// backward builder asks): files written before that option store the
// three-output form, and their graphs are rebuilt op by op when read.
TEST(FusedHead, TheGradientOpGivesTheLossWhenAsked) {
  Graph g;
  const TensorId h = g.add_tensor({"h", DType::f32, {4, 6}, Role::activation});
  const TensorId index = g.add_tensor({"index", DType::u16, {5, 3}, Role::weight});
  const TensorId w = g.add_tensor({"w", DType::f32, {5, 3}, Role::weight});
  const TensorId b = g.add_tensor({"b", DType::f32, {5}, Role::weight});
  const TensorId lptr = g.add_tensor({"lptr", DType::i32, {5}, Role::input});
  const TensorId lidx = g.add_tensor({"lidx", DType::i32, {7}, Role::input});
  const std::vector<TensorId> in{h, index, w, b, lptr, lidx};
  EXPECT_EQ(g.add_op("ffi_loss_grad", in, {{"loss", 0}}).size(), 3u);
  EXPECT_EQ(g.add_op("ffi_loss_grad", in, {{"loss", 0}, {"with_loss", 0}}).size(), 3u);
  const auto four = g.add_op("ffi_loss_grad", in, {{"loss", 0}, {"with_loss", 1}});
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(g.tensor(four[3]).shape, Shape{});
  EXPECT_THROW(g.add_op("ffi_loss_grad", in, {{"loss", 0}, {"with_loss", 2}}), Error);
}

INSTANTIATE_TEST_SUITE_P(Losses, FusedHead,
                         ::testing::Values(LossKind::bce, LossKind::squared_hinge,
                                           LossKind::softmax));

TEST(FusedHead, NoTensorHoldsTheBatchTimesTheLabels) {
  for (const bool fused : {true, false}) {
    SessionConfig cfg;
    cfg.device = DeviceKind::cpu;
    XmcSession s(build_xmc_model(spec(LossKind::bce, fused)), cfg);
    int64_t full = 0;  // tensors of the training graph shaped [B, L]
    for (const TensorDesc& t : s.session().graph().tensors())
      if (t.shape == Shape{kB, kL}) ++full;
    // The unfused graph has its logits and their gradient; the fused none.
    if (fused)
      EXPECT_EQ(full, 0);
    else
      EXPECT_GE(full, 2);
  }
}

}  // namespace

namespace {

// A wide penultimate layer: up to 65 536 units the head's index is u16, from
// 65 537 on i32 (a u16 cannot address unit 65 536); the fused layer trains
// with either, and an i32 index reaches the units past 2^16.
TEST(FusedHead, IndexIsU16UpTo65536UnitsAndI32Past) {
  for (const int64_t hidden : {int64_t{65536}, int64_t{65537}, int64_t{70000}}) {
    ModelSpec s = spec_from_flags(InputKind::sparse, 6, 5, hidden, 0, 4096, LossKind::bce, 0);
    s.run.batch = 2;
    s.seed = 3;
    SessionConfig cfg;
    cfg.device = DeviceKind::cpu;
    cfg.threads = 2;
    XmcSession x(build_xmc_model(s), cfg);
    const Graph& g = x.session().graph();
    DType dt = DType::f32;
    for (const TensorDesc& t : g.tensors())
      if (t.name == "head.index") dt = t.dtype;
    EXPECT_EQ(dt, hidden <= 65536 ? DType::u16 : DType::i32) << hidden;
    if (hidden == 70000) {
      // 5 labels x 4096 random units of 70 000: some (about 6%) lie past 65 535.
      const auto b = x.read("head.index");
      std::vector<int32_t> idx(b.size() / 4);
      std::memcpy(idx.data(), b.data(), b.size());
      EXPECT_GT(*std::max_element(idx.begin(), idx.end()), 65535);
    }
    const std::vector<int64_t> row_ptr{0, 2, 3};
    const std::vector<int32_t> col{1, 4, 0};
    const std::vector<float> val{0.5f, 1.0f, 2.0f};
    const std::vector<int64_t> label_ptr{0, 1, 3};
    const std::vector<int32_t> label{2, 0, 4};
    BatchView bv;
    bv.rows = 2;
    bv.row_ptr = row_ptr.data();
    bv.col = col.data();
    bv.val = val.data();
    bv.label_ptr = label_ptr.data();
    bv.label = label.data();
    const float first = x.train_step(bv);
    float last = first;
    for (int i = 0; i < 5; ++i) last = x.train_step(bv);
    EXPECT_TRUE(std::isfinite(last));
    EXPECT_LT(last, first) << hidden;
  }
}

}  // namespace
