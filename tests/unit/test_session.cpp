// Schedules, kernel choice and the generic session: what each program copies,
// a node launched twice with two argument sets, supports() and determinism
// refusals, inputs by name, and an mlp model trained through a Session.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/core/op_registry.h"
#include "runtime/models/mlp.h"
#include "runtime/models/xmc.h"
#include "runtime/plan/planner.h"
#include "runtime/session/session.h"
#include "runtime/train/model_io.h"

using namespace pooch;

namespace {

std::vector<std::string> names(const Graph& g, const std::vector<TensorId>& ids) {
  std::vector<std::string> out;
  for (TensorId t : ids) out.push_back(g.tensor(t).name);
  std::sort(out.begin(), out.end());
  return out;
}

SessionConfig cpu_config() {
  SessionConfig c;
  c.device = DeviceKind::cpu;
  c.threads = 1;
  return c;
}

TEST(Schedule, EachProgramCopiesOnlyWhatItReadsAndWrites) {
  ModelSpec spec = spec_from_flags(InputKind::sparse, 100, 20, 16, 0, 4, LossKind::bce, 0);
  spec.run.batch = 8;
  Session s(build_xmc_model(spec), cpu_config());
  const Graph& g = s.graph();
  const Schedule* fwd = s.schedule(ProgramKind::forward);
  const Schedule* train = s.schedule(ProgramKind::train_step);
  ASSERT_TRUE(fwd && train);
  // Prediction needs no labels and computes no loss: neither is copied.
  EXPECT_EQ(names(g, fwd->copied_in),
            (std::vector<std::string>{"batch.idx", "batch.ptr", "batch.val"}));
  EXPECT_EQ(names(g, fwd->copied_out), (std::vector<std::string>{"top.indices", "top.values"}));
  EXPECT_FALSE(fwd->training);
  // A train step reads the labels and returns the loss alone.
  EXPECT_EQ(names(g, train->copied_in),
            (std::vector<std::string>{"batch.idx", "batch.lidx", "batch.lptr", "batch.ptr",
                                      "batch.val"}));
  // (computed by ffi_loss_grad with the gradient; staged where "loss" is)
  EXPECT_EQ(names(g, train->copied_out), (std::vector<std::string>{"loss.again"}));
  EXPECT_TRUE(train->training);
  for (const Launch& l : fwd->launches) {
    EXPECT_NE(g.nodes()[l.node].op, "bce_logits_csr");
    EXPECT_NE(g.nodes()[l.node].op, "ffi_loss");
  }
}

TEST(Schedule, ANodeRunsTwiceWithTwoArgumentSets) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {4}, Role::input});
  const TensorId y = g.add_op1("relu", {x}, {}, "y");
  // Two persistent buffers for the second launch's operands.
  const TensorId a = g.add_tensor({"a", DType::f32, {4}, Role::weight});
  const TensorId b = g.add_tensor({"b", DType::f32, {4}, Role::weight});
  auto backend = make_cpu_backend({});
  const SessionLayout layout = plan_session_layout(g, {x, y}, backend->caps().alignment);
  ProgramRequest rq;
  rq.nodes = select_nodes(g, {y}, false);
  rq.outputs = {y};
  Schedule s = plan_schedule(g, rq, *backend, layout, {});
  ASSERT_EQ(s.launches.size(), 1u);
  Launch again = s.launches[0];
  again.in_offset[0] = layout.device_offset[static_cast<size_t>(a)];
  again.out_offset[0] = layout.device_offset[static_cast<size_t>(b)];
  s.add_launch(again);
  Executor ex(*backend, s.arena_bytes, s.host_bytes);
  kern::KernelContext ctx;
  const BoundSchedule bound = ex.bind(s, &ctx);
  const float xv[4] = {-1, 2, -3, 4}, av[4] = {5, -6, 7, -8};
  std::memcpy(ex.host_pool() + layout.host_offset[static_cast<size_t>(x)], xv, 16);
  ex.write(layout.device_offset[static_cast<size_t>(a)], av, 16);
  ex.run(bound);
  float yv[4], bv[4];
  std::memcpy(yv, ex.host_pool() + layout.host_offset[static_cast<size_t>(y)], 16);
  ex.read(layout.device_offset[static_cast<size_t>(b)], bv, 16);
  EXPECT_EQ(std::vector<float>(yv, yv + 4), (std::vector<float>{0, 2, 0, 4}));
  EXPECT_EQ(std::vector<float>(bv, bv + 4), (std::vector<float>{5, 0, 7, 0}));
  EXPECT_NE(s.describe(g).find("launch relu"), std::string::npos) << s.describe(g);
}

// A backend whose kernel table the test chooses; only kernels() is asked.
class TableBackend : public Backend {
 public:
  explicit TableBackend(std::vector<kern::KernelVariant> t) : table_(std::move(t)) {}
  const char* name() const override { return "table"; }
  BackendCaps caps() const override { return {}; }
  MemoryInfo memory_info() const override { return {}; }
  void arena_reserve(size_t) override {}
  std::byte* arena_base() const override { return nullptr; }
  void host_pool_reserve(size_t) override {}
  std::byte* host_pool_base() const override { return nullptr; }
  EventId event_create() override { return 0; }
  void event_record(Stream, EventId) override {}
  void stream_wait(Stream, EventId) override {}
  void event_sync(EventId) override {}
  EventId event_create_timed() override { return 0; }
  double event_elapsed(EventId, EventId) override { return 0; }
  void copy_async(Stream, void*, const void*, size_t) override {}
  void launch(Stream, const kern::KernelVariant&, const kern::KernelArgs&) override {}
  void stream_sync(Stream) override {}
  std::span<const kern::KernelVariant> kernels() const override { return table_; }

 private:
  std::vector<kern::KernelVariant> table_;
};

void noop(const kern::KernelArgs&) {}
bool only_f64(const kern::KernelArgs& a) {
  return a.in[0].dtype == DType::f64;
}

TEST(KernelChoice, SupportsAndDeterminismAreAskedAtPlanTime) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {3, 5}, Role::input});
  g.add_op1("relu", {x}, {}, "y");
  const Node& n = g.nodes()[0];
  kern::KernelArgs a;
  a.n_in = a.n_out = 1;
  a.in[0].dtype = a.out[0].dtype = DType::f32;
  a.in[0].ndim = a.out[0].ndim = 2;
  a.in[0].shape[0] = a.out[0].shape[0] = 3;
  a.in[0].shape[1] = a.out[0].shape[1] = 5;

  // The first variant refuses f32: the second, which accepts it, is chosen.
  TableBackend two({{"relu", "f64only", noop, nullptr, true, only_f64},
                    {"relu", "any", noop, nullptr, true, nullptr}});
  EXPECT_STREQ(choose_kernel(two, n, a, true).variant, "any");

  // No variant accepts the operands: the error names the op, shapes and backend.
  TableBackend none({{"relu", "f64only", noop, nullptr, true, only_f64}});
  try {
    choose_kernel(none, n, a, true);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_UNSUPPORTED);
    const std::string m = e.what();
    EXPECT_NE(m.find("relu"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[3,5]"), std::string::npos) << m;
    EXPECT_NE(m.find("table"), std::string::npos) << m;
  }

  // Only a non-deterministic kernel: refused when determinism is asked, taken otherwise.
  TableBackend racy({{"relu", "atomic", noop, nullptr, false, nullptr}});
  EXPECT_STREQ(choose_kernel(racy, n, a, false).variant, "atomic");
  try {
    choose_kernel(racy, n, a, true);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("deterministic"), std::string::npos) << e.what();
  }
}

ModelSpec mlp_spec(LossKind loss, int64_t outputs) {
  ModelSpec s;
  s.family = Family::mlp;
  s.input = InputKind::dense;
  s.input_width = 6;
  s.labels = outputs;
  s.loss = loss;
  s.layers = {{LayerKind::linear, 32, "relu", 0, 0}, {LayerKind::dense_head, 0, "none", 0, 0}};
  s.run.batch = 16;
  return s;
}

TEST(Session, InputsAreCheckedByName) {
  Session s(build_mlp_model(mlp_spec(LossKind::mse, 2)), cpu_config());
  std::vector<float> x(16 * 6);
  EXPECT_NO_THROW(s.set_input("Batch.X", x.data(), 5 * 6 * 4));  // fewer rows, any case
  try {
    s.set_input("batch.x", x.data(), 7);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("batch.x"), std::string::npos) << e.what();
  }
  try {
    s.set_input("batch.z", x.data(), 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch.y"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.set_input("batch.x", DType::i32, {16, 6}, x.data()), Error);
  EXPECT_NO_THROW(s.set_input("batch.x", DType::f32, {3, 6}, x.data()));
  // The forward program reads the features alone.
  EXPECT_EQ(names(s.graph(), s.schedule(ProgramKind::forward)->copied_in),
            (std::vector<std::string>{"batch.x"}));
}

TEST(Session, AnMlpLearnsARegressionWithPartialBatches) {
  SessionConfig cfg = cpu_config();
  cfg.optimizer.lr = 1e-2;
  Session s(build_mlp_model(mlp_spec(LossKind::mse, 2)), cfg);
  const int rows = 200;  // 12 full batches and one of 8 rows
  std::vector<float> x(rows * 6), y(rows * 2);
  for (int r = 0; r < rows; ++r) {
    float sum = 0;
    for (int c = 0; c < 6; ++c) sum += x[r * 6 + c] = std::sin(0.37f * (r * 6 + c));
    y[r * 2] = 0.5f * sum;
    y[r * 2 + 1] = x[r * 6] * x[r * 6 + 1];
  }
  std::vector<double> epoch_loss;
  for (int e = 0; e < 40; ++e) {
    double sum = 0;
    for (int first = 0; first < rows; first += 16) {
      const int n = std::min(16, rows - first);
      s.set_input("batch.x", x.data() + first * 6, static_cast<size_t>(n) * 6 * 4);
      s.set_input("batch.y", y.data() + first * 2, static_cast<size_t>(n) * 2 * 4);
      s.run(ProgramKind::train_step);
      float l;
      s.get_output("loss", &l, 4);
      ASSERT_TRUE(std::isfinite(l));
      sum += l;
    }
    epoch_loss.push_back(sum);
  }
  EXPECT_LT(epoch_loss.back(), 0.2 * epoch_loss.front());
  // Prediction on a partial batch matches the targets roughly.
  s.set_input("batch.x", x.data(), 4 * 6 * 4);
  s.run(ProgramKind::forward);
  std::vector<float> pred(16 * 2);
  s.get_output("prediction", pred.data(), pred.size() * 4);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(pred[i], y[i], 0.35) << i;
}

TEST(Session, AnMlpClassifierIgnoresPaddingRows) {
  SessionConfig cfg = cpu_config();
  cfg.optimizer.lr = 1e-2;
  Session s(build_mlp_model(mlp_spec(LossKind::softmax, 3)), cfg);
  std::vector<float> x(16 * 6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.5f * static_cast<float>(i));
  std::vector<int32_t> cls(16);
  for (int r = 0; r < 16; ++r) cls[r] = r % 3;
  // Ten rows: the padding rows get class -1 and must not change the loss.
  s.set_input("batch.x", x.data(), 10 * 6 * 4);
  s.set_input("batch.class", cls.data(), 10 * 4);
  s.run(ProgramKind::evaluate);
  float l10;
  s.get_output("loss", &l10, 4);
  EXPECT_GT(l10, 0.5f);
  EXPECT_LT(l10, 2.0f);  // about log 3 at the start
  cls[3] = 3;            // no such class
  try {
    s.set_input("batch.class", cls.data(), 10 * 4);
    FAIL() << "accepted class 3 of 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
  }
  cls[3] = 0;
  s.set_input("batch.class", cls.data(), 10 * 4);
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    s.run(ProgramKind::train_step);
    s.get_output("loss", step == 0 ? &first : &last, 4);
  }
  EXPECT_LT(last, 0.1f * first);
}

// A reshape, and a transpose that moves only a size-1 dimension, are views:
// the planner aliases their buffers and launches nothing; a transpose that
// moves data runs its copy kernel. Checked through the schedule's offsets.
TEST(Schedule, ViewsAliasTheirInputAndLaunchNothing) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {2, 6}, Role::input});
  const TensorId h = g.add_op1("relu", {x}, {}, "h");
  const TensorId r = g.add_op1("reshape", {h}, {{"rank", 3}, {"d0", 2}, {"d1", 3}, {"d2", 2}}, "r");
  const TensorId u = g.add_op1("reshape", {r}, {{"rank", 3}, {"d0", 2}, {"d1", 1}, {"d2", 6}}, "u");
  const TensorId v =
      g.add_op1("transpose", {u}, {{"p0", 1}, {"p1", 0}, {"p2", 2}}, "v");  // [1,2,6]
  const TensorId t =
      g.add_op1("transpose", {r}, {{"p0", 0}, {"p1", 2}, {"p2", 1}}, "t");  // [2,2,3]
  g.mark_output(v);
  g.mark_output(t);
  SessionConfig cfg = cpu_config();
  cfg.train = false;
  Session s(std::make_shared<Model>(model_from_graph(std::move(g))), cfg);
  const Schedule& sc = *s.schedule(ProgramKind::forward);
  EXPECT_EQ(sc.tensor_offset[static_cast<size_t>(r)], sc.tensor_offset[static_cast<size_t>(h)]);
  EXPECT_EQ(sc.tensor_offset[static_cast<size_t>(u)], sc.tensor_offset[static_cast<size_t>(h)]);
  EXPECT_EQ(sc.tensor_offset[static_cast<size_t>(v)], sc.tensor_offset[static_cast<size_t>(h)]);
  EXPECT_NE(sc.tensor_offset[static_cast<size_t>(t)], sc.tensor_offset[static_cast<size_t>(h)]);
  std::vector<std::string> ops;
  for (const Launch& l : sc.launches) ops.push_back(s.graph().nodes()[l.node].op);
  EXPECT_EQ(ops, (std::vector<std::string>{"relu", "transpose"}));
  // The aliased buffer lives as long as its last view (v is an output).
  const std::vector<float> xv{1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12};
  s.set_input("x", xv.data(), 48);
  s.run(ProgramKind::forward);
  std::vector<float> vv(12), tv(12);
  s.get_output("v", vv.data(), 48);
  s.get_output("t", tv.data(), 48);
  EXPECT_EQ(vv, (std::vector<float>{1, 0, 3, 0, 5, 0, 7, 0, 9, 0, 11, 0}));
  // t[a][c][b] = r[a][b][c], r = relu(x) as [2,3,2].
  EXPECT_EQ(tv, (std::vector<float>{1, 3, 5, 0, 0, 0, 7, 9, 11, 0, 0, 0}));
}

// A model file carries its graph: a hand-built model (no family, no spec)
// saved and loaded again runs the same, with the same named inputs and outputs.
TEST(ModelFile, AModelWithoutAFamilyLoadsFromItsGraph) {
  Graph g;
  const TensorId x = g.add_tensor({"in", DType::f32, {4, 3}, Role::input});
  TensorDesc wd{"w", DType::f32, {2, 3}, Role::weight};
  wd.trainable = true;
  const TensorId w = g.add_tensor(wd);
  const TensorId y = g.add_op1("gelu", {g.add_op1("linear", {x, w})}, {}, "out");
  g.mark_output(y);
  Model m = model_from_graph(std::move(g));
  m.init["w"] = {WeightInit::Kind::uniform, 0.5, 7};
  m.inputs[0].batch_dim = 0;
  SessionConfig cfg = cpu_config();
  cfg.train = false;
  Session a(std::make_shared<Model>(m), cfg);
  const std::vector<float> xv{1, 2, 3, -1, 0.5f, 2};
  a.set_input("in", xv.data(), xv.size() * 4);  // two rows of four
  a.run(ProgramKind::forward);
  std::vector<float> ya(8), yb(8);
  a.get_output("out", ya.data(), 32);
  const std::string path = ::testing::TempDir() + "generic.pooch";
  save_session(a, path, false);
  LoadedFile f = load_model_file(path);
  EXPECT_FALSE(f.has_spec);
  ASSERT_TRUE(f.model);
  EXPECT_EQ(f.model->inputs.size(), 1u);
  EXPECT_EQ(f.model->inputs[0].batch_dim, 0);
  Session b(f.model, cfg);
  restore_tensors(b, f.file, false);
  b.set_input("in", xv.data(), xv.size() * 4);
  b.run(ProgramKind::forward);
  b.get_output("out", yb.data(), 32);
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya[0], 0.0f);
  std::remove(path.c_str());
}

}  // namespace
