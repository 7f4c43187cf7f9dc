// Out-of-core training: for every strategy and several models, the weights
// after K steps are bitwise identical to in-core training, and the arena the
// session takes never exceeds the budget. Also the simulator against a
// hand-computed timeline, and the refusal of a budget no plan fits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "latency_bound.h"
#include "runtime/core/error.h"
#include "runtime/models/build.h"
#include "runtime/plan/planner.h"
#include "runtime/session/session.h"
#include "tiny_gpt.h"

using namespace pooch;

namespace {

struct Case {
  const char* name;
  ModelSpec spec;
  double keep;  // the share of the in-core activation memory the budget leaves
};

ModelSpec xmc_spec() {
  ModelSpec s = spec_from_flags(InputKind::sparse, 400, 300, 96, 64, 8, LossKind::bce, 0.2);
  s.run.batch = 32;
  return s;
}

ModelSpec chain_spec(int layers) {
  return mlp_chain_spec(layers, 32, 48, 4, 64);
}

ModelSpec norm_spec() {
  ModelSpec s;
  s.family = Family::mlp;
  s.input = InputKind::dense;
  s.input_width = 40;
  s.labels = 5;
  s.loss = LossKind::softmax;
  s.layers = {{LayerKind::linear, 64, "relu", 0, 0},   {LayerKind::dropout, 0, "none", 0.3, 0},
              {LayerKind::layernorm, 0, "none", 0, 0}, {LayerKind::linear, 64, "gelu", 0, 0},
              {LayerKind::dropout, 0, "none", 0.1, 0}, {LayerKind::layernorm, 0, "none", 0, 0},
              {LayerKind::dense_head, 0, "none", 0, 0}};
  s.run.batch = 48;
  return s;
}

// A small ResNet (basic blocks; convolution, batch normalisation whose
// running averages are written once a step, residual adds) and a ResNet with
// bottleneck blocks.
ModelSpec resnet_spec(int depth) {
  ModelSpec s = spec_from_json(
      fmt::format(R"({{"family": "resnet", "depth": {}, "width": 8, "stem": "small", "classes": 10,
                      "input": {{"channels": 3, "height": 12, "width": 12}}, "batch": 6}})",
                  depth),
      "resnet_spec");
  return s;
}

// Deterministic inputs for every input of the model (labels valid).
void fill_inputs(Session& s, int step) {
  for (const IoTensor& io : s.model().inputs) {
    if (io.row_mask) continue;
    const TensorDesc& d = s.graph().tensor(io.id);
    const auto n = static_cast<size_t>(d.numel());
    if (io.name == "batch.ptr") {
      std::vector<int32_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 5);  // 5 features a row
      s.set_input(io.name, v.data(), n * 4);
    } else if (io.name == "batch.lptr") {
      std::vector<int32_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 2);  // 2 labels a row
      s.set_input(io.name, v.data(), n * 4);
    } else if (d.dtype == DType::i32) {
      const int64_t bound = io.index_bound > 0       ? io.index_bound
                            : io.name == "batch.idx" ? 400
                                                     : 300;
      std::vector<int32_t> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<int32_t>((i * 37 + static_cast<size_t>(step) * 11) %
                                    static_cast<size_t>(bound));
      // Labels of one row must be distinct and ascending: 2 a row, far apart.
      if (io.name == "batch.lidx")
        for (size_t i = 0; i + 1 < n; i += 2) {
          v[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(step)) % 150);
          v[i + 1] = v[i] + 150;
        }
      s.set_input(io.name, v.data(), n * 4);
    } else {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = std::sin(0.1f * static_cast<float>(i) + static_cast<float>(step));
      s.set_input(io.name, v.data(), n * 4);
    }
  }
}

std::vector<std::vector<std::byte>> train(Session& s, int steps) {
  for (int k = 0; k < steps; ++k) {
    fill_inputs(s, k);
    s.run(ProgramKind::train_step);
  }
  std::vector<std::vector<std::byte>> w;
  for (size_t t = 0; t < s.graph().num_tensors(); ++t) {
    const TensorDesc& d = s.graph().tensor(static_cast<TensorId>(t));
    if (d.role == Role::weight || d.role == Role::optimizer_state)
      w.push_back(s.read_tensor(d.name));
  }
  return w;
}

// The budget that holds the in-core session's weights and optimizer state
// and `keep` of the rest of its in-core train arena.
size_t budget_keeping(const Session& in_core, double keep) {
  size_t persistent = 0;
  for (int r : {static_cast<int>(Role::weight), static_cast<int>(Role::optimizer_state)})
    persistent += in_core.memory_plan().bytes_by_role[r];
  const size_t whole = in_core.out_of_core().in_core_arena;
  return persistent + static_cast<size_t>(static_cast<double>(whole - persistent) * keep);
}

class OutOfCore : public ::testing::TestWithParam<int> {};

TEST_P(OutOfCore, EveryStrategyTrainsBitForBitWithinTheBudget) {
  // The XMC step's peak is mostly gradients, which stay: its budget is tighter
  // only by a little.
  const Case cases[] = {
      {"xmc", xmc_spec(), 0.9},           {"chain50", chain_spec(50), 0.5},
      {"norm", norm_spec(), 0.75},        {"resnet18", resnet_spec(18), 0.5},
      {"resnet50", resnet_spec(50), 0.5}, {"gpt", tiny_gpt_spec(4, 10, 0.1), 0.5}};
  const Case& c = cases[GetParam()];
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(c.spec), cfg);
  const auto expect = train(in_core, 3);
  const size_t peak = in_core.memory_plan().peak;
  const size_t in_core_train = in_core.out_of_core().in_core_arena;
  double greedy = 0, automatic = 0;
  for (Strategy st : {Strategy::swap_all, Strategy::recompute_all, Strategy::checkpoint_sqrt,
                      Strategy::pooch_greedy, Strategy::automatic}) {
    SessionConfig oc = cfg;
    oc.strategy = st;
    oc.device_memory = budget_keeping(in_core, c.keep);
    SCOPED_TRACE(std::string(c.name) + " " + strategy_name(st) + " budget " +
                 std::to_string(oc.device_memory) + " of " + std::to_string(in_core_train));
    try {
      Session s(build_model(c.spec), oc);
      // The strategies compared as planned, on the estimated profile
      // (training replans each from its own measured steps), at the
      // estimate: auto's activation plans start from pooch-greedy's and
      // only get faster there, and a level it pages by bet must be no
      // slower there either. (By judged_slowdown, the worse of that and
      // the step under the backend's doubt, auto's plan can lose: its
      // search minimises the step at the estimate, and a bet that won only
      // under doubt lost in the benchmark.)
      const double predicted =
          s.out_of_core().predicted_seconds / s.out_of_core().predicted_in_core;
      const double judged = s.out_of_core().judged_slowdown;
      const size_t paged = s.out_of_core().paged_bytes;
      EXPECT_TRUE(s.out_of_core().active);
      EXPECT_LE(s.memory_plan().peak, oc.device_memory);
      EXPECT_LE(s.backend().memory_info().arena_bytes, oc.device_memory);
      // A strategy that cannot reach the budget with activations alone pages
      // the optimizer state instead.
      EXPECT_GT(s.out_of_core().swapped_bytes + s.out_of_core().recomputed_bytes +
                    s.out_of_core().paged_bytes,
                0u);
      EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
      const OutOfCoreReport& r = s.out_of_core();
      std::printf(
          "%-8s %-16s arena %8zu of %8zu  swapped %7zu  recomputed %7zu  predicted %.3g s "
          "(in core %.3g s)  at the estimate %.4gx  judged %.4gx  paged %zu  plans %d\n",
          c.name, strategy_name(st), s.memory_plan().peak, in_core_train, r.swapped_bytes,
          r.recomputed_bytes, r.predicted_seconds, r.predicted_in_core, predicted, judged, paged,
          r.plans_tried);
      if (st == Strategy::pooch_greedy) greedy = predicted;
      if (st == Strategy::automatic) automatic = predicted;
    } catch (const Error& e) {
      // Recompute alone, or in fixed segments, may not reach every budget:
      // then it must say so, naming the smallest arena it reached.
      const bool may_miss = st == Strategy::recompute_all || st == Strategy::checkpoint_sqrt;
      EXPECT_TRUE(may_miss && e.code() == POOCH_ERR_OUT_OF_BUDGET)
          << e.what() << " (in-core arena " << peak << ")";
      EXPECT_NE(std::string(e.what()).find("at least"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(greedy, 0);
  EXPECT_LE(automatic, greedy) << "auto must be at least as fast as pooch-greedy";
}

INSTANTIATE_TEST_SUITE_P(Models, OutOfCore, ::testing::Values(0, 1, 2, 3, 4, 5));

// A ReLU's output is recomputable, but its input, a batch normalisation's
// output, is read by nothing in the backward pass: kept on the device until
// the recompute, it would free nothing. The recompute remakes it instead,
// with batchnorm_replay (batch normalisation may not run twice: it moves
// the running averages), so recomputing the ReLUs frees their bytes, and
// training through such a plan gives the in-core bits.
TEST(OutOfCore, RecomputedReluOutputsRemakeTheirBatchNormalisation) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(resnet_spec(18)), cfg);
  const auto expect = train(in_core, 3);
  const Graph& g = in_core.graph();
  ProgramRequest keep = in_core.train_request();
  ProgramRequest relus = keep;
  relus.residency.assign(g.num_tensors(), Residency::keep);
  size_t relu_bytes = 0;
  std::vector<TensorId> bn_outputs;  // what the recomputed ReLUs read
  for (const SavedActivation& sa : saved_activations(g, keep)) {
    const Node& made_by =
        g.nodes()[static_cast<size_t>(keep.nodes[static_cast<size_t>(sa.producer)])];
    if (made_by.op != "relu") continue;
    ASSERT_TRUE(sa.recomputable) << g.tensor(sa.tensor).name;
    relus.residency[static_cast<size_t>(sa.tensor)] = Residency::recompute;
    relu_bytes += sa.bytes;
    for (const Node& n : g.nodes())
      if (n.op == "batchnorm" && n.outputs[0] == made_by.inputs[0])
        bn_outputs.push_back(n.outputs[0]);
  }
  ASSERT_FALSE(bn_outputs.empty());
  const Schedule kept = plan_schedule(g, keep, in_core.backend(), in_core.layout(), {});
  const Schedule remade = plan_schedule(g, relus, in_core.backend(), in_core.layout(), {});
  auto launches_of = [](const Schedule& sc, std::string_view op) {
    int n = 0;
    for (const Launch& l : sc.launches) n += l.kernel->op == op;
    return n;
  };
  // Each batch normalisation a recomputed ReLU reads (directly, or through
  // a residual add) is replayed once, and runs (moving its running
  // averages) once, in the forward pass.
  EXPECT_GE(launches_of(remade, "batchnorm_replay"), static_cast<int>(bn_outputs.size()));
  EXPECT_LE(launches_of(remade, "batchnorm_replay"), launches_of(kept, "batchnorm"));
  EXPECT_EQ(launches_of(remade, "batchnorm"), launches_of(kept, "batchnorm"));
  for (TensorId y : bn_outputs)
    EXPECT_EQ(remade.residency[static_cast<size_t>(y)], Residency::recompute) << g.tensor(y).name;
  std::printf("resnet18: in core %zu, ReLUs recomputed %zu (their outputs %zu bytes)\n",
              kept.arena_bytes, remade.arena_bytes, relu_bytes);
  // Most of the ReLUs' bytes are freed (before the replay: almost none).
  EXPECT_LE(remade.arena_bytes + relu_bytes / 2, kept.arena_bytes);
  // With remaking off (auto searches both), the recomputes keep what they
  // read from the forward pass: no replays, and the bytes stay.
  ProgramRequest keeping = relus;
  keeping.remake_unsaved = false;
  const Schedule kept_inputs = plan_schedule(g, keeping, in_core.backend(), in_core.layout(), {});
  EXPECT_EQ(launches_of(kept_inputs, "batchnorm_replay"), 0);
  EXPECT_GT(kept_inputs.arena_bytes, remade.arena_bytes + relu_bytes / 2);

  // A replay is timed apart from its node: a batch normalisation from its
  // saved statistics reads its input once, the forward twice. In a profile
  // whose replays took 1 s and everything else 2 s, the node keeps 2 s, its
  // replay 1 s, and the simulator and the recompute pricing use each.
  ASSERT_EQ(remade.launch_replay.size(), remade.launches.size());
  StepTimes times;
  double expect_compute = 0;
  int replays = 0;
  for (size_t i = 0; i < remade.launches.size(); ++i) {
    const bool replay = remade.launch_replay[i] != 0;
    EXPECT_EQ(replay, std::string_view(remade.launches[i].kernel->op) == "batchnorm_replay");
    replays += replay;
    times.launch_seconds.push_back(replay ? 1.0 : 2.0);
    expect_compute += replay ? 1.0 : 2.0;
  }
  EXPECT_EQ(replays, launches_of(remade, "batchnorm_replay"));
  times.copy_seconds.assign(remade.copies.size(), 0.0);
  const Profile measured = measured_profile(g, remade, times, LinkModel{});
  std::vector<char> replayed(g.nodes().size(), 0);
  for (size_t i = 0; i < remade.launches.size(); ++i)
    if (remade.launch_replay[i]) replayed[static_cast<size_t>(remade.launch_node[i])] = 1;
  for (size_t i = 0; i < remade.launches.size(); ++i) {
    const auto n = static_cast<size_t>(remade.launch_node[i]);
    EXPECT_EQ(measured.node_seconds[n], 2.0);
    EXPECT_EQ(measured.recompute_seconds(n), replayed[n] ? 1.0 : 2.0);
  }
  EXPECT_EQ(simulate(remade, measured).compute_seconds, expect_compute);
  // The median keeps a replay's time from the runs that measured it.
  Profile unmeasured = measured;
  unmeasured.replay_seconds.assign(unmeasured.replay_seconds.size(), 0);
  EXPECT_EQ(median_profile({unmeasured, measured, unmeasured}).replay_seconds,
            measured.replay_seconds);

  // recompute-all, without paging, at the smallest budget it reaches:
  // within it, with replays, the in-core bits.
  SessionConfig oc = cfg;
  oc.strategy = Strategy::recompute_all;
  oc.max_paging = 0;
  oc.plan_only = true;
  oc.device_memory = 1;
  size_t needed = 0;
  try {
    Session probe(build_model(resnet_spec(18)), oc);
  } catch (const OutOfBudget& e) {
    needed = e.needed_bytes();
  }
  ASSERT_GT(needed, 0u);
  EXPECT_LT(needed, in_core.out_of_core().in_core_arena);
  oc.plan_only = false;
  oc.device_memory = needed;
  Session s(build_model(resnet_spec(18)), oc);
  EXPECT_TRUE(s.out_of_core().active);
  EXPECT_GT(s.out_of_core().recomputed_bytes, 0u);
  EXPECT_LE(s.backend().memory_info().arena_bytes, oc.device_memory);
  EXPECT_EQ(train(s, 3), expect) << "weights or running averages differ from in-core training";
}

// A swapped activation whose copy is mostly the link's latency (a batch
// normalisation's mean and variance: tens of bytes here, against 1 ms a
// copy) holds a copy stream for a latency each way and saves next to
// nothing. pooch-greedy (PoocH's own search: kept latest first) swaps some
// of them in this bottleneck ResNet at 0.385 of its in-core arena (its plan
// is also where auto starts); auto keeps them, and its plan is faster.
// Plan-only sessions of the bottleneck ResNet over a slow link with a long
// latency (1 GB/s, 1 ms a copy), at `share` of its in-core train arena.
SessionConfig slow_link_plans(double share) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  cfg.plan_only = true;
  Session in_core(build_model(resnet_spec(50)), cfg);
  cfg.link_bandwidth = 1e9;
  cfg.link_latency = 1e-3;
  cfg.device_memory =
      static_cast<size_t>(share * static_cast<double>(in_core.out_of_core().in_core_arena));
  return cfg;
}

TEST(OutOfCore, AutoKeepsActivationsWhoseCopiesAreMostlyLatency) {
  SessionConfig oc = slow_link_plans(0.385);
  struct Plan {
    int latency_bound_swaps = 0;
    double seconds = 0;
  };
  auto plan = [&](Strategy st) {
    oc.strategy = st;
    Session s(build_model(resnet_spec(50)), oc);
    EXPECT_TRUE(s.out_of_core().active);
    return Plan{latency_bound_swaps(s), s.out_of_core().predicted_seconds};
  };
  const Plan greedy = plan(Strategy::pooch_greedy);
  const Plan best = plan(Strategy::automatic);
  std::printf("latency-bound swaps: pooch-greedy %d (%.4f s), auto %d (%.4f s)\n",
              greedy.latency_bound_swaps, greedy.seconds, best.latency_bound_swaps, best.seconds);
  ASSERT_GT(greedy.latency_bound_swaps, 0);
  EXPECT_LT(best.latency_bound_swaps, greedy.latency_bound_swaps / 2);
  EXPECT_LT(best.seconds, greedy.seconds);
}

// Paging is not only for steps that fit no other way: where the step fits
// with nothing paged but far slower than in core, `auto` plans the levels
// that page too and keeps the fastest. Here, over a slow link with a long
// latency, a plan with the optimizer state on the device swaps many
// activations, and one with part of it paged keeps them (before, 4.85 MB
// planned 0.378 s where 4.8 MB, paging, planned 0.058 s).
TEST(OutOfCore, AutoPagesWhereThatPlansAFasterStep) {
  SessionConfig oc = slow_link_plans(2.0 / 3);
  auto plan = [&](Strategy st, int max_paging) {
    oc.strategy = st;
    oc.max_paging = max_paging;
    Session s(build_model(resnet_spec(50)), oc);
    EXPECT_TRUE(s.out_of_core().active);
    EXPECT_LE(s.memory_plan().peak, oc.device_memory);
    return s.out_of_core();
  };
  const OutOfCoreReport unpaged = plan(Strategy::automatic, 0);
  const OutOfCoreReport best = plan(Strategy::automatic, 3);
  std::printf("auto with nothing paged %.4f s, auto %.4f s (%zu bytes paged), in core %.4f s\n",
              unpaged.predicted_seconds, best.predicted_seconds, best.paged_bytes,
              best.predicted_in_core);
  // The step fits with nothing paged, at more than 1.1 times in core...
  EXPECT_EQ(unpaged.paged_bytes, 0u);
  ASSERT_GT(unpaged.predicted_seconds, 1.1 * unpaged.predicted_in_core);
  // ...and auto pages, for a faster step.
  EXPECT_GT(best.paged_bytes, 0u);
  EXPECT_LT(best.predicted_seconds, unpaged.predicted_seconds);
  EXPECT_EQ(best.predicted_in_core, unpaged.predicted_in_core);  // level 0's, not a paged one's
}

// A bet on paging (the step fits without it) wins only where it is faster
// both at the estimate and under the backend's doubt about it. ResNet-50 at
// 64 pixels in a third of its activation memory, over bench/ooc's slowest
// emulated link: paging one optimizer state judged 2.24x against 2.55x under
// doubt, but 1.051x against 1.008x at the estimate, and measured 1.35x
// against 1.20x without it. Nothing is paged now.
TEST(OutOfCore, AutoDoesNotBetOnPagingThatIsSlowerAtTheEstimate) {
  ModelSpec spec;
  spec.family = Family::resnet;
  spec.input = InputKind::dense;
  spec.labels = 10;
  spec.loss = LossKind::softmax;
  spec.cnn.depth = 50;
  spec.cnn.height = spec.cnn.width = 64;
  spec.cnn.hidden = 512;
  spec.run.batch = 8;
  SessionConfig oc;
  oc.device = DeviceKind::cpu;
  oc.threads = 2;
  oc.plan_only = true;
  oc.strategy = Strategy::automatic;
  oc.device_memory = 311296000;  // bench/ooc's a1/3: in core 331.8 MiB, 52.4 MiB saved
  oc.link_bandwidth = 452e6;
  oc.link_latency = 266e-6;
  Session s(build_model(spec), oc);
  EXPECT_TRUE(s.out_of_core().active);
  EXPECT_EQ(s.out_of_core().paged_bytes, 0u);
  EXPECT_LE(s.memory_plan().peak, oc.device_memory);
}

// The paging chosen at creation is planned again from another profile
// (after the measured steps, the measured one): where it changes, every
// weight and optimizer state moves to its new home and training goes on
// with the bits of in-core training, in the arena and host pool taken, the
// staged inputs where they were; a new paging no faster than what runs is
// not worth the move. Here the bottleneck ResNet over a slow link at 2/3 of
// its arena pages by bet at the estimate (AutoPagesWhereThatPlansAFasterStep);
// with compute 30 times slower the copies of all that paging hide behind
// it less well than recomputes, and it pages less; with 30 times the link's
// latency, more (a few large copies instead of many small swaps).
// The session's own replan from its measured steps is off: every paging here
// comes from a profile the test names. With it on, the replan from this
// machine's measured times (four steps in, after the cold one) came between
// the named ones, and under ASan on CI's machine it had already paged as
// little as compute 30 times slower asks, so that plan moved nothing.
TEST(OutOfCore, ReplanningThePagingMovesTheTensorsAndTrainsBitForBit) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session in_core(build_model(resnet_spec(50)), cfg);
  const auto expect = train(in_core, 9);
  SessionConfig oc = slow_link_plans(2.0 / 3);
  oc.plan_only = false;
  oc.strategy = Strategy::automatic;
  oc.replan_paging = false;
  Session s(build_model(resnet_spec(50)), oc);
  const Profile estimate = s.profile();
  ASSERT_TRUE(s.out_of_core().active);
  ASSERT_GT(s.out_of_core().paged_bytes, 0u);
  // Compute a thousand times slower: every copy hides behind it, and
  // paging more or less ties.
  Profile slow_compute = estimate, compute30 = estimate, latency30 = estimate;
  for (std::vector<double>* v :
       {&slow_compute.node_seconds, &slow_compute.replay_seconds, &slow_compute.host_node_seconds})
    for (double& t : *v) t *= 1000;
  for (std::vector<double>* v : {&compute30.node_seconds, &compute30.replay_seconds})
    for (double& t : *v) t *= 30;
  latency30.link.latency *= 30;
  auto steps = [&](int from, int to) {
    for (int k = from; k < to; ++k) {
      fill_inputs(s, k);
      s.run(ProgramKind::train_step);
    }
  };
  const IoTensor& input = s.model().inputs.front();
  const void* staged_input = s.input_buffer(input.name, -1);
  steps(0, 3);
  s.replan_paging(estimate);
  const size_t at_estimate = s.out_of_core().paged_bytes;
  EXPECT_GT(at_estimate, 0u);
  EXPECT_FALSE(s.replan_paging(slow_compute)) << "a tie is not worth a move";
  EXPECT_EQ(s.out_of_core().paged_bytes, at_estimate);
  steps(3, 5);
  EXPECT_TRUE(s.replan_paging(compute30));
  EXPECT_TRUE(s.out_of_core().repaged);
  const size_t slower_compute = s.out_of_core().paged_bytes;
  EXPECT_LT(slower_compute, at_estimate);
  EXPECT_FALSE(s.replan_paging(compute30)) << "the same paging again changes nothing";
  steps(5, 7);
  EXPECT_TRUE(s.replan_paging(latency30));
  EXPECT_GT(s.out_of_core().paged_bytes, slower_compute);
  EXPECT_EQ(s.input_buffer(input.name, -1), staged_input);
  EXPECT_LE(s.memory_plan().peak, oc.device_memory);
  EXPECT_LE(s.backend().memory_info().arena_bytes, oc.device_memory);
  for (ProgramKind k : {ProgramKind::train_step, ProgramKind::forward, ProgramKind::evaluate})
    if (const Schedule* sc = s.schedule(k)) {
      EXPECT_LE(sc->host_bytes, s.host_pool_bytes());
    }
  steps(7, 9);
  EXPECT_EQ(train(s, 0), expect) << "weights differ from in-core training";
}

// Every output of the model after the evaluate program (the forward
// program where there is none) on a batch the training did not see: the
// inference programs read the weights where the train step's paging left
// them.
std::vector<std::vector<std::byte>> evaluated(Session& s) {
  fill_inputs(s, 7);
  s.run(s.has_program(ProgramKind::evaluate) ? ProgramKind::evaluate : ProgramKind::forward);
  std::vector<std::vector<std::byte>> out;
  for (const IoTensor& io : s.model().outputs) {
    const size_t bytes = s.graph().tensor(io.id).bytes();
    const auto* p = static_cast<const std::byte*>(s.output_buffer(io.name));
    out.emplace_back(p, p + bytes);
  }
  return out;
}

// Plans made for cards of every balance of compute, memory, link and
// latency, at budgets from near in core down to where only paging and host
// updates reach, run on this backend and train the bits in-core training
// does, within the budget. A session plans from the times it measures, so a
// loaded machine runs other schedules than an idle one, and the other tests
// plan from fixed estimates: a random card draws the plans they do not. The
// fault of host updates reading a clipping norm not yet copied out (fixed in
// 64dfe93) showed only under a mix of host and device updates; with that
// fix undone, this test fails on two of the wide clipped chain's six cards.
// The seed is fixed, so a failure repeats.
TEST(OutOfCore, PlansForAnyCardTrainBitForBit) {
  struct Model {
    const char* name;
    ModelSpec spec;
    double clip;
    OptimizerConfig::Kind optimizer = OptimizerConfig::Kind::adam;
  };
  const Model models[] = {
      {"chain12", mlp_chain_spec(12, 64, 96, 16, 64), 0},
      {"chain12-clipped", mlp_chain_spec(12, 64, 96, 16, 64), 1e-5},
      {"wide-chain-clipped", mlp_chain_spec(8, 4096, 64, 4096, 32), 1e-5},
      {"norm", norm_spec(), 0},
      {"xmc", xmc_spec(), 0},
      {"resnet18", resnet_spec(18), 0},
      {"gpt", tiny_gpt_spec(4, 10, 0.1), 0},
      {"resnet50-sgd", resnet_spec(50), 0, OptimizerConfig::Kind::sgd},
      {"gpt-adamw-clipped", tiny_gpt_spec(4, 10, 0.1), 1e-3, OptimizerConfig::Kind::adamw},
      {"xmc-sgd", xmc_spec(), 0, OptimizerConfig::Kind::sgd}};
  std::mt19937 rng(20261205);
  auto log_uniform = [&](double lo, double hi) {
    return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi))(rng));
  };
  int ran = 0, paged = 0, host_updated = 0;
  for (const Model& m : models) {
    SessionConfig cfg;
    cfg.device = DeviceKind::cpu;
    cfg.threads = 1;
    cfg.optimizer.clip_norm = m.clip;
    cfg.optimizer.kind = m.optimizer;
    cfg.optimizer.weight_decay = m.optimizer == OptimizerConfig::Kind::adamw ? 0.01 : 0;
    Session in_core(build_model(m.spec), cfg);
    const auto expect = train(in_core, 3);
    const auto evaluated_in_core = evaluated(in_core);
    for (int card = 0; card < 6; ++card) {
      Machine mc;
      mc.name = fmt::format("random card {}", card);
      mc.memory = 1e12;  // the budget below is what counts
      mc.flops = log_uniform(1e9, 1e14);
      mc.memory_bandwidth = log_uniform(1e9, 4e12);
      mc.h2d_bandwidth = log_uniform(1e8, 1e11);
      mc.d2h_bandwidth = mc.h2d_bandwidth * log_uniform(0.5, 2);
      mc.link_latency = log_uniform(1e-7, 1e-3);
      mc.launch_overhead = log_uniform(1e-7, 1e-4);
      SessionConfig oc = cfg;
      oc.machine = mc;
      oc.strategy = card % 3 == 2 ? Strategy::pooch_greedy : Strategy::automatic;
      // From a little under in core to where only paging reaches.
      const double keep = std::uniform_real_distribution<double>(0.02, 0.9)(rng);
      oc.device_memory = budget_keeping(in_core, keep);
      if (card % 2 == 1) oc.device_memory = oc.device_memory * 2 / 5;
      SCOPED_TRACE(
          fmt::format("{}, {}, {}, budget {} of {}: {:.3g} FLOP/s, {:.3g} B/s, link "
                      "{:.3g}/{:.3g} B/s, latency {:.3g} s, launch {:.3g} s",
                      m.name, mc.name, strategy_name(oc.strategy), oc.device_memory,
                      in_core.out_of_core().in_core_arena, mc.flops, mc.memory_bandwidth,
                      mc.h2d_bandwidth, mc.d2h_bandwidth, mc.link_latency, mc.launch_overhead));
      std::unique_ptr<Session> s;
      try {
        s = std::make_unique<Session>(build_model(m.spec), oc);
      } catch (const OutOfBudget&) {
        continue;  // below what any plan reaches: the refusal is tested elsewhere
      }
      ++ran;
      paged += s->out_of_core().paged_bytes > 0;
      host_updated += s->out_of_core().host_updates > 0;
      EXPECT_EQ(train(*s, 3), expect) << "weights differ from in-core training";
      EXPECT_EQ(evaluated(*s), evaluated_in_core) << "outputs differ from in core";
      EXPECT_LE(s->memory_plan().peak, oc.device_memory);
      EXPECT_LE(s->backend().memory_info().arena_bytes, oc.device_memory);
    }
  }
  std::printf("%d plans ran, %d paged, %d with host updates\n", ran, paged, host_updated);
  // The draw reaches every kind of plan (else the test tests less than it says).
  EXPECT_GE(ran, 45);
  EXPECT_GT(paged, 0);
  EXPECT_GT(host_updated, 0);
}

// Gradient clipping makes every update wait for every gradient (the norm
// is over all of them): a plan that swaps and recomputes still trains the
// same bits, within the budget, and the clipping does change the result.
TEST(OutOfCore, ClippedTrainingIsBitForBitOutOfCore) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session plain(build_model(norm_spec()), cfg);
  const auto unclipped = train(plain, 3);
  cfg.optimizer.clip_norm = 0.05;
  Session in_core(build_model(norm_spec()), cfg);
  const auto expect = train(in_core, 3);
  EXPECT_NE(expect, unclipped) << "a norm of 0.05 should have clipped";
  SessionConfig oc = cfg;
  oc.strategy = Strategy::automatic;
  oc.device_memory = budget_keeping(in_core, 0.75);
  Session s(build_model(norm_spec()), oc);
  EXPECT_TRUE(s.out_of_core().active);
  EXPECT_LE(s.memory_plan().peak, oc.device_memory);
  EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
}

// The smallest budget a swap-all plan reaches when the session may page up
// to `max_paging`, clipping the gradients to `clip_norm` (0: none): the one a
// plan-only session at a budget of 1 byte names in its error. The named
// budget must fit, and one byte less must not: the error's advice is exact
// (it was not where a level that pages less came nearer than the last one).
size_t smallest_budget(const ModelSpec& spec, int max_paging, double clip_norm = 0) {
  SessionConfig c;
  c.optimizer.clip_norm = clip_norm;
  c.device = DeviceKind::cpu;
  c.threads = 1;
  c.plan_only = true;
  c.strategy = Strategy::swap_all;
  c.max_paging = max_paging;
  // The budget the error names, 0 when the plan fits.
  auto needed = [&](size_t budget) -> size_t {
    c.device_memory = budget;
    try {
      Session s(build_model(spec), c);
      return 0;
    } catch (const OutOfBudget& e) {
      return e.needed_bytes();
    } catch (const Error& e) {
      ADD_FAILURE() << "not an out-of-budget error naming a budget: " << e.what();
      return 0;
    }
  };
  const size_t smallest = needed(1);
  EXPECT_GT(smallest, 1u);
  EXPECT_EQ(needed(smallest), 0u) << "the named budget " << smallest << " does not fit";
  EXPECT_EQ(needed(smallest - 1), smallest) << "one byte under the named budget fits";
  return smallest;
}

// Where only updates on the host fit (a wide sparse input layer's weight
// and Adam state at home), the paged tensors no host-run op reads and that
// fit beside them stay on the device: the hidden layers were paged with the
// rest, and their copies set the step (a 1 000 000-wide input on an 8 GB
// card: 5.71 GiB copied a step where 128 MiB now are). Same bits.
TEST(OutOfCore, WhatFitsBesideTheHostUpdatesStaysOnTheDevice) {
  ModelSpec spec = spec_from_flags(InputKind::sparse, 20000, 32, 512, 0, 0, LossKind::bce, 0);
  for (int i = 0; i < 3; ++i)
    spec.layers.insert(spec.layers.begin() + 1, {LayerKind::linear, 512, "relu", 0, 0});
  spec.run.batch = 32;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(spec), cfg);
  const auto expect = train(in_core, 3);
  const size_t b2 = smallest_budget(spec, 2), b3 = smallest_budget(spec, 3);
  ASSERT_LT(b3, b2);
  for (size_t budget : {b2 - 1, b3}) {
    SCOPED_TRACE(
        fmt::format("budget {} (paging weights needs {}, updates on the host {})", budget, b2, b3));
    SessionConfig oc = cfg;
    oc.device_memory = budget;
    Session s(build_model(spec), oc);
    EXPECT_GT(s.out_of_core().host_updates, 0);
    EXPECT_LE(s.memory_plan().peak, budget);
    // The hidden layers' 512 x 512 weights and their Adam state: on the
    // device where they fit (not at b3, where nothing else fits).
    size_t hidden = 0, hidden_paged = 0;
    for (size_t t = 0; t < s.graph().num_tensors(); ++t) {
      const TensorDesc& d = s.graph().tensor(static_cast<TensorId>(t));
      if ((d.role == Role::weight || d.role == Role::optimizer_state) &&
          d.bytes() == 512 * 512 * sizeof(float)) {
        ++hidden;
        hidden_paged += s.layout().paged(static_cast<TensorId>(t)) ? 1 : 0;
      }
    }
    EXPECT_EQ(hidden, 9u);
    if (budget == b2 - 1) {
      EXPECT_EQ(hidden_paged, 0u);
    }
    // The host launches' time is counted apart from the device's launches.
    const Simulation sim = simulate(*s.schedule(ProgramKind::train_step), s.profile());
    EXPECT_GT(sim.host_seconds, 0.0);
    EXPECT_EQ(sim.seconds, s.out_of_core().predicted_seconds);
    EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
  }
}

// With clipping the gradients wait for their updates until every one is
// made: each is a candidate to leave the device for that gap, and a paged
// weight is paged in again for its update rather than kept through it. The
// smallest budget then lies below what the gradients alone used to need
// (all of them on the device at the end of the backward pass), and the plan
// trains the same bits.
TEST(OutOfCore, ClippedGradientsLeaveTheDeviceUntilTheirUpdates) {
  const ModelSpec spec = chain_spec(12);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session unclipped_run(build_model(spec), cfg);
  const auto unclipped_weights = train(unclipped_run, 3);
  // The chain's gradients are small: 0.05 once clipped nothing here.
  constexpr double kClip = 1e-5;
  cfg.optimizer.clip_norm = kClip;
  Session in_core(build_model(spec), cfg);
  const auto expect = train(in_core, 3);
  EXPECT_NE(expect, unclipped_weights) << "a norm of " << kClip << " should have clipped";
  size_t gradient_candidates = 0, weight_gradients = 0;
  for (const SavedActivation& sa : saved_activations(in_core.graph(), in_core.train_request()))
    if (sa.gradient) {
      ++gradient_candidates;
      EXPECT_FALSE(sa.recomputable);
      EXPECT_EQ(in_core.graph().tensor(sa.tensor).role, Role::gradient);
      EXPECT_GT(sa.first_backward, sa.last_forward + 1);
    }
  for (size_t t = 0; t < in_core.graph().num_tensors(); ++t)
    if (in_core.graph().tensor(static_cast<TensorId>(t)).role == Role::weight)
      weight_gradients += in_core.graph().tensor(static_cast<TensorId>(t)).bytes();
  EXPECT_GE(gradient_candidates, 12u) << "every layer's weight gradient waits for the norm";

  // Without clipping a gradient waits at most for the rest of its layer's
  // backward ops: fewer are candidates.
  SessionConfig unclipped = cfg;
  unclipped.optimizer.clip_norm = 0;
  Session plain(build_model(spec), unclipped);
  size_t unclipped_candidates = 0;
  for (const SavedActivation& sa : saved_activations(plain.graph(), plain.train_request()))
    unclipped_candidates += sa.gradient ? 1 : 0;
  EXPECT_LT(unclipped_candidates, gradient_candidates);

  // The smallest budget a swap-all plan reaches, everything paged.
  const size_t hi = smallest_budget(spec, 3, kClip);
  std::printf("clipped chain12: smallest budget %zu; weight gradients %zu bytes in all\n", hi,
              weight_gradients);
  EXPECT_LT(hi, weight_gradients);
  for (Strategy st : {Strategy::swap_all, Strategy::automatic}) {
    SessionConfig oc = cfg;
    oc.strategy = st;
    oc.device_memory = hi;
    SCOPED_TRACE(std::string(strategy_name(st)) + " budget " + std::to_string(hi));
    Session s(build_model(spec), oc);
    size_t swapped_gradients = 0;
    const Schedule* train_step = s.schedule(ProgramKind::train_step);
    ASSERT_NE(train_step, nullptr);
    for (size_t t = 0; t < s.graph().num_tensors(); ++t)
      if (s.graph().tensor(static_cast<TensorId>(t)).role == Role::gradient &&
          train_step->residency[t] == Residency::swap)
        ++swapped_gradients;
    EXPECT_GT(swapped_gradients, 0u);
    // A paged weight is copied in for its forward use, its backward reads and
    // again for its update after the norm: three times.
    std::vector<int> copied_in(s.graph().num_tensors(), 0);
    int most = 0;
    for (const ScheduleStep& st : train_step->steps)
      if (st.kind == StepKind::copy_in) {
        const TensorId t = train_step->copies[static_cast<size_t>(st.index)].tensor;
        if (s.layout().paged(t) && s.graph().tensor(t).role == Role::weight)
          most = std::max(most, ++copied_in[static_cast<size_t>(t)]);
      }
    EXPECT_EQ(most, 3);
    EXPECT_LE(s.backend().memory_info().arena_bytes, hi);  // the measured high-water mark
    EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
  }
}

// With clipping every update reads the norm, and the updates run in weight
// order: where the largest weights update on the host and the rest on the
// device, host and device readers of the norm interleave. The norm must
// reach the host before the first host update (it once went out after the
// last device one, behind host updates already queued on the same stream,
// which then read another tensor's bytes). Same bits as in core.
TEST(OutOfCore, ClippedUpdatesSplitBetweenHostAndDevice) {
  // Wide first and last layers: their updates are the ones moved to the
  // host, and the device updates of the layers between run between them.
  // (The gradients are small: a norm that clips them is small too.)
  const ModelSpec spec = mlp_chain_spec(8, 4096, 64, 4096, 32);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  constexpr double kClip = 1e-5;
  Session plain(build_model(spec), cfg);
  const auto unclipped = train(plain, 3);
  cfg.optimizer.clip_norm = kClip;
  Session in_core(build_model(spec), cfg);
  const auto expect = train(in_core, 3);
  EXPECT_NE(expect, unclipped) << "a norm of " << kClip << " should have clipped";
  int updates = 0;
  for (const Node& n : in_core.graph().nodes()) updates += n.op == "adam_update" ? 1 : 0;
  const size_t b2 = smallest_budget(spec, 2, kClip), b3 = smallest_budget(spec, 3, kClip);
  ASSERT_LT(b3, b2);
  int mixed = 0;
  for (int k = 1; k < 8; ++k) {
    const size_t budget = b3 + (b2 - b3) * static_cast<size_t>(k) / 8;
    SessionConfig oc = cfg;
    oc.device_memory = budget;
    Session s(build_model(spec), oc);
    const int host = s.out_of_core().host_updates;
    if (host == 0 || host == updates) continue;
    ++mixed;
    SCOPED_TRACE(fmt::format("budget {}: {} of {} updates on the host", budget, host, updates));
    EXPECT_LE(s.backend().memory_info().arena_bytes, budget);
    EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
  }
  EXPECT_GT(mixed, 0) << "no budget between " << b3 << " and " << b2
                      << " split the updates between host and device";
}

// Only optimizer updates move to the host with their weights (of the ops
// that write into their inputs, those that make no output): batch
// normalisation writes its running statistics too (weights, not trained),
// but run on the host it would send each layer's activations over the link
// and back, with the CPU's kernel where the device ran its own (on a card,
// not the same bits). At the budget where updates on the host fit, the
// batch norms stay on the device, and the model trains to the same bits.
TEST(OutOfCore, BatchNormsStayOnTheDeviceWhenUpdatesMoveToTheHost) {
  const ModelSpec spec = resnet_spec(18);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(spec), cfg);
  const auto expect = train(in_core, 2);
  SessionConfig oc = cfg;
  oc.device_memory = smallest_budget(spec, 3);
  Session s(build_model(spec), oc);
  EXPECT_GT(s.out_of_core().host_updates, 0);
  int stats_at_home = 0;  // batch norms whose running statistics are paged
  for (const Node& n : s.graph().nodes())
    if (n.op == "batchnorm")
      stats_at_home += s.layout().paged(n.inputs[3]) && s.layout().paged(n.inputs[4]) ? 1 : 0;
  EXPECT_GT(stats_at_home, 0);
  for (ProgramKind k : {ProgramKind::train_step, ProgramKind::forward, ProgramKind::evaluate}) {
    const Schedule* sc = s.schedule(k);
    if (!sc) continue;
    for (const Launch& l : sc->launches) {
      const Node& n = s.graph().nodes()[static_cast<size_t>(l.node)];
      if (l.on_host) {
        EXPECT_NE(n.op.find("update"), std::string::npos) << n.op << " runs on the host";
      }
    }
  }
  EXPECT_EQ(train(s, 2), expect) << "weights differ from in-core training";
}

// A sparse input layer's gradient is row-sparse: its norm is not clipped,
// it is refused, naming the weight.
TEST(Clipping, RowSparseGradientsAreRefused) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.optimizer.clip_norm = 1.0;
  try {
    Session s(build_model(xmc_spec()), cfg);
    ADD_FAILURE() << "an XMC model with a sparse input layer was clipped";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("row-sparse"), std::string::npos) << e.what();
  }
  cfg.optimizer.clip_norm = -1;
  EXPECT_THROW(Session(build_model(norm_spec()), cfg), Error);
}

// Budgets below the weights and optimizer state: the session pages the
// optimizer state (and then the weights) to the host pool, copies each in
// before its uses and the updated ones back, and last runs the updates (and
// a sparse input layer) on the host; it trains to the same bits.
class Paging : public ::testing::TestWithParam<int> {};

TEST_P(Paging, PagedWeightsAndStateTrainBitForBitWithinTheBudget) {
  const Case cases[] = {
      {"xmc", xmc_spec(), 0}, {"chain50", chain_spec(50), 0}, {"norm", norm_spec(), 0}};
  const Case& c = cases[GetParam()];
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(c.spec), cfg);
  const auto expect = train(in_core, 3);
  const size_t in_core_train = in_core.out_of_core().in_core_arena;
  // The smallest budgets without paging, paging the optimizer state, and
  // paging the weights too: each level reaches lower.
  const size_t b0 = smallest_budget(c.spec, 0);
  const size_t b1 = smallest_budget(c.spec, 1);
  const size_t b2 = smallest_budget(c.spec, 2);
  const size_t b3 = smallest_budget(c.spec, 3);
  std::printf(
      "%-8s smallest budget: %zu without paging, %zu paging optimizer state, %zu paging "
      "weights too, %zu updating on the host (in-core step %zu)\n",
      c.name, b0, b1, b2, b3, in_core_train);
  EXPECT_LT(b1, b0);
  EXPECT_LT(b2, b1);
  // An update on the host needs no weight, gradient and state on the device
  // at once: the largest layer's update no longer sets the floor.
  EXPECT_LT(b3, b2);
  for (size_t level = 1; level <= 3; ++level) {
    const size_t budget = level == 1 ? b1 : level == 2 ? b2 : b3;
    for (Strategy st : {Strategy::swap_all, Strategy::automatic}) {
      SessionConfig oc = cfg;
      oc.strategy = st;
      oc.device_memory = budget;
      SCOPED_TRACE(std::string(c.name) + " " + strategy_name(st) + " budget " +
                   std::to_string(budget) + " (in-core step " + std::to_string(in_core_train) +
                   ")");
      Session s(build_model(c.spec), oc);
      const OutOfCoreReport& r = s.out_of_core();
      EXPECT_TRUE(r.active);
      EXPECT_GT(r.paged_bytes, 0u);
      // In before use, updated ones back (an update on the host copies its
      // weight in for its uses only, and its state never).
      if (level < 3) {
        EXPECT_GT(r.paged_copy_bytes, r.paged_bytes);
      }
      EXPECT_LE(s.memory_plan().peak, budget);
      EXPECT_LE(s.backend().memory_info().arena_bytes, budget);  // the measured high-water mark
      EXPECT_GE(r.predicted_seconds, r.predicted_in_core);
      EXPECT_EQ(r.in_core_arena, in_core_train);
      size_t paged_weights = 0;
      for (size_t t = 0; t < s.graph().num_tensors(); ++t)
        if (s.layout().paged(static_cast<TensorId>(t)) &&
            s.graph().tensor(static_cast<TensorId>(t)).role == Role::weight)
          paged_weights += s.graph().tensor(static_cast<TensorId>(t)).bytes();
      if (level >= 2) {
        EXPECT_GT(paged_weights, 0u);  // below b1 only paged weights fit
      }
      if (level == 3) {
        EXPECT_GT(r.host_updates, 0);  // below b2 only updates on the host fit
        EXPECT_GT(r.host_update_copy_bytes, 0u);
        // The sparse input layer's forward and row gradient run there too,
        // where its weight lives: the weight never comes to the device.
        if (std::string(c.name) == "xmc") {
          EXPECT_GT(r.host_launches, r.host_updates);
        }
      } else {
        EXPECT_EQ(r.host_updates, 0);
      }
      EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
      std::printf(
          "%-8s %-10s budget %8zu  arena %8zu  paged %8zu (weights %8zu)  copied %8zu  "
          "predicted %.3g s (in core %.3g s)\n",
          c.name, strategy_name(st), budget, s.memory_plan().peak, r.paged_bytes, paged_weights,
          r.paged_copy_bytes, r.predicted_seconds, r.predicted_in_core);
    }
  }
  // Between b1 and b0 paging some of the optimizer state is enough: the
  // session pages fewer than all of it (largest first), and no weight.
  size_t all_state = 0;
  for (size_t t = 0; t < in_core.graph().num_tensors(); ++t)
    if (in_core.graph().tensor(static_cast<TensorId>(t)).role == Role::optimizer_state)
      all_state += in_core.graph().tensor(static_cast<TensorId>(t)).bytes();
  SessionConfig oc = cfg;
  oc.strategy = Strategy::swap_all;
  oc.device_memory = b1 + (b0 - b1) / 2;
  SCOPED_TRACE(std::string(c.name) + " partial paging, budget " + std::to_string(oc.device_memory));
  Session s(build_model(c.spec), oc);
  const OutOfCoreReport& r = s.out_of_core();
  EXPECT_GT(r.paged_bytes, 0u);
  EXPECT_LT(r.paged_bytes, all_state);
  for (size_t t = 0; t < s.graph().num_tensors(); ++t)
    if (s.layout().paged(static_cast<TensorId>(t))) {
      EXPECT_EQ(s.graph().tensor(static_cast<TensorId>(t)).role, Role::optimizer_state);
    }
  EXPECT_LE(s.backend().memory_info().arena_bytes, oc.device_memory);
  EXPECT_EQ(train(s, 3), expect) << "weights differ from in-core training";
  std::printf("%-8s partial    budget %8zu  paged %8zu of %8zu bytes of optimizer state\n", c.name,
              oc.device_memory, r.paged_bytes, all_state);
}

INSTANTIATE_TEST_SUITE_P(Models, Paging, ::testing::Values(0, 1, 2));

// --host-memory caps the host pool: the planner looks for a plan whose host
// pool fits (recomputing what it cannot swap), takes no more than the cap,
// and says how much a cap too small for any plan would need.
TEST(HostPool, TheCapIsAPlanningConstraint) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session in_core(build_model(chain_spec(50)), cfg);
  const auto expect = train(in_core, 3);
  SessionConfig oc = cfg;
  oc.device_memory = budget_keeping(in_core, 0.5);
  oc.strategy = Strategy::swap_all;
  Session swapping(build_model(chain_spec(50)), oc);
  const size_t staging = in_core.host_pool_bytes();
  const size_t swap_host = swapping.schedule(ProgramKind::train_step)->host_bytes;
  ASSERT_GT(swap_host, staging);
  // Room for a quarter of what swap-all puts on the host.
  oc.strategy = Strategy::automatic;
  oc.host_memory = staging + (swap_host - staging) / 4;
  Session capped(build_model(chain_spec(50)), oc);
  EXPECT_LE(capped.host_pool_bytes(), oc.host_memory);
  EXPECT_LE(capped.schedule(ProgramKind::train_step)->host_bytes, oc.host_memory);
  EXPECT_LE(capped.backend().memory_info().arena_bytes, oc.device_memory);
  EXPECT_GT(capped.out_of_core().recomputed_bytes, 0u);
  EXPECT_EQ(train(capped, 3), expect);
  // Swap-all cannot live under that cap: the error says what it needs.
  oc.strategy = Strategy::swap_all;
  try {
    Session s(build_model(chain_spec(50)), oc);
    ADD_FAILURE() << "swap-all fitted a host cap below its swap slots";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    EXPECT_NE(std::string(e.what()).find("host budget of at least"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// The timeline and the occupancy a plan report draws: one replay (simulate
// sums simulate_timeline), and the bytes per launch slot within the placement.
TEST(OutOfCoreReport, TimelineAndOccupancyAgreeWithTheSimulatorAndThePlacement) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session in_core(build_model(norm_spec()), cfg);
  for (size_t budget : {size_t{0}, budget_keeping(in_core, 0.75)}) {
    SessionConfig oc = cfg;
    oc.device_memory = budget;
    Session s(build_model(norm_spec()), oc);
    const Schedule& sc = *s.schedule(ProgramKind::train_step);
    const std::vector<StepTiming> tl = simulate_timeline(sc, s.profile());
    ASSERT_EQ(tl.size(), sc.steps.size());
    double latest = 0, compute_end = 0;
    for (size_t i = 0; i < tl.size(); ++i) {
      EXPECT_LE(tl[i].start, tl[i].end);
      latest = std::max(latest, tl[i].end);
      if (sc.steps[i].kind == StepKind::launch) {
        EXPECT_GE(tl[i].start, compute_end);  // one stream: launches never overlap
        compute_end = tl[i].end;
      }
    }
    const Simulation sim = simulate(sc, s.profile());
    EXPECT_EQ(sim.seconds, latest);
    EXPECT_EQ(sim.seconds, s.out_of_core().predicted_seconds);

    const std::vector<SlotOccupancy> occ = transient_occupancy(s.graph(), sc);
    ASSERT_EQ(occ.size(), sc.launches.size());
    ASSERT_EQ(sc.transient_requests.size(), sc.transient.offsets.size());
    size_t top = 0, most = 0, back = 0;
    for (const SlotOccupancy& o : occ) {
      EXPECT_LE(o.total(), o.top);
      top = std::max(top, o.top);
      most = std::max(most, o.total());
      back += o.swapped + o.recomputed;
    }
    EXPECT_LE(top, sc.transient.peak);
    EXPECT_LE(most, sc.transient.live_peak);
    EXPECT_GT(most, 0u);
    EXPECT_EQ(back > 0, s.out_of_core().active) << "budget " << budget;
  }
}

}  // namespace

namespace {

Profile profile_of(std::vector<double> nodes, double h2d, double d2h) {
  Profile p;
  p.node_seconds = std::move(nodes);
  p.link.h2d_bandwidth = h2d;
  p.link.d2h_bandwidth = d2h;
  return p;
}

// The measured profile is each node's median over the profiled runs: one
// slow run (another process's burst) moves nothing.
// Where the backend's copies are made by the cores its kernels use (the CPU
// backend with every core in its kernels), the simulator charges a copy's
// bytes to the compute stream while it overlaps compute; the charge is never
// more than all the copies' bytes at that rate, and changes no kernel time.
TEST(Simulator, CopiesMadeByTheComputeCoresDelayTheKernels) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session in_core(build_model(norm_spec()), cfg);
  SessionConfig oc = cfg;
  oc.device_memory = budget_keeping(in_core, 0.5);
  oc.link_bandwidth = 1e9;  // copies long enough to overlap kernels
  Session s(build_model(norm_spec()), oc);
  const Schedule& sc = *s.schedule(ProgramKind::train_step);
  double copied = 0;
  for (const auto& c : sc.copies) copied += static_cast<double>(c.bytes);
  ASSERT_GT(copied, 0);
  Profile free_copies = s.profile(), busy_copies = s.profile();
  free_copies.link.compute_seconds_per_byte = 0;
  busy_copies.link.compute_seconds_per_byte = 1e-9;
  const Simulation a = simulate(sc, free_copies), b = simulate(sc, busy_copies);
  EXPECT_GT(b.seconds, a.seconds);
  EXPECT_LE(b.seconds, a.seconds + copied * 1e-9 * (1 + 1e-12));
  EXPECT_EQ(a.compute_seconds, b.compute_seconds);
  // The backend says so only where the kernels take every core.
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 1) {
    EXPECT_EQ(s.profile().link.compute_seconds_per_byte, 0.0);
  }
  SessionConfig all = oc;
  all.threads = static_cast<int>(std::max(cores, 1u));
  Session every_core(build_model(norm_spec()), all);
  EXPECT_GT(every_core.profile().link.compute_seconds_per_byte, 0.0);
}

TEST(Profiler, TheProfileIsEachNodesMedianOverTheRuns) {
  const Profile m = median_profile(
      {profile_of({1, 10}, 5e9, 4e9), profile_of({9, 2}, 6e9, 1e9), profile_of({2, 3}, 7e9, 2e9)});
  EXPECT_EQ(m.node_seconds, (std::vector<double>{2, 3}));
  EXPECT_EQ(m.link.h2d_bandwidth, 6e9);
  EXPECT_EQ(m.link.d2h_bandwidth, 2e9);
  // An even count: the mean of the middle two.
  const Profile e = median_profile({profile_of({1}, 1, 1), profile_of({4}, 3, 3),
                                    profile_of({100}, 5, 5), profile_of({2}, 7, 7)});
  EXPECT_EQ(e.node_seconds, (std::vector<double>{3}));
  EXPECT_EQ(e.link.h2d_bandwidth, 4);
  EXPECT_THROW((void)median_profile({}), Error);
  EXPECT_THROW((void)median_profile({profile_of({1}, 1, 1), profile_of({1, 2}, 1, 1)}), Error);
}

// The link's latency is measured too: the intercept of a line through the
// copies' times, weighted so that small copies count as much as large ones.
TEST(Profiler, CopyLatencyIsTheInterceptOfTheCopiesTimes) {
  std::vector<double> bytes, secs;
  for (double b : {4e3, 6e4, 1e5, 2e6, 3e7}) {
    bytes.push_back(b);
    secs.push_back(30e-6 + b / 1e9);
  }
  ASSERT_TRUE(copy_latency(bytes, secs).has_value());
  EXPECT_NEAR(*copy_latency(bytes, secs), 30e-6, 1e-12);
  // Noise of 5% on each copy: the intercept still within 10% (unweighted,
  // the 30 ms copy's error alone would be 1.5 ms, fifty latencies).
  std::vector<double> noisy = secs;
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] *= i % 2 ? 1.05 : 0.95;
  ASSERT_TRUE(copy_latency(bytes, noisy).has_value());
  EXPECT_NEAR(*copy_latency(bytes, noisy), 30e-6, 3e-6);
  // No line: too few copies, sizes too alike, a negative intercept.
  EXPECT_FALSE(copy_latency({1e3, 1e6, 1e7}, {1e-5, 1e-3, 1e-2}).has_value());
  EXPECT_FALSE(copy_latency({1e6, 2e6, 3e6, 3.9e6}, {1e-3, 2e-3, 3e-3, 3.9e-3}).has_value());
  EXPECT_FALSE(copy_latency({1e4, 1e5, 1e6, 1e7}, {5e-6, 95e-6, 995e-6, 9995e-6}).has_value());
}

// measured_profile fits the latency over both ways and each way's bandwidth
// after it; where the sizes allow no line, the latency stays the model's.
TEST(Profiler, TheMeasuredProfileFitsTheLinksLatencyAndEachWaysBandwidth) {
  const Graph g;
  Schedule s;
  StepTimes t;
  for (double b : {4e3, 6e4, 1e5, 2e6, 3e7}) {
    ScheduledCopy c;
    c.bytes = static_cast<size_t>(b);
    s.add_copy(StepKind::copy_in, Stream::h2d, c);
    t.copy_seconds.push_back(20e-6 + b / 1e9);
    s.add_copy(StepKind::copy_out, Stream::d2h, c);
    t.copy_seconds.push_back(20e-6 + b / 2e9);
  }
  const Profile p = measured_profile(g, s, t, LinkModel{});
  EXPECT_NEAR(p.link.latency, 20e-6, 1e-12);
  EXPECT_NEAR(p.link.h2d_bandwidth, 1e9, 1e-3);
  EXPECT_NEAR(p.link.d2h_bandwidth, 2e9, 1e-3);
  // Copies of one size: the bandwidth after the model's latency.
  Schedule one;
  StepTimes ot;
  for (int i = 0; i < 8; ++i) {
    ScheduledCopy c;
    c.bytes = 1 << 20;
    one.add_copy(StepKind::copy_in, Stream::h2d, c);
    ot.copy_seconds.push_back(LinkModel{}.latency + 1e-3);
  }
  const Profile q = measured_profile(g, one, ot, LinkModel{});
  EXPECT_EQ(q.link.latency, LinkModel{}.latency);
  EXPECT_NEAR(q.link.h2d_bandwidth, (1 << 20) / 1e-3, 1e-3);
  // The median over runs takes the latency's median too.
  Profile a = p, b = p, c = p;
  a.link.latency = 1e-6;
  b.link.latency = 5e-6;
  c.link.latency = 9e-6;
  EXPECT_EQ(median_profile({c, a, b}).link.latency, 5e-6);
}

// How far over the emulated link a measured bandwidth may come out. Noise
// only adds time to a copy, but the fit splits each copy's time into the
// latency (the intercept) and bytes over bandwidth: a thread woken late
// after a small copy raises the intercept, and the bandwidth left over from
// the copies' total time then comes out above the link's. Seen: 1.07x the
// link at 3 GB/s and 1 us of latency in a release build (a fitted latency of
// 27 us: the wake-ups went into the intercept). These tests allowed 2% and
// one failed in CI's ASan run on a loaded machine (its log kept only the
// test's name; this is the one assertion in it that timing moves). The
// default link (12 GB/s) is 30 times the emulated one: the bound still
// tells a measured link from it.
constexpr double kFittedLinkSlack = 1.25;

// A profiled step on the CPU backend with an emulated link times its copies
// on the copy streams' clocks: the bandwidth measured from them is the
// link's, within what the fit lets through (kFittedLinkSlack: the emulation
// makes each copy take at least its time), and it replaces the link model
// the session started from. Each further profiled
// step adds a run to the median.
TEST(Profiler, ProfiledStepsMeasureTheEmulatedLink) {
  ModelSpec spec = norm_spec();
  spec.run.batch = 4096;  // activations of 1 MiB: copies long enough to measure
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session in_core(build_model(spec), cfg);
  SessionConfig oc = cfg;
  oc.device_memory = budget_keeping(in_core, 0.5);
  oc.strategy = Strategy::swap_all;
  oc.link_bandwidth = 400e6;
  oc.link_latency = 1e-4;
  Session s(build_model(spec), oc);
  ASSERT_GT(s.schedule(ProgramKind::train_step)->copies.size(), 0u) << "nothing swapped";
  fill_inputs(s, 0);
  for (int run = 0; run < 3; ++run) s.run_profiled_train_step();
  EXPECT_TRUE(s.profile_measured());
  const LinkModel& link = s.profile().link;
  EXPECT_LE(link.h2d_bandwidth, 400e6 * kFittedLinkSlack);
  EXPECT_LE(link.d2h_bandwidth, 400e6 * kFittedLinkSlack);
  EXPECT_NE(link.h2d_bandwidth, LinkModel{}.h2d_bandwidth) << "h2d was not measured";
  EXPECT_NE(link.d2h_bandwidth, LinkModel{}.d2h_bandwidth) << "d2h was not measured";
  ASSERT_EQ(s.profile().node_seconds.size(), s.graph().nodes().size());
  for (double sec : s.profile().node_seconds) EXPECT_GE(sec, 0.0);
}

// Out of core, the train steps after the first are measured and the plan
// made again from them, for every caller of Session::run (the trainers never
// asked for it, so their plans stayed on the estimate: 3000 times too slow
// for an H200); the first step runs cold and is not measured. In core
// nothing is measured: no step pays for it.
TEST(OutOfCore, FirstTrainStepsAreMeasuredOutOfCoreOnly) {
  ModelSpec spec = norm_spec();
  spec.run.batch = 4096;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session in_core(build_model(spec), cfg);
  const auto expect = train(in_core, 4);
  EXPECT_FALSE(in_core.profile_measured()) << "an in-core step was measured";
  SessionConfig oc = cfg;
  oc.device_memory = budget_keeping(in_core, 0.5);
  oc.link_bandwidth = 400e6;
  oc.link_latency = 1e-4;
  Session s(build_model(spec), oc);
  ASSERT_TRUE(s.out_of_core().active);
  EXPECT_FALSE(s.profile_measured());
  (void)train(s, 1);
  EXPECT_FALSE(s.profile_measured()) << "the cold first step was measured";
  Session again(build_model(spec), oc);
  EXPECT_EQ(train(again, 4), expect) << "weights differ from in-core training";
  EXPECT_TRUE(again.profile_measured()) << "no train step was measured out of core";
  // The link's bandwidth comes from the steps' copies, not the default.
  EXPECT_LE(again.profile().link.h2d_bandwidth, 400e6 * kFittedLinkSlack);
  EXPECT_LE(again.memory_plan().peak, oc.device_memory);
}

// An error for a program that does not fit names it: only the train step is
// planned out of core, so "the forward program" is a different problem from
// "the train step program" (ResNet-50 on an H200 was refused by one of its
// inference programs).
TEST(OutOfCore, AProgramThatDoesNotFitIsNamed) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  cfg.plan_only = true;
  Session in_core(build_model(chain_spec(12)), cfg);
  cfg.strategy = Strategy::keep;
  cfg.device_memory = in_core.out_of_core().in_core_arena - 1;
  try {
    Session s(build_model(chain_spec(12)), cfg);
    FAIL() << "a budget below the in-core arena was accepted under keep";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("the train step program needs"), std::string::npos)
        << e.what();
  }
}

}  // namespace
