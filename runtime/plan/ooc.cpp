#include "ooc.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"
#include "program_facts.h"

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
                         const LinkModel& link, double launch_seconds) {
  Profile p;
  p.link = link;
  auto seconds_of = [&](const Node& n) {
    return std::max(node_flops(g, n) / flops_per_second, node_bytes(g, n) / bytes_per_second) +
           launch_seconds;
  };
  p.replay_seconds.assign(g.nodes().size(), 0);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpDef& def = op_registry().get(n.op);
    p.node_seconds.push_back(seconds_of(n));
    if (recompute_replays(n, def) && !def.replay.op.empty())
      p.replay_seconds[i] = seconds_of(recompute_node(n, def));
  }
  return p;
}

std::optional<double> copy_latency(const std::vector<double>& bytes,
                                   const std::vector<double>& seconds) {
  if (bytes.size() < 4 || bytes.size() != seconds.size()) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  if (*hi < 4 * std::max(*lo, 1.0)) return std::nullopt;
  // Weighted by 1/seconds², so that each copy's relative error counts
  // alike: unweighted, the largest copies decide the line and the
  // intercept is noise.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!(seconds[i] > 0)) return std::nullopt;
    const double w = 1 / (seconds[i] * seconds[i]);
    sw += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
  }
  const double det = sw * sxx - sx * sx;
  if (!(det > 0)) return std::nullopt;
  const double slope = (sw * sxy - sx * sy) / det;
  const double intercept = (sy - slope * sx) / sw;
  if (!(slope > 0) || !(intercept >= 0)) return std::nullopt;
  return intercept;
}

Profile measured_profile(const Graph& g, const Schedule& s, const StepTimes& t,
                         const LinkModel& link) {
  Profile p;
  p.link = link;
  p.node_seconds.assign(g.nodes().size(), 0);
  p.replay_seconds.assign(g.nodes().size(), 0);
  std::vector<char> seen(g.nodes().size(), 0);
  for (size_t i = 0; i < s.launches.size(); ++i) {
    const auto n = static_cast<size_t>(s.launches[i].node);
    if (i < s.launch_replay.size() && s.launch_replay[i]) {
      // A replay (a batch normalisation from its saved statistics) costs
      // what it costs, not what the node does.
      if (p.replay_seconds[n] == 0) p.replay_seconds[n] = t.launch_seconds[i];
      continue;
    }
    if (seen[n]) continue;  // a recompute launch: the first run is the measurement
    seen[n] = 1;
    // A host update's time stands for its device time too until one is
    // measured (on the CPU backend they are one kernel).
    p.node_seconds[n] = t.launch_seconds[i];
  }
  // Each way: the copies' (bytes, seconds), timed one at a time.
  std::vector<double> sizes[2], times[2];
  for (const ScheduleStep& st : s.steps) {
    if (st.kind != StepKind::copy_in && st.kind != StepKind::copy_out) continue;
    const int k = st.kind == StepKind::copy_in ? 0 : 1;
    sizes[k].push_back(static_cast<double>(s.copies[static_cast<size_t>(st.index)].bytes));
    times[k].push_back(t.copy_seconds[static_cast<size_t>(st.index)]);
  }
  // The latency: where a way's copies differ enough in size, the intercept
  // of a line through them; one figure for both ways (the model has one),
  // the ways' intercepts averaged by their copies. Else the model's.
  double latency_sum = 0, fitted = 0;
  for (int k = 0; k < 2; ++k)
    if (const std::optional<double> a = copy_latency(sizes[k], times[k])) {
      latency_sum += *a * static_cast<double>(sizes[k].size());
      fitted += static_cast<double>(sizes[k].size());
    }
  if (fitted > 0) p.link.latency = latency_sum / fitted;
  // The bandwidth each way: the copies' bytes over what is left of their
  // time after the latency.
  for (int k = 0; k < 2; ++k) {
    double bytes = 0, secs = 0;
    for (size_t i = 0; i < sizes[k].size(); ++i) {
      bytes += sizes[k][i];
      secs += times[k][i];
    }
    const double transfer = secs - static_cast<double>(sizes[k].size()) * p.link.latency;
    if (sizes[k].empty() || bytes < 1e6 || transfer <= 0) continue;  // too little to measure
    (k == 0 ? p.link.h2d_bandwidth : p.link.d2h_bandwidth) = bytes / transfer;
  }
  return p;
}

namespace {
// The median of v (the mean of the middle two for an even count).
double median_of(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}
}  // namespace

Profile median_profile(const std::vector<Profile>& runs) {
  if (runs.empty())
    throw Error(POOCH_ERR_INVALID_ARG, "median_profile: no measured profile to take it of");
  const size_t nodes = runs[0].node_seconds.size();
  for (const Profile& r : runs)
    if (r.node_seconds.size() != nodes)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("median_profile: profiles of {} and {} nodes are not of one graph",
                              nodes, r.node_seconds.size()));
  Profile p;
  p.node_seconds.resize(nodes);
  std::vector<double> v(runs.size());
  for (size_t n = 0; n < nodes; ++n) {
    for (size_t i = 0; i < runs.size(); ++i) v[i] = runs[i].node_seconds[n];
    p.node_seconds[n] = median_of(v);
  }
  // A replay's median over the runs that measured it (a run whose plan
  // recomputed nothing through it has none).
  p.replay_seconds.assign(nodes, 0);
  for (size_t n = 0; n < nodes; ++n) {
    std::vector<double> r;
    for (const Profile& run : runs)
      if (n < run.replay_seconds.size() && run.replay_seconds[n] > 0)
        r.push_back(run.replay_seconds[n]);
    if (!r.empty()) p.replay_seconds[n] = median_of(r);
  }
  for (size_t i = 0; i < runs.size(); ++i) v[i] = runs[i].link.h2d_bandwidth;
  p.link.h2d_bandwidth = median_of(v);
  for (size_t i = 0; i < runs.size(); ++i) v[i] = runs[i].link.d2h_bandwidth;
  p.link.d2h_bandwidth = median_of(v);
  for (size_t i = 0; i < runs.size(); ++i) v[i] = runs[i].link.latency;
  p.link.latency = median_of(v);
  p.link.compute_seconds_per_byte = runs.back().link.compute_seconds_per_byte;
  return p;
}

namespace {
bool replay_slot(const Schedule& s, size_t slot) {
  return slot < s.launch_replay.size() && s.launch_replay[slot];
}
// The link's time for a copy step (copy_in or copy_out) of `bytes`.
double copy_seconds(const Profile& p, StepKind kind, double bytes) {
  const double bw = kind == StepKind::copy_in ? p.link.h2d_bandwidth : p.link.d2h_bandwidth;
  return p.link.latency + bytes / bw;
}
}  // namespace

std::vector<StepTiming> simulate_timeline(const Schedule& s, const Profile& p) {
  double t[kNumStreams] = {0, 0, 0};
  std::vector<double> event(static_cast<size_t>(s.events), 0);
  std::vector<StepTiming> out(s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const ScheduleStep& st = s.steps[i];
    double& now = t[static_cast<int>(st.stream)];
    switch (st.kind) {
      case StepKind::launch: {
        // A launch on a copy stream is a host kernel.
        const auto slot = static_cast<size_t>(st.index);
        const auto node = static_cast<size_t>(s.launch_node[slot]);
        out[i].start = now;
        now += st.stream != Stream::compute ? p.host_seconds(node)
               : replay_slot(s, slot)       ? p.recompute_seconds(node)
                                            : p.node_seconds[node];
        break;
      }
      case StepKind::copy_in:
      case StepKind::copy_out: {
        const auto bytes = static_cast<double>(s.copies[static_cast<size_t>(st.index)].bytes);
        out[i].start = now;
        now += copy_seconds(p, st.kind, bytes);
        // A copy made by the compute cores delays the kernels that run
        // while it is made: those after the compute stream's time, where the
        // copy starts no later (a swap-out starts at its producer's end, which
        // is the compute stream's time when it is replayed). Where the
        // compute stream then waits for this copy, the copy's own end, later
        // on a link slower than memcpy, decides.
        double& compute = t[static_cast<int>(Stream::compute)];
        if (p.link.compute_seconds_per_byte > 0 && st.stream != Stream::compute &&
            out[i].start <= compute)
          compute += bytes * p.link.compute_seconds_per_byte;
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
    if (st.kind == StepKind::launch) {
      const auto slot = static_cast<size_t>(st.index);
      const auto node = static_cast<size_t>(s.launch_node[slot]);
      if (st.stream != Stream::compute)
        sim.host_seconds += p.host_seconds(node);
      else
        sim.compute_seconds +=
            replay_slot(s, slot) ? p.recompute_seconds(node) : p.node_seconds[node];
    }
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
        case Role::weight:
        case Role::optimizer_state:
          o.paged += r.bytes;
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
  size_t host_budget = 0;  // 0: no cap
  PlanCache cache{true};   // candidates: launches reused, no names or arguments
  int tried = 0;
  size_t smallest = std::numeric_limits<size_t>::max();
  // The smallest host pool among plans whose arena fits (for the error when
  // only the host cap is missed).
  size_t smallest_host = std::numeric_limits<size_t>::max();

  struct Candidate {
    std::vector<Residency> residency;
    int lead = 1, lag = 1;
    bool remake_unsaved = true;
    Schedule schedule;
    Simulation sim;
    bool fits = false;
  };

  Candidate evaluate(std::vector<Residency> r, int lead, int lag) {
    ProgramRequest rq = base;
    rq.residency = std::move(r);
    rq.prefetch_lead = lead;
    rq.release_lag = lag;
    rq.remake_unsaved = remake_unsaved;
    Candidate c;
    c.remake_unsaved = remake_unsaved;
    c.schedule = plan_schedule(g, rq, backend, layout, opt, &cache);
    c.residency = std::move(rq.residency);
    c.lead = lead;
    c.lag = lag;
    c.sim = simulate(c.schedule, profile);
    const bool device_fits = c.schedule.arena_bytes <= budget;
    c.fits = device_fits && (host_budget == 0 || c.schedule.host_bytes <= host_budget);
    smallest = std::min(smallest, c.schedule.arena_bytes);
    if (device_fits) smallest_host = std::min(smallest_host, c.schedule.host_bytes);
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
  // Every saved activation whose recompute reads no recomputed one (through
  // what it remakes on its way): one level of recompute (a chain recomputed
  // from its start would bring every activation back at once and save
  // nothing).
  std::vector<Residency> recompute_one_level() const {
    std::vector<Residency> v(g.num_tensors(), Residency::keep);
    for (const SavedActivation& sa : saved) {
      if (!sa.recomputable) continue;
      bool reads_recomputed = false;
      for (TensorId x : remake_reads[static_cast<size_t>(sa.tensor)])
        reads_recomputed = reads_recomputed || v[static_cast<size_t>(x)] == Residency::recompute;
      if (!reads_recomputed) v[static_cast<size_t>(sa.tensor)] = Residency::recompute;
    }
    return v;
  }
  // The prefetch lead and release lag that simulate fastest for these
  // decisions (a copy released at once and prefetched just in time needs the
  // least memory; earlier prefetches and later releases hide the copies):
  // the lead first (lag 0), then the lag at the best lead, 9 plans. The lead
  // counts launches, so it reaches up to 32: where launches are short (a
  // LoRA backward pass's frozen layers and gradient-norm links), 8 launches
  // are too little time to hide a copy; GPT-2 1.5B LoRA planned for an RTX
  // 3050 went from 1.05x to 1.01x in core with leads of 16 and 32.
  Candidate best_timing(const std::vector<Residency>& r) {
    Candidate best = evaluate(r, 1, 0);
    for (int lead : {2, 4, 8, 16, 32}) {
      Candidate c = evaluate(r, lead, 0);
      if (better(c, best)) best = std::move(c);
    }
    const int lead = best.lead;
    for (int lag : {1, 2, 4}) {
      Candidate c = evaluate(r, lead, lag);
      if (better(c, best)) best = std::move(c);
    }
    return best;
  }

  // Seconds the compute stream waits, per tensor, on the copies of a swapped
  // activation (its copy out before its region is reused, its prefetch
  // before its backward use), in the candidate's simulated timeline: what
  // its swap costs. A tensor whose copies cause no wait is not worth
  // recomputing or keeping for speed.
  std::vector<double> stalls(const Candidate& c) const {
    const Schedule& sc = c.schedule;
    std::vector<TensorId> event_tensor(static_cast<size_t>(sc.events), kNoTensor);
    for (size_t i = 0; i + 1 < sc.steps.size(); ++i) {
      const ScheduleStep& st = sc.steps[i];
      const ScheduleStep& next = sc.steps[i + 1];
      if ((st.kind == StepKind::copy_in || st.kind == StepKind::copy_out) &&
          next.kind == StepKind::record && next.stream == st.stream)
        event_tensor[static_cast<size_t>(next.index)] =
            sc.copies[static_cast<size_t>(st.index)].tensor;
    }
    const std::vector<StepTiming> tl = simulate_timeline(sc, profile);
    std::vector<double> out(g.num_tensors(), 0);
    double compute_now = 0;
    for (size_t i = 0; i < sc.steps.size(); ++i) {
      const ScheduleStep& st = sc.steps[i];
      if (st.stream != Stream::compute) continue;
      if (st.kind == StepKind::wait) {
        const TensorId t = event_tensor[static_cast<size_t>(st.index)];
        if (t != kNoTensor) out[static_cast<size_t>(t)] += std::max(0.0, tl[i].end - compute_now);
      }
      compute_now = tl[i].end;
    }
    return out;
  }

  // Whether the plans being made remake the never-saved activations a
  // recompute reads (ProgramRequest::remake_unsaved); both are searched.
  bool remake_unsaved = true;
  // Per tensor: what its recompute costs, and the tensors it reads that it
  // does not remake on its way (price_recomputes), with remaking on.
  std::vector<double> remake = {};
  std::vector<std::vector<TensorId>> remake_reads = {};
  bool any_unsaved = false;  // some recompute would remake something
  double producer_seconds(const SavedActivation& sa) const {
    return remake_unsaved ? remake[static_cast<size_t>(sa.tensor)]
                          : profile.recompute_seconds(
                                static_cast<size_t>(base.nodes[static_cast<size_t>(sa.producer)]));
  }
  // A recompute runs its producer (or the producer's replay), and before it
  // the producers of the never-saved activations it remakes on its way
  // (saved_activations' `through`), each once.
  void price_recomputes() {
    const Aliases al = find_aliases(g, base);
    std::vector<SavedActivation> through;
    (void)saved_activations(g, base, al, &through);
    std::vector<int> made_at(g.num_tensors(), -1);  // a through tensor's producer
    for (const SavedActivation& sa : through) made_at[static_cast<size_t>(sa.tensor)] = sa.producer;
    any_unsaved = !through.empty();
    remake.assign(g.num_tensors(), 0);
    remake_reads.assign(g.num_tensors(), {});
    std::vector<size_t> seen(base.nodes.size(), SIZE_MAX);  // the last saved index that ran it
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!saved[i].recomputable) continue;
      double seconds = 0;
      std::vector<int> todo{saved[i].producer};
      seen[static_cast<size_t>(saved[i].producer)] = i;
      while (!todo.empty()) {
        const int ni = base.nodes[static_cast<size_t>(todo.back())];
        todo.pop_back();
        seconds += profile.recompute_seconds(static_cast<size_t>(ni));
        const Node& nd = g.nodes()[static_cast<size_t>(ni)];
        for (TensorId x : recompute_node(nd, op_registry().get(nd.op)).inputs) {
          const TensorId r = al.root[static_cast<size_t>(x)];
          const int q = made_at[static_cast<size_t>(r)];
          if (q < 0) remake_reads[static_cast<size_t>(saved[i].tensor)].push_back(r);
          if (q < 0 || seen[static_cast<size_t>(q)] == i) continue;
          seen[static_cast<size_t>(q)] = i;
          todo.push_back(q);
        }
      }
      remake[static_cast<size_t>(saved[i].tensor)] = seconds;
    }
  }
  double transfer_seconds(const SavedActivation& sa) const {
    const double bw = std::min(profile.link.h2d_bandwidth, profile.link.d2h_bandwidth);
    return profile.link.latency + static_cast<double>(sa.bytes) / bw;
  }

  // A necessary condition for keeping `sa` on the device in `c`: the bytes
  // live in each launch slot of its gap (a lower bound of any placement),
  // plus its own, within the budget. Candidates that fail it are not planned.
  struct LiveBytes {
    std::vector<int64_t> per_slot;         // live transient bytes per launch slot
    std::vector<int> gap_first, gap_last;  // per tensor: the slots it is off the device
  };
  LiveBytes live_bytes(const Candidate& c) const {
    const Schedule& sc = c.schedule;
    const size_t n_slots = sc.launch_node.size();
    LiveBytes lb;
    std::vector<int64_t> delta(n_slots + 1, 0);
    lb.gap_first.assign(g.num_tensors(), -1);
    lb.gap_last.assign(g.num_tensors(), -1);
    std::vector<int> first_req(g.num_tensors(), -1);
    for (size_t i = 0; i < sc.transient_requests.size(); ++i) {
      const BufferRequest& r = sc.transient_requests[i];
      if (r.bytes == 0 || n_slots == 0) continue;
      const size_t f = static_cast<size_t>(std::max(0, r.first));
      const size_t l =
          r.last == kLiveForever ? n_slots - 1 : std::min(n_slots - 1, static_cast<size_t>(r.last));
      delta[f] += static_cast<int64_t>(r.bytes);
      delta[l + 1] -= static_cast<int64_t>(r.bytes);
      if (r.inplace_of >= 0) {  // shares its input's bytes at its first slot
        delta[f] -= static_cast<int64_t>(r.bytes);
        delta[f + 1] += static_cast<int64_t>(r.bytes);
      }
      const TensorId t = i < sc.transient_tensor.size() ? sc.transient_tensor[i] : kNoTensor;
      if (t == kNoTensor) continue;
      const auto ti = static_cast<size_t>(t);
      if (first_req[ti] < 0) {
        first_req[ti] = static_cast<int>(i);
      } else if (lb.gap_first[ti] < 0) {  // its second interval: the gap lies between the two
        lb.gap_first[ti] = sc.transient_requests[static_cast<size_t>(first_req[ti])].last + 1;
        lb.gap_last[ti] = r.first - 1;
      }
    }
    lb.per_slot.assign(n_slots, 0);
    int64_t live = 0;
    for (size_t sl = 0; sl < n_slots; ++sl) lb.per_slot[sl] = live += delta[sl];
    return lb;
  }
  bool may_keep(const Candidate& c, const LiveBytes& lb, const SavedActivation& sa) const {
    const auto t = static_cast<size_t>(sa.tensor);
    const size_t base_bytes = c.schedule.arena_bytes - c.schedule.transient.peak;
    int64_t most = 0;
    for (int sl = std::max(0, lb.gap_first[t]); sl <= lb.gap_last[t]; ++sl)
      most = std::max(most, lb.per_slot[static_cast<size_t>(sl)]);
    return base_bytes + static_cast<size_t>(most) + sa.bytes <= budget;
  }

  Candidate checkpoint_sqrt() {
    // Chen et al. segment the activations; gradients stay on the device.
    std::vector<Residency> r = all(Residency::keep);
    std::vector<const SavedActivation*> acts;
    for (const SavedActivation& sa : saved)
      if (!sa.gradient) acts.push_back(&sa);
    const size_t n = acts.size();
    const auto k =
        static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(std::max<size_t>(n, 1)))));
    for (size_t i = 0; i < n; ++i)
      if (i % k != 0)
        r[static_cast<size_t>(acts[i]->tensor)] =
            acts[i]->recomputable ? Residency::recompute : Residency::swap;
    return evaluate(r, 1, 0);
  }

  // Keeps the longest prefix of `order` (indices into `saved`) on top of
  // `cur`'s plan that still fits and simulates no slower, by bisection
  // (keeping more never needs less memory): log2(n) plans instead of n.
  // `cur` becomes that plan; returns the prefix's length.
  size_t keep_longest_prefix(Candidate& cur, const std::vector<size_t>& order) {
    const std::vector<Residency> from = cur.residency;
    size_t lo = 0, hi = order.size() + 1;  // prefix lo stands; hi does not (or is past the end)
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      std::vector<Residency> v = from;
      for (size_t i = 0; i < mid; ++i)
        v[static_cast<size_t>(saved[order[i]].tensor)] = Residency::keep;
      Candidate c = evaluate(std::move(v), cur.lead, cur.lag);
      if (c.fits && c.sim.seconds <= cur.sim.seconds * 1.0000001 + 1e-12) {
        lo = mid;
        cur = std::move(c);
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  // PoocH's search: all swapped; then kept, latest made first, while the plan
  // fits; then recomputed where the recompute costs less than the stall its
  // copies cause, smallest ratio first; prefetch timing last.
  Candidate pooch_greedy() {
    Candidate cur = evaluate(all(Residency::swap), 1, 0);
    // Keep, latest made first, while the plan fits: the longest prefix of that order.
    if (cur.fits) (void)keep_longest_prefix(cur, latest_first());
    // Recompute: the swapped activations whose copies stall the compute
    // stream, smallest ratio of recompute time to stall first (PoocH flips
    // them one at a time, O(n^2) simulations). Here the k smallest are
    // flipped together, k = all of them, then halved until the plan is
    // faster; the stalls are then measured again. A candidate that did not
    // help alone is not tried again, and the phase plans at most
    // kMaxRecomputePlans candidates.
    std::vector<char> tried_flip(g.num_tensors(), 0);
    int plans = 0;
    for (bool again = true; again && plans < kMaxRecomputePlans;) {
      again = false;
      const std::vector<double> stall = stalls(cur);
      std::vector<std::pair<double, size_t>> ratio;
      for (size_t i = 0; i < saved.size(); ++i) {
        const auto t = static_cast<size_t>(saved[i].tensor);
        if (!saved[i].recomputable || cur.residency[t] != Residency::swap || tried_flip[t] ||
            stall[t] <= 0)
          continue;
        const double q = producer_seconds(saved[i]) / stall[t];
        if (q < 1) ratio.emplace_back(q, i);
      }
      std::sort(ratio.begin(), ratio.end());
      for (size_t k = ratio.size(); k > 0 && plans < kMaxRecomputePlans; k /= 2) {
        std::vector<Residency> v = cur.residency;
        for (size_t j = 0; j < k; ++j)
          v[static_cast<size_t>(saved[ratio[j].second].tensor)] = Residency::recompute;
        Candidate c = evaluate(std::move(v), cur.lead, cur.lag);
        ++plans;
        if (better(c, cur)) {
          cur = std::move(c);
          again = true;
          break;
        }
        if (k == 1) {
          tried_flip[static_cast<size_t>(saved[ratio[0].second].tensor)] = 1;
          again = true;  // the rest may still help
        }
      }
    }
    Candidate timed = best_timing(cur.residency);
    return better(timed, cur) ? timed : cur;
  }

  // Indices into `saved`, the latest made first.
  std::vector<size_t> latest_first() const {
    std::vector<size_t> order(saved.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return saved[a].producer > saved[b].producer; });
    return order;
  }

  // Swapped activations whose copy is mostly the link's latency (bytes /
  // bandwidth below it: a batch normalisation's mean and variance, a few
  // hundred bytes) hold each copy stream for a latency apiece, delaying the
  // large copies behind them, and save next to no memory. The stall
  // attributed to each is small, so the local search below would not try
  // them first: they are kept together, smallest first, as many as fit
  // (the longest prefix that fits and is no slower, by bisection).
  Candidate keep_latency_bound(Candidate cur) {
    const double bw = std::min(profile.link.h2d_bandwidth, profile.link.d2h_bandwidth);
    std::vector<size_t> small;
    for (size_t i = 0; i < saved.size(); ++i)
      if (!cur.residency.empty() &&
          cur.residency[static_cast<size_t>(saved[i].tensor)] == Residency::swap &&
          static_cast<double>(saved[i].bytes) / bw < profile.link.latency)
        small.push_back(i);
    std::stable_sort(small.begin(), small.end(),
                     [&](size_t a, size_t b) { return saved[a].bytes < saved[b].bytes; });
    // Keeping one removes two copies and adds no work, so a prefix that fits
    // and simulates no slower stands: a few seldom move the simulated step
    // (its stalls come from the large copies), many free the copy streams.
    const size_t lo = keep_longest_prefix(cur, small);
    if (lo == small.size()) return cur;
    // Where the arena is at the budget, not all of them fit. Room for all:
    // one kept activation recomputed instead, of the kMakeRoomTries that
    // cost the least recompute time per byte and hold at least the bytes
    // still swapped; the fastest plan that fits stands if it beats `cur`.
    size_t rest = 0;
    for (size_t j = lo; j < small.size(); ++j) rest += saved[small[j]].bytes;
    std::vector<std::pair<double, size_t>> room;
    for (size_t i = 0; i < saved.size(); ++i) {
      const SavedActivation& sa = saved[i];
      if (sa.gradient || !sa.recomputable || sa.bytes < rest ||
          cur.residency[static_cast<size_t>(sa.tensor)] != Residency::keep)
        continue;
      room.emplace_back(producer_seconds(sa) / static_cast<double>(sa.bytes), i);
    }
    std::sort(room.begin(), room.end());
    std::vector<Residency> all_kept = cur.residency;  // the prefix's, and the rest kept too
    for (size_t j : small) all_kept[static_cast<size_t>(saved[j].tensor)] = Residency::keep;
    Candidate best = std::move(cur);
    for (size_t k = 0; k < std::min(room.size(), kMakeRoomTries); ++k) {
      std::vector<Residency> v = all_kept;
      v[static_cast<size_t>(saved[room[k].second].tensor)] = Residency::recompute;
      Candidate c = evaluate(std::move(v), best.lead, best.lag);
      if (better(c, best)) best = std::move(c);
    }
    return best;
  }
  static constexpr size_t kMakeRoomTries = 8;

  // Local search: moves that may make the plan faster, the largest expected
  // gain first (keep a swapped or recomputed activation when the live bytes
  // allow it; recompute a swapped one whose copies stall for longer than its
  // producer runs; swap a recomputed one whose producer costs more than the
  // share of a copy a link as busy as this plan's would make the step wait).
  // A move stays when the plan fits and simulates faster; then the moves are
  // ranked again. At most kMaxMoves plans: planning time stays bounded on
  // large graphs (64: ResNet-50 at 64 pixels over bench/ooc's link gained
  // 1-2% of a step over 16 at a third of its activations, and 64 plans of a
  // 2 806-node chain take about 20 ms). Moves that only save memory (keep to
  // swap) never make a fitting plan faster, so they are not tried.
  static constexpr int kMaxMoves = 64;
  // The busier copy stream's share of the candidate's simulated step: how
  // much of a new copy's time the step would feel (0: an idle link hides it
  // beside the launches; 1: it queues behind the others).
  double link_busy(const Candidate& c) const {
    double busy[kNumStreams] = {0, 0, 0};
    for (const ScheduleStep& st : c.schedule.steps)
      if (st.kind == StepKind::copy_in || st.kind == StepKind::copy_out)
        busy[static_cast<int>(st.stream)] += copy_seconds(
            profile, st.kind,
            static_cast<double>(c.schedule.copies[static_cast<size_t>(st.index)].bytes));
    const double most = *std::max_element(std::begin(busy), std::end(busy));
    return std::min(1.0, most / std::max(c.sim.seconds, 1e-12));
  }
  static constexpr int kMaxRecomputePlans = 16;
  Candidate improve(Candidate cur) {
    std::vector<char> tried_move(3 * g.num_tensors(), 0);
    int moves = 0;
    bool moved = false;
    for (bool again = true; again && moves < kMaxMoves;) {
      again = false;
      const std::vector<double> stall = stalls(cur);
      const LiveBytes lb = live_bytes(cur);
      const double busy = link_busy(cur);
      struct Move {
        double gain;
        size_t i;
        Residency to;
      };
      std::vector<Move> list;
      for (size_t i = 0; i < saved.size(); ++i) {
        const SavedActivation& sa = saved[i];
        const auto t = static_cast<size_t>(sa.tensor);
        const Residency now = cur.residency.empty() ? Residency::keep : cur.residency[t];
        if (now == Residency::keep) continue;
        const double cost = now == Residency::recompute ? producer_seconds(sa) : stall[t];
        if (cost > 0 && may_keep(cur, lb, sa)) list.push_back({cost, i, Residency::keep});
        if (now == Residency::swap && sa.recomputable && stall[t] > producer_seconds(sa))
          list.push_back({stall[t] - producer_seconds(sa), i, Residency::recompute});
        // A copy costs the step only where the link is busy: on an idle
        // link it runs beside the launches, so a recompute's whole time may
        // be won (ResNet-50 at 64 pixels recomputed its first stage's
        // convolutions, each far cheaper than its copy, with nothing on the
        // link).
        const double copy_cost = busy * transfer_seconds(sa);
        if (now == Residency::recompute && producer_seconds(sa) > copy_cost)
          list.push_back({producer_seconds(sa) - copy_cost, i, Residency::swap});
      }
      std::stable_sort(list.begin(), list.end(),
                       [](const Move& a, const Move& b) { return a.gain > b.gain; });
      for (const Move& m : list) {
        const auto t = static_cast<size_t>(saved[m.i].tensor);
        const size_t key = 3 * t + static_cast<size_t>(m.to);
        if (tried_move[key]) continue;
        if (moves >= kMaxMoves) break;
        tried_move[key] = 1;
        ++moves;
        std::vector<Residency> v = cur.residency;
        v[t] = m.to;
        Candidate c = evaluate(std::move(v), cur.lead, cur.lag);
        if (better(c, cur)) {
          cur = std::move(c);
          std::fill(tried_move.begin(), tried_move.end(), 0);  // a new plan: every move anew
          again = moved = true;
          break;
        }
      }
    }
    if (!moved) return cur;  // its timing was already chosen for these decisions
    Candidate timed = best_timing(cur.residency);
    return better(timed, cur) ? timed : cur;
  }
};

}  // namespace

// A plan within this factor of the in-core step leaves `auto` little to win
// (the paging search's tie, kPagingTie, is the same 2%).
constexpr double kNearInCore = 1.02;

OocPlan plan_out_of_core(const Graph& g, const ProgramRequest& base, const Backend& backend,
                         const SessionLayout& layout, const PlanOptions& opt, Strategy strategy,
                         size_t budget, const Profile& profile, size_t host_budget) {
  Search s{g, base, backend, layout, opt, budget, profile, saved_activations(g, base), host_budget};
  s.price_recomputes();
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
      best = s.evaluate({}, 1, 1);  // every activation kept, when it fits, is the fastest
      from = Strategy::keep;
      const double in_core_seconds = best.sim.seconds;
      if (best.fits) {
        // ...but where weights are paged or nodes run on the host, when
        // their copies start still matters (pooch-greedy tunes it last too).
        Search::Candidate timed = s.best_timing(best.residency);
        if (Search::better(timed, best)) best = std::move(timed);
        break;
      }
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
      // The whole search (pooch-greedy, the latency-bound swaps, the local
      // search) again over a link of a thousandth of the bandwidth, its plan
      // judged at the real times: it then recomputes wherever that pays,
      // which the search at the real times may not reach. That one gets to
      // recomputes through the stalls of an all-swapped plan, a few at a
      // time, and where nearly every copy stalls (a long latency) its
      // budget of plans runs out with most still swapped: the bottleneck
      // ResNet of tests/unit/test_out_of_core.cpp over a 1 GB/s link at 1 ms
      // a copy, at 80% of its arena, planned 0.048 s a step with nothing
      // paged, and paged to reach 0.016 s, where 48 activations recomputed
      // and one swapped take 0.015 s (in core 0.0125 s). It takes two to
      // three times the planning time (bench/ooc --planning: 22 -> 64 ms on
      // a 2 806-node chain) of a step that does not fit in core, so it is skipped
      // where the plan found is within 2% of in core already (ResNet-50 at
      // 128 pixels in a third of its arena, 1.01x: 0.24 s of planning, 0.41
      // s with it).
      if (!(best.fits && best.sim.seconds <= in_core_seconds * kNearInCore)) {
        Profile slow = profile;
        slow.link.h2d_bandwidth /= 1000;
        slow.link.d2h_bandwidth /= 1000;
        Search remaking{g, base, backend, layout, opt, budget, slow, s.saved, host_budget};
        remaking.price_recomputes();
        Search::Candidate r = remaking.pooch_greedy();
        if (r.fits) r = remaking.improve(remaking.keep_latency_bound(std::move(r)));
        s.remake_unsaved = r.remake_unsaved;
        Search::Candidate c = s.evaluate(r.residency, r.lead, r.lag);
        s.tried += remaking.tried;
        if (Search::better(c, best)) {
          best = std::move(c);
          from = Strategy::pooch_greedy;
        }
        s.remake_unsaved = true;
      }
      // pooch-greedy again with recomputes that keep what they read from the
      // forward pass: remaking it frees memory but costs its producers, and
      // where the link is fast, swaps beside cheap recomputes can beat that
      // (ResNet-50 at 224 pixels, batch 128, planned for a GTX 1650: 1.04x
      // in core kept, 1.09x remade).
      if (s.any_unsaved) {
        s.remake_unsaved = false;
        Search::Candidate kept = s.pooch_greedy();
        if (Search::better(kept, best)) {
          best = std::move(kept);
          from = Strategy::pooch_greedy;
        }
      }
      s.remake_unsaved = best.remake_unsaved;
      if (best.fits) best = s.improve(s.keep_latency_bound(std::move(best)));
      break;
    }
  }
  if (!best.fits && s.smallest <= budget)
    throw Error(POOCH_ERR_OUT_OF_BUDGET,
                fmt::format("every train step strategy {} found that fits the device budget needs "
                            "a host pool of at least {} bytes ({:.2f} MiB), more than the host "
                            "memory cap of {} bytes; it needs a host budget of at least {} MiB",
                            strategy_name(strategy), s.smallest_host, to_mib(s.smallest_host),
                            host_budget, mib_ceil(s.smallest_host)));
  if (!best.fits)
    throw OutOfBudget(
        s.smallest,
        fmt::format("the smallest arena strategy {} reached for the train step is {} bytes "
                    "({:.2f} MiB), more than the budget of {} bytes ({:.2f} MiB); it needs "
                    "a budget of at least {} MiB, or a smaller step (a smaller batch size)",
                    strategy_name(strategy), s.smallest, to_mib(s.smallest), budget, to_mib(budget),
                    mib_ceil(s.smallest)));
  OocPlan p;
  // The winner again, with its buffers named for reports (the same plan: names
  // change nothing else).
  ProgramRequest rq = base;
  rq.residency = best.residency;
  rq.prefetch_lead = best.lead;
  rq.release_lag = best.lag;
  rq.remake_unsaved = best.remake_unsaved;
  s.cache.candidate = false;
  best.schedule = plan_schedule(g, rq, backend, layout, opt, &s.cache);
  p.schedule = std::move(best.schedule);
  p.sim = best.sim;
  p.strategy = from;
  p.plans_tried = s.tried;
  return p;
}

}  // namespace pooch
