#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "formats/xmc_data.h"
#include "runtime/backend/backend.h"
#include "runtime/core/autodiff.h"
#include "runtime/core/error.h"
#include "runtime/exec/executor.h"
#include "runtime/models/xmc.h"
#include "runtime/train/model_io.h"
#include "runtime/train/xmc_session.h"

using namespace pooch;

// The replaced operator new below takes its memory from malloc, so free is
// the matching release; GCC 12 cannot see that once it inlines the pair.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Every operator new in this process is counted, so a test can assert that a
// training step allocates nothing.
static std::atomic<long> g_news{0};
void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
// The nothrow forms too (std::stable_sort's buffer takes one): left to the
// runtime, their memory would come from another allocator than the free
// above returns it to (AddressSanitizer: alloc-dealloc-mismatch).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace {

BatchView view(const XmcDataset& d, int64_t first, int64_t rows) {
  BatchView b;
  b.rows = std::min(rows, d.rows() - first);
  b.row_ptr = d.row_ptr.data() + first;
  b.col = d.col.data();
  b.val = d.val.data();
  b.label_ptr = d.label_ptr.data() + first;
  b.label = d.label.data();
  return b;
}

ModelSpec small_spec() {
  ModelSpec s = spec_from_flags(InputKind::sparse, 300, 50, 32, 0, 8, LossKind::bce, 0.1);
  s.run.batch = 16;
  return s;
}

}  // namespace

// A run whose step fails returns (throwing) only once every stream is idle,
// so that no copy writes into the host pool or the arena after the caller
// has moved on. Here a copy over an emulated link with a latency of 0.2 s is
// followed on its stream by one that marks the host pool, then a record on
// a stream that does not exist fails: the mark is there when run() throws.
TEST(Executor, AFailedStepWaitsForTheCopiesBeforeItThrows) {
  CpuBackendParams p;
  p.link_latency = 0.2;
  const std::unique_ptr<Backend> backend = make_cpu_backend(p);
  Executor ex(*backend, 4096, 4096);
  const uint32_t mark = 0x600dcafe;
  ex.write(1024, &mark, sizeof mark);
  Schedule s;
  ScheduledCopy slow;
  slow.bytes = 256;
  s.add_copy(StepKind::copy_out, Stream::d2h, slow);
  ScheduledCopy marker;
  marker.device_offset = 1024;
  marker.host_offset = 2048;
  marker.bytes = sizeof mark;
  s.add_copy(StepKind::copy_out, Stream::d2h, marker);
  s.steps.push_back({StepKind::record, static_cast<Stream>(7), s.add_event()});
  const BoundSchedule b = ex.bind(s, nullptr);
  EXPECT_THROW(ex.run(b), Error);
  uint32_t got = 0;
  std::memcpy(&got, ex.host_pool() + 2048, sizeof got);
  EXPECT_EQ(got, mark) << "run() threw while a copy was still queued";
}

namespace {
// Sleeps for its attribute "ms" milliseconds: a launch of a known length.
void sleep_ms(const kern::KernelArgs& a) {
  std::this_thread::sleep_for(std::chrono::milliseconds(a.attrs.geti("ms", 0)));
}
const kern::KernelVariant kSleepMs{"test_sleep_ms", "test", sleep_ms, nullptr, true};
}  // namespace

// The profiler's run times every launch and copy by itself, although it
// queues them all as a step does: a launch's time is not the launches'
// before it, nor the copy running beside it.
TEST(Executor, ATimedRunTimesEachLaunchAndCopyByItself) {
  CpuBackendParams p;
  p.link_latency = 0.15;
  const std::unique_ptr<Backend> backend = make_cpu_backend(p);
  Executor ex(*backend, 4096, 4096);
  Schedule s;
  ScheduledCopy out;
  out.bytes = 256;
  s.add_copy(StepKind::copy_out, Stream::d2h, out);
  for (const int ms : {200, 20, 20}) {
    Launch l;
    l.kernel = &kSleepMs;
    ASSERT_TRUE(l.args.attrs.set("ms", ms));
    s.add_launch(l);
  }
  const BoundSchedule b = ex.bind(s, nullptr);
  for (int run = 0; run < 2; ++run) {  // the events are made once and reused
    const StepTimes t = ex.run_timed(b);
    ASSERT_EQ(t.launch_seconds.size(), 3u);
    ASSERT_EQ(t.copy_seconds.size(), 1u);
    EXPECT_GE(t.launch_seconds[0], 0.2);
    // Upper bounds far from the sleeps, so a loaded machine passes, yet
    // below what the launch before (0.2 s) or the copy (0.15 s) would add.
    for (int i = 1; i < 3; ++i) {
      EXPECT_GE(t.launch_seconds[i], 0.02) << "launch " << i;
      EXPECT_LT(t.launch_seconds[i], 0.14) << "launch " << i;
    }
    EXPECT_GE(t.copy_seconds[0], 0.15);
    EXPECT_LT(t.copy_seconds[0], 0.35);
  }
}

// A launch that waits for a copy (a prefetch) is timed from when the wait
// ends: its time is its own, not the copy's.
TEST(Executor, ATimedLaunchAfterAWaitIsTimedWithoutIt) {
  CpuBackendParams p;
  p.link_latency = 0.15;
  const std::unique_ptr<Backend> backend = make_cpu_backend(p);
  Executor ex(*backend, 4096, 4096);
  Schedule s;
  ScheduledCopy in;
  in.bytes = 256;
  s.add_copy(StepKind::copy_in, Stream::h2d, in);
  const int landed = s.add_event();
  s.steps.push_back({StepKind::record, Stream::h2d, landed});
  s.steps.push_back({StepKind::wait, Stream::compute, landed});
  Launch l;
  l.kernel = &kSleepMs;
  ASSERT_TRUE(l.args.attrs.set("ms", 20));
  s.add_launch(l);
  const BoundSchedule b = ex.bind(s, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const StepTimes t = ex.run_timed(b);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(wall, 0.17) << "the launch did not wait for the copy";
  EXPECT_GE(t.launch_seconds[0], 0.02);
  EXPECT_LT(t.launch_seconds[0], 0.14) << "the wait is in the launch's time";
  EXPECT_GE(t.copy_seconds[0], 0.15);
}

TEST(Executor, NoAllocationDuringSteps) {
  PlantedParams pp;
  pp.rows = 256;
  pp.features = 300;
  pp.labels = 50;
  const XmcDataset data = make_planted(pp);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  XmcSession s(build_xmc_model(small_spec()), cfg);
  s.train_step(view(data, 0, 16));  // warm-up: thread pools start lazily
  const long before = g_news.load();
  for (int64_t first = 16; first < 256; first += 16) s.train_step(view(data, first, 16));
  EXPECT_EQ(g_news.load() - before, 0) << "operator new was called during training steps";
}

TEST(Executor, ArenaReusesMemoryAndReportsRoles) {
  // Inference through 12 layers: each activation dies at the next layer, so
  // the arena needs the weights plus about two activations, not twelve.
  Graph g;
  TensorId h = g.add_tensor({"x", DType::f32, {64, 256}, Role::input});
  size_t weights = 0;
  for (int i = 0; i < 12; ++i) {
    std::string name = "w";  // (not "w" + to_string: GCC 12 warns falsely on it)
    name += std::to_string(i);
    const TensorId w = g.add_tensor({name, DType::f32, {256, 256}, Role::weight});
    weights += g.tensor(w).bytes();
    h = g.add_op1("gelu", {g.add_op1("linear", {h, w})});
  }
  g.mark_output(h);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.train = false;
  Session ses(std::make_shared<Model>(model_from_graph(std::move(g))), cfg);
  const ArenaPlan& plan = ses.memory_plan();
  const size_t act = 64 * 256 * 4;
  EXPECT_LE(plan.peak, weights + 3 * act) << plan.report();
  EXPECT_GE(plan.peak, weights + 2 * act) << plan.report();
  EXPECT_GE(plan.peak, plan.live_peak);
  EXPECT_EQ(plan.bytes_by_role[static_cast<int>(Role::weight)], weights);
  EXPECT_EQ(plan.bytes_by_role[static_cast<int>(Role::activation)], 24 * act);
}

TEST(Executor, BudgetBelowThePlanIsAnErrorNamingTheMinimum) {
  size_t need = 0;
  {
    SessionConfig cfg;
    cfg.device = DeviceKind::cpu;
    XmcSession s(build_xmc_model(small_spec()), cfg);
    need = s.session().memory_plan().peak;
  }
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.device_memory = need - 1;
  cfg.strategy = Strategy::keep;  // in core only: no swapping or recomputing to fit
  try {
    XmcSession s(build_xmc_model(small_spec()), cfg);
    FAIL() << "expected an out-of-budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    EXPECT_NE(std::string(e.what()).find(std::to_string(need)), std::string::npos) << e.what();
  }
  cfg.device_memory = need;
  EXPECT_NO_THROW(XmcSession(build_xmc_model(small_spec()), cfg));
  // Out of core, a budget below anything a plan reaches names the smallest.
  cfg.strategy = Strategy::automatic;
  cfg.device_memory = 4096;
  try {
    XmcSession s(build_xmc_model(small_spec()), cfg);
    FAIL() << "expected an out-of-budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    EXPECT_NE(std::string(e.what()).find("a budget of at least"), std::string::npos) << e.what();
  }
}

// The whole chain (graph, autodiff, arena, kernels, executor) against finite
// differences of the loss, in f32 with a loose tolerance.
TEST(Executor, WholeModelGradientMatchesFiniteDifferences) {
  Graph g;
  const TensorId x = g.add_tensor({"x", DType::f32, {3, 4}, Role::input});
  const TensorId t = g.add_tensor({"t", DType::f32, {3, 5}, Role::input});
  TensorDesc wd{"w", DType::f32, {6, 4}, Role::weight};
  wd.trainable = true;
  const TensorId w = g.add_tensor(wd);
  TensorDesc w2d{"w2", DType::f32, {5, 6}, Role::weight};
  w2d.trainable = true;
  const TensorId w2 = g.add_tensor(w2d);
  const TensorId h = g.add_op1("gelu", {g.add_op1("linear", {x, w})});
  const TensorId loss = g.add_op1("bce_logits", {g.add_op1("linear", {h, w2}), t});
  g.mark_output(loss);
  const auto grads = build_backward(g, loss);
  ASSERT_EQ(grads.size(), 2u);
  g.mark_output(grads[0].grad);

  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.train = false;
  Session ex(std::make_shared<Model>(model_from_graph(g)), cfg);
  const int fwd = ex.compile({loss}, false, false);
  const int all = ex.compile({loss, grads[0].grad}, false, false);
  std::vector<float> xv(12), tv(15), wv(24), w2v(30);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(1.0f + i);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = (i % 3 == 0) ? 1.0f : 0.0f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.5f * std::cos(2.0f + i);
  for (size_t i = 0; i < w2v.size(); ++i) w2v[i] = 0.3f * std::sin(3.0f * i);
  std::memcpy(ex.input_buffer("x", -1), xv.data(), 48);
  std::memcpy(ex.input_buffer("t", -1), tv.data(), 60);
  ex.write_tensor("w2", w2v.data(), 120);
  auto loss_at = [&](const std::vector<float>& wvals) {
    ex.write_tensor("w", wvals.data(), 96);
    ex.run_compiled(fwd);
    float l;
    std::memcpy(&l, ex.staged(loss), 4);
    return static_cast<double>(l);
  };
  ex.write_tensor("w", wv.data(), 96);
  ex.run_compiled(all);
  std::vector<float> analytic(24);
  std::memcpy(analytic.data(), ex.staged(grads[0].grad), 96);
  const float h_step = 1e-2f;
  for (size_t i = 0; i < wv.size(); ++i) {
    auto plus = wv, minus = wv;
    plus[i] += h_step;
    minus[i] -= h_step;
    const double fd = (loss_at(plus) - loss_at(minus)) / (2.0 * h_step);
    EXPECT_NEAR(fd, analytic[i], 2e-3) << "element " << i;
  }
}

// A model file's index values are checked before they reach the kernels,
// which trust them: a checksummed file with an index past the hidden width
// is refused, naming the tensor.
TEST(ModelFile, OutOfRangeFanInIndexIsRefused) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  XmcSession s(build_xmc_model(small_spec()), cfg);
  std::vector<std::byte> index = s.read("head.index");
  const uint16_t bad = 32;  // hidden width is 32: valid ids are 0..31
  std::memcpy(index.data() + 10, &bad, 2);
  s.write("head.index", index.data(), index.size());
  const std::string path = ::testing::TempDir() + "bad_index.pooch";
  save_session(s.session(), path, false);
  LoadedFile f = load_model_file(path);
  XmcSession fresh(build_xmc_model(f.spec), cfg);
  try {
    restore_tensors(fresh.session(), f.file, false);
    FAIL() << "expected the index to be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("head.index"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// A number past double's range is a JSON error of its own kind (out_of_range,
// not parse_error): found by fuzz_model_spec; it once escaped as a crash.
TEST(ModelSpec, ANumberTooLargeIsABadInputError) {
  try {
    spec_from_json("1E88888888888", "m.json");
    FAIL() << "accepted an overflowing number";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
  }
}

// A value of the wrong type where the reader asks the JSON library for one
// (found by fuzz_model_spec) is a bad-input error naming the file, not an
// exception out of the library.
TEST(ModelSpec, AValueOfTheWrongTypeIsABadInputError) {
  for (const char* text :
       {R"({"input": {"kind": 4294967297, "width": 3}, "labels": 2, "layers": []})",
        R"({"input": {"kind": "sparse", "width": 3}, "labels": 2, "batch": "many"})",
        R"({"input": {"kind": "sparse", "width": 3}, "labels": 2, "seed": [1]})"}) {
    try {
      spec_from_json(text, "m.json");
      FAIL() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << text;
      EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
    }
  }
}

TEST(ModelSpec, UnknownFieldsAreErrorsNamingThem) {
  const std::string good =
      R"({"input": {"kind": "sparse", "width": 10}, "labels": 4,
          "layers": [{"type": "linear", "width": 8, "activation": "gelu"},
                     {"type": "ffi", "fan_in": 2}]})";
  EXPECT_NO_THROW(spec_from_json(good, "m.json"));
  for (const auto& [text, field] :
       {std::pair<std::string, std::string>{
            R"({"input": {"width": 10}, "labels": 4, "los": "bce", "layers": [{"type": "dense"}]})",
            "los"},
        {R"({"input": {"width": 10, "knd": "dense"}, "labels": 4, "layers": [{"type": "dense"}]})",
         "knd"},
        {R"({"input": {"width": 10}, "labels": 4,
             "layers": [{"type": "linear", "width": 8, "activaton": "gelu"}, {"type": "dense"}]})",
         "activaton"}}) {
    try {
      spec_from_json(text, "m.json");
      FAIL() << "accepted " << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
    }
  }
}
