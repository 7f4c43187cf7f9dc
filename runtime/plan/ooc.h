// Out-of-core planning: a profile of one step (measured, or estimated from
// FLOPs and bytes), a simulator that replays a schedule on the compute and
// the two copy streams, and the strategies that decide, for every saved
// activation, keep, swap or recompute so that a train step fits a budget.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "planner.h"

namespace pooch {

enum class Strategy {  // the values are pooch.h's pooch_strategy
  keep = 0,            // in core: everything stays
  swap_all,            // every saved activation goes to the host pool and back
  recompute_all,       // every saved activation recomputed whose producer reads none (one level)
  checkpoint_sqrt,     // keep every ceil(sqrt(n))-th saved activation, recompute the rest (Chen et
                       // al.)
  pooch_greedy,  // PoocH: all swapped; kept latest first while it fits; recomputed where cheaper
  automatic,     // the best of the above, improved by local search over the simulator
};
const char* strategy_name(Strategy s);
// "keep", "swap-all", "recompute-all", "checkpoint-sqrt", "pooch-greedy",
// "auto" (any case); Error(POOCH_ERR_INVALID_ARG) naming the word otherwise.
Strategy parse_strategy(const std::string& name);

struct LinkModel {
  double h2d_bandwidth = 12e9;  // bytes per second
  double d2h_bandwidth = 12e9;
  double latency = 10e-6;  // seconds per copy
  // Seconds a copy of one byte takes from the compute stream while it runs
  // beside it: 0 where copies have engines of their own (a GPU's), the
  // memcpy's time where they are made by threads on the cores the kernels
  // use (Backend::copy_compute_seconds_per_byte).
  double compute_seconds_per_byte = 0;
};

struct Profile {
  std::vector<double> node_seconds;  // per graph node
  // Per graph node with a replay (OpDef::replay: what a recompute of its
  // output runs, a batch normalisation from its saved statistics): the
  // replay's time; 0 or empty where none is known (node_seconds stands for it).
  std::vector<double> replay_seconds;
  // Per graph node, as a host kernel (an optimizer update where its state
  // lives); empty: the same as node_seconds (the CPU backend's host kernels
  // are its kernels).
  std::vector<double> host_node_seconds;
  LinkModel link;
  double host_seconds(size_t node) const {
    return host_node_seconds.empty() ? node_seconds[node] : host_node_seconds[node];
  }
  // What remaking the node's output costs: its replay's time where it has
  // one and it is known, else the node's.
  double recompute_seconds(size_t node) const {
    return node < replay_seconds.size() && replay_seconds[node] > 0 ? replay_seconds[node]
                                                                    : node_seconds[node];
  }
};

// Each node's time estimated as the slower of its FLOPs at `flops_per_second`
// and its bytes at `bytes_per_second`, plus `launch_seconds` (a roofline: a
// planning guess before a measurement, or a card's description).
Profile estimate_profile(const Graph& g, double flops_per_second, double bytes_per_second,
                         const LinkModel& link, double launch_seconds = 2e-6);
// The latency of copies timed one at a time, bytes[i] taking seconds[i]:
// the intercept of a line through them (weighted so that each copy's
// relative error counts alike). None where there are fewer than four, their
// sizes span less than a factor of four, or the line makes no sense (a
// negative intercept or slope).
std::optional<double> copy_latency(const std::vector<double>& bytes,
                                   const std::vector<double>& seconds);
// Each node's time from a timed run of a schedule (Executor::run_timed);
// the link's latency (copy_latency, over both ways) and bandwidth each way
// from its copies when it made enough, else `link`'s.
Profile measured_profile(const Graph& g, const Schedule& s, const StepTimes& t,
                         const LinkModel& link);
// Each node's median time over several measured profiles of one graph, and
// the median of each link bandwidth (one slow run, a page fault or another
// process's burst, does not move the plan). Error POOCH_ERR_INVALID_ARG when
// `runs` is empty or their node counts differ.
Profile median_profile(const std::vector<Profile>& runs);

struct Simulation {
  double seconds = 0;          // the step, first copy to last
  double compute_seconds = 0;  // launches alone
  // Host kernels (launches on a copy stream): their time on the host, which
  // the compute stream waits for as it waits for copies (a sparse input
  // layer on the host can be most of a step's stall).
  double host_seconds = 0;
  double stall_seconds() const { return seconds - compute_seconds; }
};
// Replays the schedule's steps on three timelines with their event waits
// (simulate_timeline), and sums them up.
Simulation simulate(const Schedule& s, const Profile& p);

// When each step runs in the simulator, in seconds from the step's start
// (one per Schedule::steps entry): a launch or a copy from the moment its
// stream reaches it to that plus its time; a record or a wait takes none
// (start == end: the event's time, or the time the wait lets its stream on).
struct StepTiming {
  double start = 0, end = 0;
};
std::vector<StepTiming> simulate_timeline(const Schedule& s, const Profile& p);

// The transient region's bytes live while each launch slot runs (slot i runs
// s.launches[i]), by what they hold. A buffer that takes an input's place in
// place counts once.
struct SlotOccupancy {
  size_t input = 0;       // the program's inputs (copied in)
  size_t activation = 0;  // activations on the device (kept, or before their swap or drop)
  size_t swapped = 0;     // swapped activations back on the device (prefetched)
  size_t recomputed = 0;  // recomputed activations
  size_t gradient = 0;
  size_t workspace = 0;  // kernels' scratch
  size_t paged = 0;      // paged weights and optimizer state, copied in from their home
  size_t top = 0;        // the highest byte in use above the region's start
  size_t total() const {
    return input + activation + swapped + recomputed + gradient + workspace + paged;
  }
};
std::vector<SlotOccupancy> transient_occupancy(const Graph& g, const Schedule& s);

struct OocPlan {
  Schedule schedule;
  Simulation sim;
  Strategy strategy = Strategy::keep;  // the strategy that made it (auto: the one it started from)
  int plans_tried = 0;
};

// Plans a train step (`base` with its split) under `strategy` so that its
// arena fits `budget` bytes and its host pool (staging, paged homes, swap
// slots) `host_budget` bytes (0: no cap). Throws Error(POOCH_ERR_OUT_OF_BUDGET)
// naming the smallest arena the strategy reached when none fits, or the
// smallest host pool of the plans that fit the device when only the host cap
// is missed.
OocPlan plan_out_of_core(const Graph& g, const ProgramRequest& base, const Backend& backend,
                         const SessionLayout& layout, const PlanOptions& opt, Strategy strategy,
                         size_t budget, const Profile& profile, size_t host_budget = 0);

}  // namespace pooch
