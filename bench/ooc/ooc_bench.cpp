// bench/ooc: out-of-core training on the CPU backend with an emulated device
// link. For each model: the in-core step, then every strategy at budgets of
// 1/2, 1/3 and 1/5 of the in-core step's arena (below the weights and
// optimizer state, the session pages them to the host pool), each as a
// ratio to the in-core step time (a budget's sessions and the in-core one
// timed in rounds, two steps of each a round, the second timed), with the
// simulator's prediction against
// the measured time and the planning time (all the session's planning: every
// paging level and count it tries, each with its search).
//
// The link is a GTX 1650's PCIe 3.0 x16 (about 12 GB/s each way, 10 us per
// copy) scaled by this CPU's compute rate relative to that card (2.9 TFLOPS
// f32): the CPU's rate is measured from the in-core step's profile (FLOPs of
// its launches over their measured time), so copies take as long relative to
// compute as they would there.
//
//   pooch-bench-ooc [--steps N] [--threads T] [--quick] [--planning] [--cnn]
//                   [--activations] [--only NAME] [--repaging] [--device cpu|cuda]
//
// --device cuda: the same tables on a GPU (tests/device/run.sh), over the
// card's own link: no emulation, no scaling. The planning table stays the
// CPU's.
// --planning: only the planning-time table (plan-only sessions).
// --only NAME: one benchmark model of the table (e.g. vgg16-64px with --cnn).
// --repaging: also `auto` with the paging it chose at creation kept
// (SessionConfig::replan_paging off), as "auto-no-repage", compared with
// `auto` round by round.
// --cnn: PoocH's own workloads instead, ResNet-50 and VGG-16 (small images
// so that a step takes seconds on a CPU).
// --activations: budgets that take 1/2, 2/3 and 4/5 of the saved
// activations' bytes off the in-core arena, so that the activations need 2,
// 3 and 5 times what the budget leaves them (PoocH's setting: on a GPU at
// its batch sizes a CNN's activations dwarf its weights; at the small sizes
// a CPU step allows, a fraction of the whole arena would page mostly
// weights, gradients and optimizer state).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/op_registry.h"
#include "runtime/models/build.h"
#include "runtime/session/session.h"

using namespace pooch;

namespace {

constexpr double kCardFlops = 2.9e12;   // GTX 1650, f32
constexpr double kCardLink = 12e9;      // PCIe 3.0 x16, bytes/s each way (effective)
constexpr double kCardLatency = 10e-6;  // per copy
constexpr int kProfiledSteps = 3;       // the in-core profile: the median of this many steps

struct Bench {
  std::string name;
  ModelSpec spec;
};

ModelSpec chain(int layers, int width, int batch) {
  return mlp_chain_spec(layers, width, width, 16, batch);
}

ModelSpec norm_mlp(int batch) {
  ModelSpec s;
  s.family = Family::mlp;
  s.input = InputKind::dense;
  s.input_width = 256;
  s.labels = 10;
  s.loss = LossKind::softmax;
  for (int i = 0; i < 8; ++i) {
    s.layers.push_back({LayerKind::linear, 512, "relu", 0, 0});
    s.layers.push_back({LayerKind::dropout, 0, "none", 0.1, 0});
    s.layers.push_back({LayerKind::layernorm, 0, "none", 0, 0});
  }
  s.layers.push_back({LayerKind::dense_head, 0, "none", 0, 0});
  s.run.batch = batch;
  return s;
}

ModelSpec xmc(int batch) {
  ModelSpec s = spec_from_flags(InputKind::sparse, 20000, 4000, 512, 512, 32, LossKind::bce, 0.1);
  s.run.batch = batch;
  return s;
}

// ResNet-50 or VGG-16 on 3×size×size images, 10 classes.
ModelSpec cnn(Family f, int depth, int size, int batch) {
  ModelSpec s;
  s.family = f;
  s.input = InputKind::dense;
  s.labels = 10;
  s.loss = LossKind::softmax;
  s.cnn.depth = depth;
  s.cnn.height = s.cnn.width = size;
  s.cnn.hidden = 512;  // VGG's classifier: its 4096 would dwarf the features at this size
  s.run.batch = batch;
  return s;
}

void fill_inputs(Session& s, int step) {
  for (const IoTensor& io : s.model().inputs) {
    if (io.row_mask) continue;
    const TensorDesc& d = s.graph().tensor(io.id);
    const auto n = static_cast<size_t>(d.numel());
    if (d.dtype == DType::i32) {
      std::vector<int32_t> v(n);
      if (io.name == "batch.ptr" || io.name == "batch.lptr") {
        const int per = io.name == "batch.ptr" ? 40 : 3;
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i) * per;
      } else if (io.name == "batch.lidx") {
        for (size_t i = 0; i + 2 < n; i += 3)
          for (int k = 0; k < 3; ++k)
            v[i + k] =
                static_cast<int32_t>(((i / 3) * 13 + static_cast<size_t>(step)) % 1300 + k * 1300);
      } else {
        const int64_t bound = io.index_bound > 0 ? io.index_bound : 20000;
        for (size_t i = 0; i < n; ++i)
          v[i] = static_cast<int32_t>((i * 7919 + static_cast<size_t>(step)) %
                                      static_cast<size_t>(bound));
      }
      s.set_input(io.name, v.data(), n * 4);
    } else {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = std::sin(0.01f * static_cast<float>(i + static_cast<size_t>(step)));
      s.set_input(io.name, v.data(), n * 4);
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The q-quantile (0..1) of v, by the nearest rank.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Seconds of one train step on the inputs of step k.
double time_step(Session& s, int k) {
  fill_inputs(s, k);
  const auto a = std::chrono::steady_clock::now();
  s.run(ProgramKind::train_step);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Median seconds of `steps` train steps (after one warm-up).
double time_steps(Session& s, int steps) {
  fill_inputs(s, 0);
  s.run(ProgramKind::train_step);
  std::vector<double> t;
  for (int k = 1; k <= steps; ++k) t.push_back(time_step(s, k));
  return median(t);
}

// Planning time alone (no memory taken, nothing run: plan-only sessions)
// for chains whose train step has about 300, 1000 and 2000 nodes, at a
// budget that leaves a third of the activation memory, per strategy.
void planning_table(int threads) {
  fmt::print(
      "\nplanning time of a train step at 1/3 of its activation memory (estimated "
      "profile; milliseconds, the search alone, median of 3)\n");
  fmt::print("{:<14} {:>6} {:>6} {:>14} {:>14} {:>14} {:>14} {:>14}\n", "model", "nodes", "saved",
             "swap-all", "recompute-all", "checkpoint", "pooch-greedy", "auto");
  for (int layers : {50, 200, 400}) {
    const ModelSpec spec = chain(layers, 64, 32);
    SessionConfig base;
    base.device = DeviceKind::cpu;
    base.threads = threads;
    base.plan_only = true;
    base.max_paging = 0;  // the activation search alone (a strategy that cannot reach it: no fit)
    Session in_core(build_model(spec), base);
    const size_t arena = in_core.out_of_core().in_core_arena;
    size_t persistent = 0;
    for (Role r : {Role::weight, Role::optimizer_state})
      persistent += in_core.memory_plan().bytes_by_role[static_cast<int>(r)];
    size_t saved = 0;  // activations (gradients that wait are candidates too, not counted here)
    for (const SavedActivation& sa : saved_activations(in_core.graph(), in_core.train_request()))
      saved += sa.gradient ? 0 : 1;
    std::string row =
        fmt::format("{:<14} {:>6} {:>6}", fmt::format("mlp-chain{}", layers),
                    in_core.schedule(ProgramKind::train_step)->launches.size(), saved);
    for (Strategy st : {Strategy::swap_all, Strategy::recompute_all, Strategy::checkpoint_sqrt,
                        Strategy::pooch_greedy, Strategy::automatic}) {
      SessionConfig oc = base;
      oc.strategy = st;
      oc.device_memory = persistent + (arena - persistent) / 3;
      std::vector<double> ms;
      int tried = 0;
      try {
        for (int k = 0; k < 3; ++k) {
          Session s(build_model(spec), oc);
          ms.push_back(s.out_of_core().plan_seconds * 1e3);
          tried = s.out_of_core().plans_tried;
        }
        std::sort(ms.begin(), ms.end());
        row += fmt::format(" {:>14}", fmt::format("{:.1f} ({})", ms[1], tried));
      } catch (const Error&) {
        row += fmt::format(" {:>14}", "no fit");
      }
    }
    fmt::print("{}\n", row);
  }
  fmt::print("(in parentheses: candidate plans the search evaluated)\n");
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 7, threads = 2;
  bool quick = false, planning_only = false, cnns = false, activations = false, repaging = false;
  std::string only;  // --only NAME: that benchmark model alone
  DeviceKind device = DeviceKind::cpu;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--planning")
      planning_only = true;
    else if (a == "--steps" && i + 1 < argc)
      steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--quick")
      quick = true;
    else if (a == "--cnn")
      cnns = true;
    else if (a == "--activations")
      activations = true;
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--repaging")
      repaging = true;
    else if (a == "--device" && i + 1 < argc &&
             (argv[i + 1] == std::string("cpu") || argv[i + 1] == std::string("cuda")))
      device = parse_device_kind(argv[++i]);
    else {
      fmt::print(stderr,
                 "usage: pooch-bench-ooc [--steps N] [--threads T] [--quick] [--planning] "
                 "[--cnn] [--activations] [--only NAME] [--repaging] [--device cpu|cuda]\n");
      return 2;
    }
  }
  try {
    // --cnn: the CNN workloads alone; on a GPU the tables alone
    if (!cnns && device == DeviceKind::cpu) planning_table(threads);
  } catch (const Error& e) {
    fmt::print(stderr, "pooch-bench-ooc: {}\n", e.what());
    return 1;
  }
  if (planning_only) return 0;
  std::vector<Bench> benches = {
      {"mlp-chain50", chain(50, 512, 256)}, {"mlp-norm-dropout", norm_mlp(512)}, {"xmc", xmc(256)}};
  if (cnns)
    benches = {{"resnet50-64px", cnn(Family::resnet, 50, 64, 8)},
               {"vgg16-64px", cnn(Family::vgg, 16, 64, 8)}};
  if (quick) benches.resize(1);
  if (!only.empty()) {
    std::erase_if(benches, [&](const Bench& b) { return b.name != only; });
    if (benches.empty()) {
      fmt::print(stderr, "pooch-bench-ooc: --only {}: no such benchmark model here\n", only);
      return 2;
    }
  }
  try {
    for (const Bench& b : benches) {
      SessionConfig base;
      base.device = device;
      base.threads = threads;
      const bool emulated = device == DeviceKind::cpu;  // the link, scaled to a GTX 1650's
      // In core: the time every ratio divides, and the CPU's compute rate.
      Session in_core(build_model(b.spec), base);
      fill_inputs(in_core, 0);
      in_core.run(ProgramKind::train_step);  // the first step runs cold (Session::run)
      for (int k = 0; k < kProfiledSteps; ++k) in_core.run_profiled_train_step();
      const Profile& prof = in_core.profile();
      double flops = 0, secs = 0;
      for (const Launch& l : in_core.schedule(ProgramKind::train_step)->launches) {
        flops += node_flops(in_core.graph(), in_core.graph().nodes()[static_cast<size_t>(l.node)]);
        secs += prof.node_seconds[static_cast<size_t>(l.node)];
      }
      const double rate = flops / std::max(secs, 1e-9);
      const double scale = rate / kCardFlops;
      const double link = kCardLink * scale;
      // The in-core step before the strategies; each budget's ratios divide
      // by the in-core steps timed in that budget's rounds (below), and it is
      // measured again after them, so that a reader sees how far the machine
      // moved during the table.
      double t_in = time_steps(in_core, steps);
      const size_t arena = in_core.out_of_core().in_core_arena;
      size_t persistent = 0;
      for (Role r : {Role::weight, Role::optimizer_state})
        persistent += in_core.memory_plan().bytes_by_role[static_cast<int>(r)];
      size_t saved = 0;
      for (const SavedActivation& sa : saved_activations(in_core.graph(), in_core.train_request()))
        if (!sa.gradient) saved += sa.bytes;
      // The simulator's error on the in-core step itself: what its profile
      // of isolated launches says against an unprofiled step.
      const double sim_in = in_core.out_of_core().predicted_seconds;
      fmt::print(
          "\n{}: in-core step {:.1f} ms (simulated {:.1f} ms, {:+.1f}%), arena {:.1f} MiB "
          "(weights and optimizer state {:.1f} MiB, saved activations {:.1f} MiB); {} {:.1f} "
          "GFLOP/s",
          b.name, t_in * 1e3, sim_in * 1e3, (sim_in - t_in) / t_in * 100, arena / 1048576.0,
          persistent / 1048576.0, saved / 1048576.0, in_core.backend_name(), rate / 1e9);
      if (emulated)
        fmt::print(" = {:.4f} x GTX 1650, so the link is {:.3g} MB/s and {:.0f} us a copy\n", scale,
                   link / 1e6, kCardLatency / scale * 1e6);
      else
        fmt::print(", over the card's own link (measured by each session's profiled steps)\n");
      fmt::print("{:<16} {:>7} {:>10} {:>9} {:>9} {:>9} {:>11} {:>8} {:>9} {:>8}\n", "strategy",
                 "budget", "arena MiB", "swap MiB", "recomp.", "paged", "measured", "ratio",
                 "sim err", "plan ms");
      for (double keep : {1.0 / 2, 1.0 / 3, 1.0 / 5}) {
        // Every strategy's session first (each measured and planned again,
        // as a session that trains for a while is), then their steps timed
        // in rounds, two steps of each (the in-core session's too) a round:
        // the machine's drift over a budget's minute then moves every
        // strategy alike, where timing one strategy after the other let it
        // decide which of two close plans measured faster.
        struct Run {
          Strategy strategy;
          bool replan_paging = true;  // false: auto-no-repage
          std::unique_ptr<Session> session;
          double predicted = 0;
          std::vector<double> seconds;
          size_t paged_at_creation = 0;  // before the measured steps (which may replan it)
        };
        std::vector<Run> runs;
        const std::string budget_name = fmt::format("{}1/{:.0f}", activations ? "a" : "", 1 / keep);
        std::vector<std::pair<Strategy, bool>> plans = {{Strategy::swap_all, true},
                                                        {Strategy::recompute_all, true},
                                                        {Strategy::checkpoint_sqrt, true},
                                                        {Strategy::pooch_greedy, true},
                                                        {Strategy::automatic, true}};
        if (repaging) plans.push_back({Strategy::automatic, false});
        for (const auto& [st, replan] : plans) {
          SessionConfig oc = base;
          oc.strategy = st;
          oc.replan_paging = replan;
          oc.device_memory =
              activations ? arena - static_cast<size_t>(static_cast<double>(saved) * (1 - keep))
                          : static_cast<size_t>(static_cast<double>(arena) * keep);
          if (emulated) {
            oc.link_bandwidth = link;
            oc.link_latency = kCardLatency / scale;
          }
          try {
            auto s = std::make_unique<Session>(build_model(b.spec), oc);
            const size_t paged_at_creation = s->out_of_core().paged_bytes;
            fill_inputs(*s, 0);
            // As a session that trains: the first step cold, then
            // Session::kMeasuredSteps measured ones, each node's median the
            // profile the step is planned again from.
            for (size_t k = 0; k <= Session::kMeasuredSteps; ++k) {
              fill_inputs(*s, static_cast<int>(k));
              s->run(ProgramKind::train_step);
            }
            s->run(ProgramKind::train_step);  // warm: the plan just made runs once untimed
            const double predicted = s->out_of_core().predicted_seconds;
            runs.push_back({st, replan, std::move(s), predicted, {}, paged_at_creation});
          } catch (const Error& e) {
            fmt::print("{:<16} {:>9} does not fit: {}\n",
                       replan ? strategy_name(st) : "auto-no-repage", budget_name, e.what());
          }
        }
        // Each round starts one session further on, so that no session
        // always follows the same one (a step right after checkpoint-sqrt's
        // slow one measured 4% slower: the same pooch-greedy plan, 131.6 ms
        // there and 125.6 ms first). In a round a session runs two steps and
        // the second is timed: its caches then hold what its own step left,
        // as when it trains alone.
        std::vector<double> in_core_seconds;
        const size_t n_runs = runs.size() + 1;  // and the in-core session, last
        auto warm_then_time = [&](Session& s, int k) {
          time_step(s, k);
          return time_step(s, k);
        };
        for (int k = 1; k <= steps; ++k)
          for (size_t j = 0; j < n_runs; ++j) {
            const size_t at = (j + static_cast<size_t>(k)) % n_runs;
            if (at == runs.size())
              in_core_seconds.push_back(warm_then_time(in_core, k));
            else
              runs[at].seconds.push_back(warm_then_time(*runs[at].session, k));
          }
        const double t_round = median(in_core_seconds);
        for (const Run& run : runs) {
          const double t = median(run.seconds);
          const OutOfCoreReport& r = run.session->out_of_core();
          fmt::print(
              "{:<16} {:>7} {:>10.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}ms {:>7.2f}x {:>8.1f}% "
              "{:>8.1f}\n",
              run.replan_paging ? strategy_name(run.strategy) : "auto-no-repage", budget_name,
              run.session->memory_plan().peak / 1048576.0, r.swapped_bytes / 1048576.0,
              r.recomputed_bytes / 1048576.0, r.paged_bytes / 1048576.0, t * 1e3, t / t_round,
              (run.predicted - t) / t * 100, r.planning_seconds * 1e3);
        }
        fmt::print("{:<16} {:>7} in-core step in the same rounds: {:.1f} ms (the ratios' base)\n",
                   "", budget_name, t_round * 1e3);
        // auto against pooch-greedy (and against itself without
        // re-paging) round by round (their steps in a round are a few
        // seconds apart): whether auto is faster, or the two only differ by
        // the machine's drift.
        const Run* greedy = nullptr;
        const Run* automatic = nullptr;
        const Run* no_repage = nullptr;
        for (const Run& run : runs) {
          if (run.strategy == Strategy::pooch_greedy) greedy = &run;
          if (run.strategy == Strategy::automatic)
            (run.replan_paging ? automatic : no_repage) = &run;
        }
        auto round_by_round = [&](const Run& other, const char* name) {
          std::vector<double> per_round;
          int faster = 0;
          for (size_t k = 0; k < other.seconds.size(); ++k) {
            per_round.push_back(automatic->seconds[k] / other.seconds[k]);
            faster += automatic->seconds[k] < other.seconds[k];
          }
          fmt::print(
              "{:<16} {:>7} auto / {} round by round: median {:.3f} (quartiles {:.3f}-{:.3f}), "
              "auto faster in {} of {} rounds",
              "", budget_name, name, median(per_round), quantile(per_round, 0.25),
              quantile(per_round, 0.75), faster, per_round.size());
        };
        if (greedy && automatic) {
          round_by_round(*greedy, "pooch-greedy");
          fmt::print("; auto's plan started from {}\n",
                     strategy_name(automatic->session->out_of_core().strategy));
          // Each plan simulated under the other session's measured profile
          // too: where auto measures slower, whether its plan is slower at
          // the same times (the search's fault) or the two sessions measured
          // different times (the profiles' noise chose the plans).
          const Session& a = *automatic->session;
          const Session& p = *greedy->session;
          auto sim_ms = [](const Session& plan, const Session& times) {
            return simulate(*plan.schedule(ProgramKind::train_step), times.profile()).seconds * 1e3;
          };
          fmt::print(
              "{:<16} {:>7} simulated under auto's measured profile: auto {:.1f} ms, pooch-greedy "
              "{:.1f} ms; under pooch-greedy's: auto {:.1f} ms, pooch-greedy {:.1f} ms\n",
              "", budget_name, sim_ms(a, a), sim_ms(p, a), sim_ms(a, p), sim_ms(p, p));
          if (const OutOfCoreReport& r = automatic->session->out_of_core(); r.repaged)
            fmt::print(
                "{:<16} {:>7} auto's paging was planned again from the measured steps: {:.1f} MiB "
                "paged, {:.1f} MiB at creation ({:.1f} ms)\n",
                "", budget_name, r.paged_bytes / 1048576.0,
                automatic->paged_at_creation / 1048576.0, r.repage_seconds * 1e3);
        }
        if (no_repage && automatic) {
          round_by_round(*no_repage, "auto-no-repage");
          fmt::print("\n");
        }
      }
      const double again = time_steps(in_core, steps);
      fmt::print("in-core step measured again after the strategies: {:.1f} ms (first {:.1f} ms)\n",
                 again * 1e3, t_in * 1e3);
    }
  } catch (const Error& e) {
    fmt::print(stderr, "pooch-bench-ooc: {}\n", e.what());
    return 1;
  }
  return 0;
}
