// How a session plans its programs: one layout of the persistent tensors
// (which weights and optimizer states live in the host pool, whose updates
// run there), every standard program over it, and the search over paging
// levels and counts that chooses that layout.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/op_registry.h"
#include "../plan/paging_search.h"
#include "session.h"

namespace pooch {

OutOfBudget Session::with_kept(const OutOfBudget& e) const {
  if (!kept_by_backend_) return e;
  const size_t needed = e.needed_bytes() + kept_by_backend_;
  return OutOfBudget(
      needed, fmt::format("{} (The {} backend keeps {:.2f} MiB of the device budget for itself, "
                          "so the budget must be at least {} MiB.)",
                          e.what(), backend_->name(), to_mib(kept_by_backend_), mib_ceil(needed)));
}

void Session::plan_program(ProgramKind kind, const std::vector<TensorId>& wanted, bool training,
                           PlanningRun& run) {
  const PlanOptions po{cfg_.deterministic, cfg_.blocked_layouts};
  auto p = std::make_unique<CompiledProgram>();
  p->outputs = wanted;
  ProgramRequest rq = program_request(graph_, wanted, training);
  p->schedule = plan_schedule(graph_, rq, *backend_, layout_, po);
  p->request = rq;
  if (kind == ProgramKind::train_step) {
    ooc_.in_core_arena = p->schedule.arena_bytes;
    ooc_.predicted_in_core = simulate(p->schedule, profile_).seconds;
    if (run.doubt) run.in_core_doubt = simulate(p->schedule, *run.doubt).seconds;
    ooc_.predicted_seconds = ooc_.predicted_in_core;
    // The forward part ends at the node that makes the loss, or just
    // before the backward op that makes it (that op is the backward's first).
    const TensorId loss = model_->losses[0];
    for (size_t i = 0; i < rq.nodes.size(); ++i)
      for (TensorId o : graph_.nodes()[static_cast<size_t>(rq.nodes[i])].outputs)
        if (o == train_loss_) rq.split = std::max(0, static_cast<int>(i) - (o == loss ? 0 : 1));
    train_request_ = rq;
    if (budget_ && p->schedule.arena_bytes > budget_ && cfg_.strategy != Strategy::keep) {
      const auto t0 = std::chrono::steady_clock::now();
      OocPlan op = plan_out_of_core(graph_, rq, *backend_, layout_, po, cfg_.strategy, budget_,
                                    profile_, run.host_cap);
      ooc_.plan_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      p->schedule = std::move(op.schedule);
      ooc_.active = true;
      ooc_.strategy = op.strategy;
      ooc_.swapped_bytes = p->schedule.swapped_bytes;
      ooc_.recomputed_bytes = p->schedule.recomputed_bytes;
      ooc_.predicted_seconds = op.sim.seconds;
      ooc_.plans_tried = op.plans_tried;
    }
  }
  programs_[static_cast<int>(kind)] = std::move(p);
}

void Session::plan_programs(const std::vector<char>& paged, const std::vector<char>& host_update,
                            PlanningRun& run) {
  const size_t align = backend_->caps().alignment;
  layout_ = plan_session_layout(graph_, staged_, align, paged);
  layout_.layouts = held_;
  layout_.host_update = host_update;
  if (train_loss_ != kNoTensor && train_loss_ != losses_[0])
    layout_.host_offset[static_cast<size_t>(train_loss_)] =
        layout_.host_offset[static_cast<size_t>(losses_[0])];
  paged_ = paged;
  host_update_ = host_update;
  ooc_ = OutOfCoreReport{};
  for (auto& p : programs_) p.reset();
  if (trains_) plan_program(ProgramKind::train_step, {train_loss_}, true, run);
  if (!results_.empty()) plan_program(ProgramKind::forward, results_, false, run);
  if (!losses_.empty()) plan_program(ProgramKind::evaluate, all_, false, run);

  // One arena for the largest program; the memory report shows that one.
  memory_ = layout_.persistent;
  memory_.offsets.clear();
  const CompiledProgram* largest = nullptr;
  ProgramKind largest_kind = ProgramKind::train_step;
  for (size_t i = 0; i < std::size(programs_); ++i)
    if (const auto& p = programs_[i];
        p && (!largest || p->schedule.arena_bytes > largest->schedule.arena_bytes)) {
      largest = p.get();
      largest_kind = static_cast<ProgramKind>(i);
    }
  memory_.peak = align_up(layout_.persistent.peak, align);
  if (largest) {
    memory_.peak = largest->schedule.arena_bytes;
    memory_.live_peak += largest->schedule.transient.live_peak;
    for (int r = 0; r < kNumRoles; ++r)
      memory_.bytes_by_role[r] += largest->schedule.transient.bytes_by_role[r];
  }
  // Named: only the train step is planned out of core, so a forward or
  // evaluate program that does not fit is a different problem.
  if (budget_)
    check_budget(memory_, budget_,
                 largest ? fmt::format("the {} program", program_name(largest_kind))
                         : std::string("the plan"));
}

size_t Session::host_pool_needed() const {
  size_t host_bytes = layout_.host.peak;
  for (const auto& p : programs_)
    if (p) host_bytes = std::max(host_bytes, p->schedule.host_bytes);
  return host_bytes;
}

void Session::plan_paging(PlanningRun& run) {
  // Weights and optimizer state stay on the device unless the step fits no
  // other way, or (under `auto`) fits faster so (below). Then the optimizer
  // state is paged (each is used once a step, by its update: one copy in and
  // one out, as ZeRO-Offload keeps it on the host), and if that is not
  // enough, the weights too; last (on a backend with host kernels), the
  // updates run on the host where the weights and state live, so an update
  // no longer needs its weight, gradient and state on the device at once.
  // When no level fits, the error names the smallest budget any level's
  // plans reached.
  std::vector<char> paged, host_update;
  const int top_level = backend_->host_kernels().empty() ? 2 : 3;
  size_t in_core_arena = 0;  // level 0's: the step with everything on the device
  double in_core_seconds = 0, in_core_doubt_0 = 0;  // level 0's in-core step
  // Once a level fits with all its tensors paged: the fewest of them, largest
  // first, that still fit (by bisection over how many; paging every
  // optimizer state where a third would do copies three times the bytes each
  // step). The fewest is not always the fastest (paging more leaves the
  // activations more room), so seven counts evenly between it and all are
  // planned too, and the simulator picks; ties go to fewer. (Three were too
  // coarse once gradients could be swapped: GPT-2 774M on an 8 GB card
  // predicted 1.59x with three, 1.38x with seven.) The plan kept is planned
  // last. The search: choose_paging_count (runtime/plan/paging_search.h).
  // At level 3 the same search runs over which weights' updates go to the
  // host (largest first), everything else staying paged.
  // The train step just planned, as a slowdown against level 0's in-core
  // step: at the estimate, or the worse of that and under `run.doubt`.
  auto slowdown_at_estimate = [&] {
    return ooc_.predicted_seconds / std::max(in_core_seconds, 1e-12);
  };
  auto slowdown = [&] {
    const double at_estimate = slowdown_at_estimate();
    const Schedule* ts = schedule(ProgramKind::train_step);
    if (!run.doubt || !ts) return at_estimate;
    return std::max(at_estimate,
                    simulate(*ts, *run.doubt).seconds / std::max(in_core_doubt_0, 1e-12));
  };
  // Largest first, ties in tensor order (deterministic plans).
  auto sort_largest_first = [&](std::vector<TensorId>& ts) {
    std::stable_sort(ts.begin(), ts.end(), [&](TensorId a, TensorId b) {
      return graph_.tensor(a).bytes() > graph_.tensor(b).bytes();
    });
  };
  // `below_short_by`: how many bytes the level below (every count of this
  // level's tensors left at home) was short of the budget; 0 when it fitted,
  // and then `to_beat` is its slowdown, which a count must beat to matter.
  // How many of `cand` (largest first) stay set in `mask`, the rest cleared:
  // choose_paging_count over plans of the step; `mask` ends as chosen.
  auto choose_count = [&](std::vector<char>& mask, bool is_host_update, std::vector<TensorId> cand,
                          size_t below_short_by, double to_beat) {
    sort_largest_first(cand);
    auto plan_first = [&](size_t k) {
      std::vector<char> m = mask;
      for (size_t i = k; i < cand.size(); ++i) m[static_cast<size_t>(cand[i])] = 0;
      if (is_host_update)
        plan_programs(paged, m, run);
      else
        plan_programs(m, host_update, run);
      return m;
    };
    PagingSearch search;
    for (TensorId t : cand) search.bytes.push_back(graph_.tensor(t).bytes());
    search.below_short_by = below_short_by;
    search.to_beat = to_beat;
    search.all_slowdown = slowdown();
    search.pages_bytes = !is_host_update;
    search.link_latency = profile_.link.latency;
    search.link_bandwidth = profile_.link.h2d_bandwidth;
    // Under `doubt` where there is one: slowdown() is at least that ratio.
    search.in_core_seconds = run.doubt ? in_core_doubt_0 : in_core_seconds;
    const PagingChoice choice =
        choose_paging_count(search, [&](size_t k, bool timed) -> std::optional<double> {
          try {
            plan_first(k);
          } catch (const Error& e) {
            if (e.code() != POOCH_ERR_OUT_OF_BUDGET) throw;
            return std::nullopt;
          }
          return timed ? slowdown() : 0.0;
        });
    mask = plan_first(choice.count);
  };
  auto page_fewer = [&](int level, size_t below_short_by, double to_beat) {
    const Role role = level == 1 ? Role::optimizer_state : Role::weight;
    std::vector<char>& mask = level == 3 ? host_update : paged;
    std::vector<TensorId> cand;
    for (size_t t = 0; t < mask.size(); ++t)
      if (mask[t] && graph_.tensor(static_cast<TensorId>(t)).role == role)
        cand.push_back(static_cast<TensorId>(t));
    choose_count(mask, level == 3, std::move(cand), below_short_by, to_beat);
  };
  // Level 3 chooses the updates that run on the host with everything else
  // paged, where each update moved to the host saves its state's copies, so
  // it moves many; but the rest may fit on the device beside the few that
  // must go: a model whose one huge input layer needs the host (its weight
  // and Adam state 48 GiB) kept its sixteen 4 096-wide layers paged on an
  // 8 GB card, 5.71 GiB copied a step. So the plan is tried once more from
  // the fewest updates on the host that fit (largest first), with the same
  // count search over the paged tensors no host-run op reads (a host update
  // mutates its weight and state at home, a sparse input layer on the host
  // reads its bias there), and kept where its step is not slower.
  auto page_fewer_beside_host_updates = [&] {
    const std::vector<char> paged_before = paged, host_before = host_update;
    const double before = slowdown();
    if (before <= kPagingTie) return;  // a tie with in core: nothing to win
    // Only weights whose host update moves something: an update, or a row
    // reader (a sparse input layer, an embedding); a frozen weight (LoRA's
    // base) has neither, and pinning what reads it would keep every layer
    // paged.
    std::vector<char> row_read(host_update.size(), 0);
    for (const Node& nd : graph_.nodes())
      if (const OpDef& d = op_registry().get(nd.op); d.row_weight >= 0)
        row_read[static_cast<size_t>(nd.inputs[static_cast<size_t>(d.row_weight)])] = 1;
    std::vector<TensorId> hosted;
    for (size_t t = 0; t < host_update.size(); ++t)
      if (host_update[t] && (graph_.tensor(static_cast<TensorId>(t)).trainable || row_read[t]))
        hosted.push_back(static_cast<TensorId>(t));
    if (hosted.empty()) return;
    sort_largest_first(hosted);
    auto host_first = [&](size_t k) {
      std::vector<char> m(host_update.size(), 0);
      for (size_t i = 0; i < k; ++i) m[static_cast<size_t>(hosted[i])] = 1;
      return m;
    };
    // None on the host is level 2, which did not fit (level 3 is never a
    // bet: the loop stops at the first level that fits past level 1); all
    // of them did.
    size_t lo = 0, hi = hosted.size();
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      try {
        plan_programs(paged, host_first(mid), run);
        hi = mid;
      } catch (const Error& e) {
        if (e.code() != POOCH_ERR_OUT_OF_BUDGET) throw;
        lo = mid;
      }
    }
    host_update = host_first(hi);
    std::vector<char> pinned(paged.size(), 0);
    for (const Node& nd : graph_.nodes()) {
      bool reads_host_weight = false;
      for (TensorId t : nd.inputs)
        reads_host_weight = reads_host_weight || host_update[static_cast<size_t>(t)];
      if (reads_host_weight)
        for (TensorId t : nd.inputs) pinned[static_cast<size_t>(t)] = 1;
    }
    std::vector<TensorId> cand;
    for (size_t t = 0; t < paged.size(); ++t)
      if (paged[t] && !pinned[t]) cand.push_back(static_cast<TensorId>(t));
    // First none of them paged; then the count search (with none as the
    // level below, fitted or short by what it needed), ties going to none.
    std::vector<char> none = paged;
    for (TensorId t : cand) none[static_cast<size_t>(t)] = 0;
    std::optional<double> none_slowdown;
    size_t none_short_by = 1;
    try {
      plan_programs(none, host_update, run);
      none_slowdown = slowdown();
    } catch (const Error& e) {
      if (e.code() != POOCH_ERR_OUT_OF_BUDGET) throw;
      if (const auto* ob = dynamic_cast<const OutOfBudget*>(&e); ob && ob->needed_bytes() > budget_)
        none_short_by = ob->needed_bytes() - budget_;
    }
    const bool any = !cand.empty();
    if (any) {
      plan_programs(paged, host_update, run);  // all of them paged: the search's last count
      choose_count(paged, false, std::move(cand), none_slowdown ? 0 : none_short_by,
                   none_slowdown.value_or(std::numeric_limits<double>::infinity()));
      if (none_slowdown && *none_slowdown <= slowdown() * kPagingTie) {
        paged = none;
        plan_programs(paged, host_update, run);  // the plan kept is planned last
      }
    }
    if ((!any && !none_slowdown) || slowdown() > before) {
      paged = paged_before;
      host_update = host_before;
      plan_programs(paged, host_update, run);
    }
  };
  // Paging more does not only rescue a step that fits no other way: a level
  // that fits can still be slower than the next one (its activations
  // swapped and recomputed where paged optimizer state would leave them
  // room). Without this, more device memory could plan a slower step: a
  // small ResNet-50 over a 1 GB/s link with 1 ms a copy predicted 0.064 s
  // at 4.9 MB (optimizer state paged) and 0.323 s at 5 MB (nothing paged,
  // 173 activations swapped). So under `auto`, while the fastest level
  // found predicts a step more than kTryPagingAbove times the in-core one,
  // the next level is planned too, and the fastest kept (ties go to paging
  // less). Below that slowdown the copies paging adds leave little to win,
  // and each level plans the step some 16 times more (ResNet-50 for a GTX
  // 1650 at 1.04x: 66 ms of planning, 430 ms with the paging levels too).
  // Only the first level is tried so: at creation the paging decisions are
  // made from the estimated profile and stand until the measured steps
  // (replan_paging), so each level that is not needed to fit is a bet on
  // that estimate (weights paged too, or updates on the host, which on the CPU
  // backend share the cores the step runs on, which the simulator's separate
  // host timeline does not see). The named strategies page only to fit.
  // A bet wins only where it is faster both ways the step is judged: under
  // `doubt` and at the estimate. Judged by the worse of the two alone, it
  // paged ResNet-50 (64 px, a third of its activations, a 452 MB/s link) at
  // 2.24x against 2.55x under doubt, though 1.051x against 1.008x at the
  // estimate; measured, the step was 1.35x in core, pooch-greedy's without
  // paging 1.20x (bench/ooc, 2026-12-05): compute ran 6 times the estimate,
  // between the two, where paging lost.
  constexpr double kTryPagingAbove = 1.10;
  struct Fitted {
    std::vector<char> paged, host_update;
    double slowdown;     // slowdown() of its train step
    double at_estimate;  // slowdown_at_estimate() of it
    int level;
  };
  std::optional<Fitted> fastest;
  std::optional<OutOfBudget> nearest;  // the level whose plans came nearest the budget
  int level = 0;
  const int last_level = std::min(top_level, cfg_.max_paging);
  // The masks of a level before page_fewer trims them: every optimizer
  // state from level 1, every weight from level 2, their updates on the host
  // at level 3.
  auto level_masks = [&](int l) {
    paged.assign(graph_.num_tensors(), 0);
    host_update.assign(graph_.num_tensors(), 0);
    for (size_t t = 0; t < paged.size(); ++t) {
      const Role r = graph_.tensor(static_cast<TensorId>(t)).role;
      paged[t] = r == Role::optimizer_state || (l >= 2 && r == Role::weight);
      host_update[t] = l == 3 && r == Role::weight;
    }
  };
  size_t below_short_by = 0;  // for page_fewer: the level below's shortfall, 0 if it fitted
  const auto planning_start = std::chrono::steady_clock::now();
  for (;; ++level) {
    try {
      plan_programs(paged, host_update, run);
      if (level == 0) {
        in_core_arena = ooc_.in_core_arena;
        in_core_seconds = ooc_.predicted_in_core;
        in_core_doubt_0 = run.in_core_doubt;
      }
      if (level > 0)
        page_fewer(level, below_short_by,
                   below_short_by == 0 && fastest ? fastest->slowdown
                                                  : std::numeric_limits<double>::infinity());
      if (level == 3) page_fewer_beside_host_updates();
      const double sd = slowdown(), est = slowdown_at_estimate();
      if (!fastest || (sd < fastest->slowdown && est <= fastest->at_estimate))
        fastest = Fitted{paged, host_update, sd, est, level};
      // No bet either where the step at the estimate is within the
      // paging-count tie of in core: a bet must not be slower there, so it
      // could win by a tie at most (ResNet-50 at 64 pixels, a third of its
      // activation memory, 1.008x: the bet's plans took 0.18 s for nothing).
      if (level >= std::min(last_level, 1) || !budget_ || !trains_ ||
          cfg_.strategy != Strategy::automatic || fastest->slowdown <= kTryPagingAbove ||
          fastest->at_estimate <= kPagingTie)
        break;
      below_short_by = 0;
    } catch (const Error& e) {
      if (level == 0) {
        in_core_arena = ooc_.in_core_arena;
        in_core_seconds = ooc_.predicted_in_core;
        in_core_doubt_0 = run.in_core_doubt;
      }
      // A level that fitted stands when paging more does not fit.
      if (fastest && e.code() == POOCH_ERR_OUT_OF_BUDGET) break;
      // Paging helps the device, never the host pool: a plan that fitted the
      // device but not the host cap stops here, with what it needs.
      const bool host_only =
          std::string_view(e.what()).find("host memory cap") != std::string_view::npos;
      const auto* short_by = dynamic_cast<const OutOfBudget*>(&e);
      if (e.code() != POOCH_ERR_OUT_OF_BUDGET || level >= last_level || !budget_ || !trains_ ||
          cfg_.strategy == Strategy::keep || host_only) {
        // A level that pages more does not always need less (updates on the
        // host keep more on the device when clipping makes every gradient
        // wait for the norm): the error names the smallest budget of all.
        if (short_by && nearest && nearest->needed_bytes() < short_by->needed_bytes())
          throw with_kept(*nearest);
        if (short_by) throw with_kept(*short_by);
        throw;
      }
      if (short_by && (!nearest || short_by->needed_bytes() < nearest->needed_bytes()))
        nearest = *short_by;
      below_short_by =
          short_by && short_by->needed_bytes() > budget_ ? short_by->needed_bytes() - budget_ : 1;
    }
    level_masks(level + 1);
  }
  // The plan kept is the one planned last.
  if (fastest->level != level || fastest->paged != paged || fastest->host_update != host_update) {
    paged = fastest->paged;
    host_update = fastest->host_update;
    plan_programs(paged, host_update, run);
  }
  ooc_.judged_slowdown = slowdown();
  if (fastest->level > 0) {
    ooc_.in_core_arena = in_core_arena;
    ooc_.predicted_in_core = in_core_seconds;
  }
  ooc_.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - planning_start).count();
  if (const Schedule* ts = schedule(ProgramKind::train_step); ts && ts->paged_bytes) {
    ooc_.active = true;
    ooc_.paged_bytes = ts->paged_bytes;
    ooc_.paged_copy_bytes = ts->paged_in_bytes + ts->paged_out_bytes;
    ooc_.host_updates = ts->host_updates;
    ooc_.host_launches = ts->host_launches;
    ooc_.host_update_copy_bytes = ts->host_update_copy_bytes;
  }
}

bool Session::replan_paging(const Profile& p) {
  profile_ = p;
  if (!exec_ || cfg_.machine || cfg_.strategy != Strategy::automatic || !ooc_.active || !trains_)
    return false;
  const auto t0 = std::chrono::steady_clock::now();
  // What runs now, to go back to.
  SessionLayout layout = layout_;
  ArenaPlan memory = memory_;
  OutOfCoreReport ooc = ooc_;
  ProgramRequest train_request = train_request_;
  std::vector<char> paged = paged_, host_update = host_update_;
  std::unique_ptr<CompiledProgram> programs[kNumPrograms];
  for (int i = 0; i < kNumPrograms; ++i) programs[i] = std::move(programs_[i]);
  auto restore = [&] {
    layout_ = std::move(layout);
    memory_ = std::move(memory);
    ooc_ = std::move(ooc);
    train_request_ = std::move(train_request);
    paged_ = std::move(paged);
    host_update_ = std::move(host_update);
    for (int i = 0; i < kNumPrograms; ++i) programs_[i] = std::move(programs[i]);
  };
  const PlanOptions po{cfg_.deterministic, cfg_.blocked_layouts};
  std::vector<Schedule> custom;  // the compiled programs over the new layout
  try {
    PlanningRun run;  // measured: no doubt
    run.host_cap = exec().host_bytes();
    plan_paging(run);
    if ((paged_ == paged && host_update_ == host_update) || memory_.peak > exec().arena_bytes() ||
        host_pool_needed() > exec().host_bytes()) {
      restore();
      return false;
    }
    // Worth a move only where the new step is faster, by more than a tie,
    // than the paging that runs: than the plan that runs or that paging
    // planned again at the same profile (where it fits the arena taken),
    // whichever is faster.
    const std::vector<char> new_paged = paged_, new_host_update = host_update_;
    const OutOfCoreReport new_report = ooc_;  // with level 0's in-core step, the paged bytes
    const double new_seconds = ooc_.predicted_seconds;
    double now_seconds =
        simulate(programs[static_cast<int>(ProgramKind::train_step)]->schedule, profile_).seconds;
    try {
      plan_programs(paged, host_update, run);
      now_seconds = std::min(now_seconds, ooc_.predicted_seconds);
    } catch (const Error& e) {
      if (e.code() != POOCH_ERR_OUT_OF_BUDGET) throw;
    }
    if (new_seconds * kPagingTie > now_seconds) {
      restore();
      return false;
    }
    plan_programs(new_paged, new_host_update, run);  // the same plans again
    ooc_ = new_report;
    for (const auto& c : custom_)
      custom.push_back(plan_schedule(graph_, c->request, *backend_, layout_, po));
  } catch (const Error& e) {
    // A plan that no longer fits the arena taken (at the smallest budget,
    // under other times) leaves the one that runs.
    restore();
    if (e.code() == POOCH_ERR_OUT_OF_BUDGET) return false;
    throw;
  }
  // Every weight and optimizer state that moves, as it lies (each keeps its
  // layout), from where the old layout has it; then into the new one. One
  // that stays where it was overlaps no new place (the new places do not
  // overlap each other), so it is not copied.
  auto place = [](const SessionLayout& l, size_t t) {
    return l.paged(static_cast<TensorId>(t)) ? std::pair{true, l.home_offset[t]}
                                             : std::pair{false, l.device_offset[t]};
  };
  std::vector<size_t> at(graph_.num_tensors(), kUnplaced);  // in `moving`, where it moves
  size_t moving_bytes = 0;
  for (size_t t = 0; t < at.size(); ++t) {
    const TensorDesc& d = graph_.tensor(static_cast<TensorId>(t));
    if ((d.role == Role::weight || d.role == Role::optimizer_state) &&
        place(layout, t) != place(layout_, t)) {
      at[t] = moving_bytes;
      moving_bytes += d.bytes();
    }
  }
  const std::unique_ptr<std::byte[]> moving(new std::byte[moving_bytes]);
  for (size_t t = 0; t < at.size(); ++t) {
    if (at[t] == kUnplaced) continue;
    const size_t bytes = graph_.tensor(static_cast<TensorId>(t)).bytes();
    if (const auto [home, off] = place(layout, t); home)
      std::memcpy(moving.get() + at[t], exec().host_pool() + off, bytes);
    else
      exec().read(off, moving.get() + at[t], bytes);
  }
  for (auto& c : programs_)
    if (c) c->bound = exec().bind(c->schedule, ctx_.get());
  for (size_t i = 0; i < custom_.size(); ++i) {
    custom_[i]->schedule = std::move(custom[i]);
    custom_[i]->bound = exec().bind(custom_[i]->schedule, ctx_.get());
  }
  for (size_t t = 0; t < at.size(); ++t) {
    if (at[t] == kUnplaced) continue;
    const size_t bytes = graph_.tensor(static_cast<TensorId>(t)).bytes();
    if (const auto [home, off] = place(layout_, t); home)
      std::memcpy(exec().host_pool() + off, moving.get() + at[t], bytes);
    else
      exec().write(off, moving.get() + at[t], bytes);
  }
  // The report: the new plan's, with what the session judged at creation.
  ooc_.judged_slowdown = ooc.judged_slowdown;
  ooc_.planning_seconds = ooc.planning_seconds;
  ooc_.repaged = true;
  ooc_.repage_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace pooch
