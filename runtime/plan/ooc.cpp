#include "ooc.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"

namespace pooch {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::keep:
      return "keep";
    case Strategy::swap_all:
      return "swap-all";
    case Strategy::recompute_all:
      return "recompute-all";
    case Strategy::checkpoint_sqrt:
      return "checkpoint-sqrt";
    case Strategy::pooch_greedy:
      return "pooch-greedy";
    case Strategy::automatic:
      return "auto";
  }
  return "?";
}

Strategy parse_strategy(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  for (Strategy k : {Strategy::keep, Strategy::swap_all, Strategy::recompute_all,
                     Strategy::checkpoint_sqrt, Strategy::pooch_greedy, Strategy::automatic})
    if (s == strategy_name(k)) return k;
  throw Error(POOCH_ERR_INVALID_ARG,
              fmt::format("unknown strategy '{}' (expected keep, swap-all, recompute-all, "
                          "checkpoint-sqrt, pooch-greedy or auto)",
                          name));
}

Profile estimate_profile(const Graph& g, double flops_per_second, double bytes_per_second,
                         const LinkModel& link) {
  Profile p;
  p.link = link;
  for (const Node& n : g.nodes()) {
    std::vector<const TensorDesc*> in, out;
    for (TensorId x : n.inputs) in.push_back(&g.tensor(x));
    for (TensorId y : n.outputs) out.push_back(&g.tensor(y));
    const OpDef& def = op_registry().get(n.op);
    const double flops = def.flops ? def.flops(in, out, n.attrs) : 0;
    p.node_seconds.push_back(
        std::max(flops / flops_per_second, op_bytes(in, out) / bytes_per_second) + 2e-6);
  }
  return p;
}

Profile measured_profile(const Graph& g, const Schedule& s, const StepTimes& t,
                         const LinkModel& link) {
  Profile p;
  p.link = link;
  p.node_seconds.assign(g.nodes().size(), 0);
  std::vector<char> seen(g.nodes().size(), 0);
  for (size_t i = 0; i < s.launches.size(); ++i) {
    const auto n = static_cast<size_t>(s.launches[i].node);
    if (seen[n]) continue;  // a recompute launch: the first run is the measurement
    seen[n] = 1;
    p.node_seconds[n] = t.launch_seconds[i];
  }
  double bytes[2] = {0, 0}, secs[2] = {0, 0};
  int count[2] = {0, 0};
  for (const ScheduleStep& st : s.steps) {
    if (st.kind != StepKind::copy_in && st.kind != StepKind::copy_out) continue;
    const int k = st.kind == StepKind::copy_in ? 0 : 1;
    bytes[k] += static_cast<double>(s.copies[static_cast<size_t>(st.index)].bytes);
    secs[k] += t.copy_seconds[static_cast<size_t>(st.index)];
    ++count[k];
  }
  for (int k = 0; k < 2; ++k) {
    const double transfer = secs[k] - count[k] * link.latency;
    if (count[k] == 0 || bytes[k] < 1e6 || transfer <= 0) continue;  // too little to measure
    (k == 0 ? p.link.h2d_bandwidth : p.link.d2h_bandwidth) = bytes[k] / transfer;
  }
  return p;
}

std::vector<StepTiming> simulate_timeline(const Schedule& s, const Profile& p) {
  double t[kNumStreams] = {0, 0, 0};
  std::vector<double> event(static_cast<size_t>(s.events), 0);
  std::vector<StepTiming> out(s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const ScheduleStep& st = s.steps[i];
    double& now = t[static_cast<int>(st.stream)];
    switch (st.kind) {
      case StepKind::launch:
        out[i].start = now;
        now += p.node_seconds[static_cast<size_t>(s.launches[static_cast<size_t>(st.index)].node)];
        break;
      case StepKind::copy_in:
      case StepKind::copy_out: {
        const double bw =
            st.kind == StepKind::copy_in ? p.link.h2d_bandwidth : p.link.d2h_bandwidth;
        out[i].start = now;
        now += p.link.latency +
               static_cast<double>(s.copies[static_cast<size_t>(st.index)].bytes) / bw;
        break;
      }
      case StepKind::record:
        event[static_cast<size_t>(st.index)] = now;
        out[i].start = now;
        break;
      case StepKind::wait:
        now = std::max(now, event[static_cast<size_t>(st.index)]);
        out[i].start = now;
        break;
    }
    out[i].end = now;
  }
  return out;
}

Simulation simulate(const Schedule& s, const Profile& p) {
  const std::vector<StepTiming> timeline = simulate_timeline(s, p);
  Simulation sim;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const ScheduleStep& st = s.steps[i];
    if (st.kind == StepKind::launch)
      sim.compute_seconds +=
          p.node_seconds[static_cast<size_t>(s.launches[static_cast<size_t>(st.index)].node)];
    // A stream's time never goes back: the latest end is the latest stream.
    sim.seconds = std::max(sim.seconds, timeline[i].end);
  }
  return sim;
}

std::vector<SlotOccupancy> transient_occupancy(const Graph& g, const Schedule& s) {
  const size_t n_slots = s.launches.size();
  std::vector<SlotOccupancy> occ(n_slots);
  const auto& reqs = s.transient_requests;
  std::vector<char> seen(g.num_tensors(), 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const BufferRequest& r = reqs[i];
    const TensorId t = i < s.transient_tensor.size() ? s.transient_tensor[i] : kNoTensor;
    // A tensor's second request is the one that brings it back.
    const bool back = t != kNoTensor && seen[static_cast<size_t>(t)];
    if (t != kNoTensor) seen[static_cast<size_t>(t)] = 1;
    if (r.bytes == 0 || n_slots == 0) continue;
    const size_t first = static_cast<size_t>(std::max(0, r.first));
    const size_t last =
        r.last == kLiveForever ? n_slots - 1 : std::min(n_slots - 1, static_cast<size_t>(r.last));
    const size_t offset = s.transient.offsets[i];
    for (size_t sl = first; sl <= last; ++sl) {
      SlotOccupancy& o = occ[sl];
      o.top = std::max(o.top, offset + r.bytes);
      // Written in place over a buffer that dies at this slot: counted there once.
      if (r.inplace_of >= 0 && sl == first) {
        const BufferRequest& x = reqs[static_cast<size_t>(r.inplace_of)];
        if (s.transient.offsets[static_cast<size_t>(r.inplace_of)] == offset && x.last == r.first &&
            x.bytes >= r.bytes)
          continue;
      }
      if (t == kNoTensor) {
        o.workspace += r.bytes;
        continue;
      }
      switch (g.tensor(t).role) {
        case Role::input:
          o.input += r.bytes;
          break;
        case Role::gradient:
          o.gradient += r.bytes;
          break;
        default:
          if (back && s.residency[static_cast<size_t>(t)] == Residency::swap)
            o.swapped += r.bytes;
          else if (back && s.residency[static_cast<size_t>(t)] == Residency::recompute)
            o.recomputed += r.bytes;
          else
            o.activation += r.bytes;
      }
    }
  }
  return occ;
}

namespace {

struct Search {
  const Graph& g;
  const ProgramRequest& base;
  const Backend& backend;
  const SessionLayout& layout;
  const PlanOptions& opt;
  size_t budget;
  const Profile& profile;
  std::vector<SavedActivation> saved;
  int tried = 0;
  size_t smallest = std::numeric_limits<size_t>::max();

  struct Candidate {
    std::vector<Residency> residency;
    int lead = 1, lag = 1;
    Schedule schedule;
    Simulation sim;
    bool fits = false;
  };

  Candidate evaluate(std::vector<Residency> r, int lead, int lag) {
    ProgramRequest rq = base;
    rq.residency = std::move(r);
    rq.prefetch_lead = lead;
    rq.release_lag = lag;
    Candidate c;
    c.schedule = plan_schedule(g, rq, backend, layout, opt);
    c.residency = std::move(rq.residency);
    c.lead = lead;
    c.lag = lag;
    c.sim = simulate(c.schedule, profile);
    c.fits = c.schedule.arena_bytes <= budget;
    smallest = std::min(smallest, c.schedule.arena_bytes);
    ++tried;
    return c;
  }
  static bool better(const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.schedule.arena_bytes < b.schedule.arena_bytes;
    return a.sim.seconds < b.sim.seconds;
  }
  std::vector<Residency> all(Residency r) const {
    std::vector<Residency> v(g.num_tensors(), Residency::keep);
    for (const SavedActivation& sa : saved) v[static_cast<size_t>(sa.tensor)] = r;
    return v;
  }
  // Every saved activation whose producer reads no recomputed one: one level
  // of recompute (a chain recomputed from its start would bring every
  // activation back at once and save nothing).
  std::vector<Residency> recompute_one_level() const {
    std::vector<Residency> v(g.num_tensors(), Residency::keep);
    for (const SavedActivation& sa : saved) {
      if (!sa.recomputable) continue;
      bool reads_recomputed = false;
      for (TensorId x :
           g.nodes()[static_cast<size_t>(base.nodes[static_cast<size_t>(sa.producer)])].inputs)
        reads_recomputed = reads_recomputed || v[static_cast<size_t>(x)] == Residency::recompute;
      if (!reads_recomputed) v[static_cast<size_t>(sa.tensor)] = Residency::recompute;
    }
    return v;
  }
  // The prefetch lead and release lag that simulate fastest for these
  // decisions (a copy released at once and prefetched just in time needs the
  // least memory; earlier prefetches and later releases hide the copies).
  Candidate best_timing(const std::vector<Residency>& r) {
    Candidate best = evaluate(r, 1, 0);
    for (int lead : {1, 2, 4, 8})
      for (int lag : {0, 1, 2, 4}) {
        if (lead == 1 && lag == 0) continue;
        Candidate c = evaluate(r, lead, lag);
        if (better(c, best)) best = std::move(c);
      }
    return best;
  }

  Candidate checkpoint_sqrt() {
    std::vector<Residency> r = all(Residency::keep);
    const size_t n = saved.size();
    const auto k =
        static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(std::max<size_t>(n, 1)))));
    for (size_t i = 0; i < n; ++i)
      if (i % k != 0)
        r[static_cast<size_t>(saved[i].tensor)] =
            saved[i].recomputable ? Residency::recompute : Residency::swap;
    return evaluate(r, 1, 0);
  }

  // PoocH's search: all swapped; then kept, latest made first, while the plan
  // fits; then recomputed where the recompute costs less than the stall its
  // copies cause, smallest ratio first; prefetch timing last.
  Candidate pooch_greedy() {
    std::vector<Residency> r = all(Residency::swap);
    Candidate cur = evaluate(r, 1, 0);
    std::vector<size_t> order(saved.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return saved[a].producer > saved[b].producer; });
    for (size_t i : order) {
      const auto t = static_cast<size_t>(saved[i].tensor);
      r[t] = Residency::keep;
      Candidate c = evaluate(r, cur.lead, cur.lag);
      if (c.fits && c.sim.seconds <= cur.sim.seconds * 1.0000001 + 1e-12) {
        cur = std::move(c);
      } else if (c.fits && !cur.fits) {
        cur = std::move(c);
      } else {
        r[t] = Residency::swap;
      }
    }
    std::vector<std::pair<double, size_t>> ratio;
    const double bw = std::min(profile.link.h2d_bandwidth, profile.link.d2h_bandwidth);
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!saved[i].recomputable || r[static_cast<size_t>(saved[i].tensor)] != Residency::swap)
        continue;
      const double cost = profile.node_seconds[static_cast<size_t>(
          base.nodes[static_cast<size_t>(saved[i].producer)])];
      const double stall = 2 * (profile.link.latency + static_cast<double>(saved[i].bytes) / bw);
      ratio.emplace_back(cost / std::max(stall, 1e-12), i);
    }
    std::sort(ratio.begin(), ratio.end());
    for (const auto& [q, i] : ratio) {
      if (q >= 1) break;
      const auto t = static_cast<size_t>(saved[i].tensor);
      r[t] = Residency::recompute;
      Candidate c = evaluate(r, cur.lead, cur.lag);
      if (!better(c, cur)) {
        r[t] = Residency::swap;
        continue;
      }
      cur = std::move(c);
    }
    Candidate timed = best_timing(cur.residency);
    return better(timed, cur) ? timed : cur;
  }

  // One pass of local search: each saved activation tries the other two
  // residencies; a change stays when the plan still fits and runs faster.
  Candidate improve(Candidate cur) {
    for (const SavedActivation& sa : saved) {
      const auto t = static_cast<size_t>(sa.tensor);
      for (Residency alt : {Residency::keep, Residency::swap, Residency::recompute}) {
        if (alt == cur.residency[t] || (alt == Residency::recompute && !sa.recomputable)) continue;
        std::vector<Residency> r = cur.residency;
        r[t] = alt;
        Candidate c = evaluate(r, cur.lead, cur.lag);
        if (better(c, cur)) cur = std::move(c);
      }
    }
    Candidate timed = best_timing(cur.residency);
    return better(timed, cur) ? timed : cur;
  }
};

}  // namespace

OocPlan plan_out_of_core(const Graph& g, const ProgramRequest& base, const Backend& backend,
                         const SessionLayout& layout, const PlanOptions& opt, Strategy strategy,
                         size_t budget, const Profile& profile) {
  Search s{g, base, backend, layout, opt, budget, profile, saved_activations(g, base)};
  Search::Candidate best;
  Strategy from = strategy;
  switch (strategy) {
    case Strategy::keep:
      best = s.evaluate({}, 1, 1);
      break;
    case Strategy::swap_all:
      best = s.best_timing(s.all(Residency::swap));
      break;
    case Strategy::recompute_all:
      best = s.evaluate(s.recompute_one_level(), 1, 0);
      break;
    case Strategy::checkpoint_sqrt:
      best = s.checkpoint_sqrt();
      break;
    case Strategy::pooch_greedy:
      best = s.pooch_greedy();
      break;
    case Strategy::automatic: {
      best = s.evaluate({}, 1, 1);  // in core, when it fits, is the fastest there is
      from = Strategy::keep;
      if (best.fits) break;
      const std::pair<Strategy, Search::Candidate> tries[] = {
          {Strategy::pooch_greedy, s.pooch_greedy()},
          {Strategy::checkpoint_sqrt, s.checkpoint_sqrt()},
          {Strategy::recompute_all, s.evaluate(s.recompute_one_level(), 1, 0)},
          {Strategy::swap_all, s.best_timing(s.all(Residency::swap))}};
      for (const auto& [k, c] : tries)
        if (Search::better(c, best)) {
          best = c;
          from = k;
        }
      if (best.fits) best = s.improve(std::move(best));
      break;
    }
  }
  if (!best.fits)
    throw Error(POOCH_ERR_OUT_OF_BUDGET,
                fmt::format("the smallest arena strategy {} reached for the train step is {} bytes "
                            "({:.2f} MiB), more than the budget of {} bytes ({:.2f} MiB); it needs "
                            "a budget of at least {} MiB, or a smaller step (a smaller batch size)",
                            strategy_name(strategy), s.smallest, to_mib(s.smallest), budget,
                            to_mib(budget), mib_ceil(s.smallest)));
  OocPlan p;
  p.schedule = std::move(best.schedule);
  p.sim = best.sim;
  p.strategy = from;
  p.plans_tried = s.tried;
  return p;
}

}  // namespace pooch
