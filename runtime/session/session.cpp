#include "session.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>

#include "../../kernels/common/layout.h"
#include "../../kernels/common/util.h"
#include "../core/autodiff.h"
#include "../core/error.h"
#include "../plan/layouts.h"
#include "../plan/paging_search.h"

namespace pooch {

const char* program_name(ProgramKind p) {
  switch (p) {
    case ProgramKind::train_step:
      return "train step";
    case ProgramKind::forward:
      return "forward";
    case ProgramKind::evaluate:
      return "evaluate";
  }
  return "?";
}

namespace {

bool persistent(Role r) {
  return r == Role::weight || r == Role::optimizer_state;
}

// Fills `n` elements of a buffer of `dt` with `v`.
void fill(void* dst, DType dt, size_t n, double v) {
  if (v == 0) {
    std::memset(dst, 0, n * dtype_size(dt));
    return;
  }
  for (size_t i = 0; i < n; ++i) switch (dt) {
      case DType::f32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::f64:
        static_cast<double*>(dst)[i] = v;
        break;
      case DType::i32:
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
        break;
      case DType::u16:
        static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(v);
        break;
      default:
        std::memset(static_cast<std::byte*>(dst) + i * dtype_size(dt), 0, dtype_size(dt));
    }
}

}  // namespace

Session::Session(std::shared_ptr<const Model> model, const SessionConfig& cfg, BackendNote note,
                 void* note_user)
    : model_(std::move(model)), cfg_(cfg), graph_(model_->graph) {
  const Model& m = *model_;
  // What a train step returns as the loss: a backward op's copy where one
  // computes it again (the forward op then does not run in the step),
  // staged into the loss's own host slot, so the caller reads it by the
  // loss's name after any program.
  TensorId train_loss = kNoTensor;
  if (cfg.train && !m.losses.empty()) {
    if (m.losses.size() > 1)
      throw Error(POOCH_ERR_UNSUPPORTED,
                  fmt::format("the model has {} losses; a session trains one", m.losses.size()));
    append_optimizer(graph_, build_backward(graph_, m.losses[0]), cfg.optimizer);
    train_loss = training_loss(graph_, m.losses[0]);
  }
  const int threads = resolve_threads(cfg.threads);
  backend_ =
      make_backend(cfg.device, {cfg.device_memory, threads, cfg.link_bandwidth, cfg.link_latency},
                   note, note_user);

  std::vector<TensorId> staged;
  for (const IoTensor& t : m.inputs) staged.push_back(t.id);
  for (const IoTensor& t : m.outputs) staged.push_back(t.id);
  for (TensorId t : graph_.outputs()) staged.push_back(t);

  ctx_ = std::make_unique<kern::KernelContext>();
  ctx_->seed = m.seed;
  ctx_->threads = threads;

  // The standard programs, each planned on its own over the persistent region.
  std::vector<TensorId> losses = m.losses, results, all;
  for (const IoTensor& t : m.outputs) {
    all.push_back(t.id);
    if (std::find(losses.begin(), losses.end(), t.id) == losses.end()) results.push_back(t.id);
  }
  const PlanOptions po{cfg.deterministic, cfg.blocked_layouts};
  budget_ = cfg.device_memory ? cfg.device_memory : backend_->memory_info().budget;
  // A backend may keep part of the budget for itself (the CUDA backend:
  // cuBLAS's workspace, allocated beside the arena): the arena is planned in
  // what it leaves, and a budget named in an error counts that part in.
  const size_t kept_by_backend =
      cfg.device_memory && !cfg.machine ? backend_->kept_from_budget() : 0;
  if (kept_by_backend) budget_ = budget_ > kept_by_backend ? budget_ - kept_by_backend : 1;
  auto with_kept = [&](const OutOfBudget& e) {
    if (!kept_by_backend) return e;
    const size_t needed = e.needed_bytes() + kept_by_backend;
    return OutOfBudget(
        needed, fmt::format("{} (The {} backend keeps {:.2f} MiB of the device budget for itself, "
                            "so the budget must be at least {} MiB.)",
                            e.what(), backend_->name(), to_mib(kept_by_backend), mib_ceil(needed)));
  };
  double faster_by = 1;  // the backend's doubt about its estimate (none for a card)
  if (cfg.machine) {
    // Planned for the described card: its roofline and link, its memory.
    if (!cfg.device_memory) budget_ = cfg.machine->usable_memory();
    profile_ = machine_profile(graph_, *cfg.machine);
  } else {
    LinkModel link;
    if (cfg.link_bandwidth > 0) link.h2d_bandwidth = link.d2h_bandwidth = cfg.link_bandwidth;
    if (cfg.link_latency > 0) link.latency = cfg.link_latency;
    link.compute_seconds_per_byte = backend_->copy_compute_seconds_per_byte();
    // Until a step is measured, node times are estimated from FLOPs and
    // bytes at the backend's nominal rates.
    const Backend::Roofline r = backend_->nominal_roofline();
    profile_ = estimate_profile(graph_, r.flops_per_second, r.bytes_per_second, link);
    faster_by = r.faster_by;
  }
  // The paging decisions below stay when a measured profile replans the
  // activations, so where the profile is only the backend's nominal estimate
  // they are judged by the worse of two slowdowns against in core: at the
  // estimate, and with compute Roofline::faster_by times faster than it (the
  // CPU's 20 GFLOP/s placeholder is 8 times slow on the 2-core development
  // machine; a GPU's nominal roofline is 60% of its peak). Judged at the
  // estimate alone, where every copy looks hidden behind compute, `auto`
  // paged more than it needed on the MLP chain at half its arena and swapped
  // the activations that room would have held: 3.30x its in-core step,
  // against pooch-greedy's 2.57x (bench/ooc).
  std::optional<Profile> doubt;
  if (!cfg.machine && faster_by > 1) {
    doubt = profile_;
    for (std::vector<double>* v :
         {&doubt->node_seconds, &doubt->replay_seconds, &doubt->host_node_seconds})
      for (double& t : *v) t /= faster_by;
  }
  double in_core_doubt = 0;  // the in-core train step's time under `doubt`
  const size_t align = backend_->caps().alignment;
  auto request = [&](const std::vector<TensorId>& wanted, bool training) {
    ProgramRequest rq;
    rq.nodes = select_nodes(graph_, wanted, training);
    rq.outputs = wanted;
    rq.training = training;
    return rq;
  };
  auto plan = [&](ProgramKind kind, const std::vector<TensorId>& wanted, bool training) {
    auto p = std::make_unique<CompiledProgram>();
    p->outputs = wanted;
    ProgramRequest rq = request(wanted, training);
    p->schedule = plan_schedule(graph_, rq, *backend_, layout_, po);
    if (kind == ProgramKind::train_step) {
      ooc_.in_core_arena = p->schedule.arena_bytes;
      ooc_.predicted_in_core = simulate(p->schedule, profile_).seconds;
      if (doubt) in_core_doubt = simulate(p->schedule, *doubt).seconds;
      ooc_.predicted_seconds = ooc_.predicted_in_core;
      // The forward part ends at the node that makes the loss, or just
      // before the backward op that makes it (that op is the backward's first).
      for (size_t i = 0; i < rq.nodes.size(); ++i)
        for (TensorId o : graph_.nodes()[static_cast<size_t>(rq.nodes[i])].outputs)
          if (o == train_loss)
            rq.split = std::max(0, static_cast<int>(i) - (o == m.losses[0] ? 0 : 1));
      train_request_ = rq;
      if (budget_ && p->schedule.arena_bytes > budget_ && cfg.strategy != Strategy::keep) {
        const auto t0 = std::chrono::steady_clock::now();
        OocPlan op = plan_out_of_core(graph_, rq, *backend_, layout_, po, cfg.strategy, budget_,
                                      profile_, cfg.host_memory);
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
  };
  const bool trains = cfg.train && !losses.empty();
  // Weights and optimizer states outlive programs, so one layout each serves
  // them all: a blocked one where every program would choose it.
  std::vector<kern::Layout> held;
  {
    std::vector<ProgramRequest> rqs;
    if (trains) rqs.push_back(request({train_loss}, true));
    if (!results.empty()) rqs.push_back(request(results, false));
    if (!losses.empty()) rqs.push_back(request(all, false));
    std::vector<const ProgramRequest*> each;
    std::vector<std::vector<kern::Layout>> chosen;
    for (const ProgramRequest& rq : rqs) {
      each.push_back(&rq);
      chosen.push_back(program_layouts(graph_, rq, *backend_, SessionLayout{}, po));
    }
    held = persistent_layouts(graph_, each, chosen);
  }
  // Every program over one layout of the persistent tensors; `paged`: the
  // weights and optimizer states whose home is the host pool; `host_update`:
  // the paged weights whose updates run there.
  auto plan_all = [&](const std::vector<char>& paged, const std::vector<char>& host_update) {
    layout_ = plan_session_layout(graph_, staged, align, paged);
    layout_.layouts = held;
    layout_.host_update = host_update;
    if (train_loss != kNoTensor && train_loss != losses[0])
      layout_.host_offset[static_cast<size_t>(train_loss)] =
          layout_.host_offset[static_cast<size_t>(losses[0])];
    ooc_ = OutOfCoreReport{};
    for (auto& p : programs_) p.reset();
    if (trains) plan(ProgramKind::train_step, {train_loss}, true);
    if (!results.empty()) plan(ProgramKind::forward, results, false);
    if (!losses.empty()) plan(ProgramKind::evaluate, all, false);

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
  };
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
  // step: at the estimate, or the worse of that and under `doubt`.
  auto slowdown_at_estimate = [&] {
    return ooc_.predicted_seconds / std::max(in_core_seconds, 1e-12);
  };
  auto slowdown = [&] {
    const double at_estimate = slowdown_at_estimate();
    const Schedule* ts = schedule(ProgramKind::train_step);
    if (!doubt || !ts) return at_estimate;
    return std::max(at_estimate, simulate(*ts, *doubt).seconds / std::max(in_core_doubt_0, 1e-12));
  };
  // `below_short_by`: how many bytes the level below (every count of this
  // level's tensors left at home) was short of the budget; 0 when it fitted,
  // and then `to_beat` is its slowdown, which a count must beat to matter.
  auto page_fewer = [&](int level, size_t below_short_by, double to_beat) {
    const Role role = level == 1 ? Role::optimizer_state : Role::weight;
    std::vector<char>& mask = level == 3 ? host_update : paged;
    std::vector<TensorId> cand;
    for (size_t t = 0; t < mask.size(); ++t)
      if (mask[t] && graph_.tensor(static_cast<TensorId>(t)).role == role)
        cand.push_back(static_cast<TensorId>(t));
    std::stable_sort(cand.begin(), cand.end(), [&](TensorId a, TensorId b) {
      return graph_.tensor(a).bytes() > graph_.tensor(b).bytes();
    });
    auto plan_first = [&](size_t k) {
      std::vector<char> m = mask;
      for (size_t i = k; i < cand.size(); ++i) m[static_cast<size_t>(cand[i])] = 0;
      if (level == 3)
        plan_all(paged, m);
      else
        plan_all(m, host_update);
      return m;
    };
    PagingSearch search;
    for (TensorId t : cand) search.bytes.push_back(graph_.tensor(t).bytes());
    search.below_short_by = below_short_by;
    search.to_beat = to_beat;
    search.all_slowdown = slowdown();
    search.pages_bytes = level < 3;
    search.link_latency = profile_.link.latency;
    search.link_bandwidth = profile_.link.h2d_bandwidth;
    // Under `doubt` where there is one: slowdown() is at least that ratio.
    search.in_core_seconds = doubt ? in_core_doubt_0 : in_core_seconds;
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
  // Only the first level is tried so: the paging decisions are made from
  // the estimated profile and stay when a measured one replans the
  // activations, so each level that is not needed to fit is a bet on that
  // estimate (weights paged too, or updates on the host, which on the CPU
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
  const int last_level = std::min(top_level, cfg.max_paging);
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
      plan_all(paged, host_update);
      if (level == 0) {
        in_core_arena = ooc_.in_core_arena;
        in_core_seconds = ooc_.predicted_in_core;
        in_core_doubt_0 = in_core_doubt;
      }
      if (level > 0)
        page_fewer(level, below_short_by,
                   below_short_by == 0 && fastest ? fastest->slowdown
                                                  : std::numeric_limits<double>::infinity());
      const double sd = slowdown(), est = slowdown_at_estimate();
      if (!fastest || (sd < fastest->slowdown && est <= fastest->at_estimate))
        fastest = Fitted{paged, host_update, sd, est, level};
      // No bet either where the step at the estimate is within the
      // paging-count tie of in core: a bet must not be slower there, so it
      // could win by a tie at most (ResNet-50 at 64 pixels, a third of its
      // activation memory, 1.008x: the bet's plans took 0.18 s for nothing).
      if (level >= std::min(last_level, 1) || !budget_ || !trains ||
          cfg.strategy != Strategy::automatic || fastest->slowdown <= kTryPagingAbove ||
          fastest->at_estimate <= kPagingTie)
        break;
      below_short_by = 0;
    } catch (const Error& e) {
      if (level == 0) {
        in_core_arena = ooc_.in_core_arena;
        in_core_seconds = ooc_.predicted_in_core;
        in_core_doubt_0 = in_core_doubt;
      }
      // A level that fitted stands when paging more does not fit.
      if (fastest && e.code() == POOCH_ERR_OUT_OF_BUDGET) break;
      // Paging helps the device, never the host pool: a plan that fitted the
      // device but not the host cap stops here, with what it needs.
      const bool host_only =
          std::string_view(e.what()).find("host memory cap") != std::string_view::npos;
      const auto* short_by = dynamic_cast<const OutOfBudget*>(&e);
      if (e.code() != POOCH_ERR_OUT_OF_BUDGET || level >= last_level || !budget_ || !trains ||
          cfg.strategy == Strategy::keep || host_only) {
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
    plan_all(paged, host_update);
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
  size_t host_bytes = layout_.host.peak;
  for (const auto& p : programs_)
    if (p) host_bytes = std::max(host_bytes, p->schedule.host_bytes);
  size_t arena_bytes = memory_.peak;
  if (ooc_.active && !cfg.machine) {
    // Out of core, the whole budget is the arena, and the host pool holds
    // every saved activation at once, so that a plan made again from measured
    // times always fits what was taken.
    arena_bytes = std::max(arena_bytes, budget_);
    size_t saved = 0;
    for (const SavedActivation& sa : saved_activations(graph_, train_request_))
      saved += align_up(sa.bytes, align);
    // And every host update's copies (the same set whatever the timing).
    if (const Schedule* ts = schedule(ProgramKind::train_step)) saved += ts->host_side_bytes;
    // Under a host cap, no more than the cap (a plan made again must then
    // fit what was taken, which it is planned to).
    size_t all_saved = align_up(layout_.host.peak, align) + saved;
    if (cfg.host_memory) all_saved = std::min(all_saved, cfg.host_memory);
    host_bytes = std::max(host_bytes, all_saved);
  }
  if (cfg.host_memory && host_bytes > cfg.host_memory)
    throw Error(POOCH_ERR_OUT_OF_BUDGET,
                fmt::format("the host pool needs {} bytes ({:.2f} MiB) for staging{}, more than "
                            "the host memory cap of {} bytes; it needs a host budget of at least "
                            "{} MiB",
                            host_bytes, to_mib(host_bytes),
                            ooc_.paged_bytes
                                ? ", paged weights and optimizer state, and swapped activations"
                            : ooc_.active ? " and swapped activations"
                                          : "",
                            cfg.host_memory, mib_ceil(host_bytes)));
  arena_taken_ = arena_bytes;
  host_taken_ = host_bytes;
  if (cfg.plan_only) return;  // nothing is taken, nothing initialised
  exec_ = std::make_unique<Executor>(*backend_, arena_bytes, host_bytes);
  for (auto& p : programs_)
    if (p) p->bound = exec_->bind(p->schedule, ctx_.get());

  // Every weight and optimizer state starts from its initialiser (zeros if
  // none, or if the caller writes them all: cfg.initialise).
  for (size_t t = 0; t < graph_.num_tensors(); ++t) {
    const TensorDesc& d = graph_.tensor(static_cast<TensorId>(t));
    if (!persistent(d.role)) continue;
    const auto it = cfg.initialise ? m.init.find(d.name) : m.init.end();
    if (it == m.init.end()) {
      store(static_cast<TensorId>(t), std::vector<std::byte>(d.bytes()).data());
      continue;
    }
    // Drawn in the plain order, so a weight's values do not depend on its layout.
    store(static_cast<TensorId>(t), initial_value(d, it->second, m.seed, threads).data());
  }
}

Session::~Session() = default;

Executor& Session::exec() const {
  if (!exec_)
    throw Error(POOCH_ERR_UNSUPPORTED,
                "this session only plans (created with plan_only): it took no memory and runs "
                "nothing; create one without plan_only to train or read tensors");
  return *exec_;
}

const Schedule* Session::schedule(ProgramKind p) const {
  const auto& c = programs_[static_cast<int>(p)];
  return c ? &c->schedule : nullptr;
}

void Session::check_cancel() {
  if (cancel_.exchange(false)) throw Error(POOCH_ERR_CANCELLED, "cancelled");
}

TensorId Session::staged_tensor(std::string_view name, bool input) const {
  const IoTensor* io = input ? model_->find_input(name) : model_->find_output(name);
  if (io) return io->id;
  if (const auto id = graph_.find(name);
      id && layout_.host_offset[static_cast<size_t>(*id)] != kUnplaced &&
      (graph_.tensor(*id).role == Role::input) == input)
    return *id;
  std::string known;
  for (const IoTensor& t : input ? model_->inputs : model_->outputs)
    known += (known.empty() ? "" : ", ") + t.name;
  throw Error(POOCH_ERR_INVALID_ARG, fmt::format("the model has no {} named '{}' (it has: {})",
                                                 input ? "input" : "output", name, known));
}

void* Session::input_buffer(std::string_view name, int64_t rows) {
  const TensorId t = staged_tensor(name, true);
  const IoTensor* io = model_->find_input(name);
  if (io && io->batch_dim >= 0) rows_ = rows;
  return exec().host_pool() + layout_.host_offset[static_cast<size_t>(t)];
}

void Session::set_input(std::string_view name, const void* data, size_t bytes) {
  const TensorId t = staged_tensor(name, true);
  const TensorDesc& d = graph_.tensor(t);
  const IoTensor* io = model_->find_input(name);
  auto* dst = exec().host_pool() + layout_.host_offset[static_cast<size_t>(t)];
  if (!io || io->batch_dim < 0 || d.shape.empty()) {
    if (bytes != d.bytes())
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("input '{}' is {} {} ({} bytes); got {} bytes", d.name,
                              dtype_name(d.dtype), shape_str(d.shape), d.bytes(), bytes));
    if (bytes) std::memcpy(dst, data, bytes);
    return;
  }
  // Rows of the batch dimension (dimension 0: the planner's layouts are row-major).
  const int64_t max_rows = d.shape[0];
  const size_t row_bytes = max_rows ? d.bytes() / static_cast<size_t>(max_rows) : 0;
  if (row_bytes == 0 || bytes % row_bytes != 0 || bytes > d.bytes())
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("input '{}' is {} {}: it takes up to {} rows of {} bytes; got {} bytes", d.name,
                    dtype_name(d.dtype), shape_str(d.shape), max_rows, row_bytes, bytes));
  const auto rows = static_cast<int64_t>(bytes / row_bytes);
  if (io->index_bound > 0 && d.dtype == DType::i32) {
    // Ids index the loss's classes: one out of range would be silently ignored.
    const auto* ids = static_cast<const int32_t*>(data);
    for (size_t i = 0; i < bytes / 4; ++i)
      if (ids[i] < -1 || ids[i] >= io->index_bound)
        throw Error(POOCH_ERR_BAD_INPUT,
                    fmt::format("input '{}', row {}: id {} is outside [-1, {})", d.name,
                                i / (row_bytes / 4), ids[i], io->index_bound));
  }
  if (bytes) std::memcpy(dst, data, bytes);
  fill(dst + bytes, d.dtype, (d.bytes() - bytes) / dtype_size(d.dtype), io->pad);
  rows_ = rows;
}

void Session::set_input(std::string_view name, DType dtype, const Shape& shape, const void* data) {
  const TensorId t = staged_tensor(name, true);
  const TensorDesc& d = graph_.tensor(t);
  const IoTensor* io = model_->find_input(name);
  bool ok = dtype == d.dtype && shape.size() == d.shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    const bool batch = io && io->batch_dim == static_cast<int>(i);
    ok = batch ? shape[i] >= 0 && shape[i] <= d.shape[i] : shape[i] == d.shape[i];
  }
  if (!ok)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("input '{}' is {} {}{}; got {} {}", d.name, dtype_name(d.dtype),
                            shape_str(d.shape),
                            io && io->batch_dim >= 0
                                ? fmt::format(" (dimension {} may be smaller)", io->batch_dim)
                                : "",
                            dtype_name(dtype), shape_str(shape)));
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  set_input(name, data, static_cast<size_t>(n) * dtype_size(dtype));
}

void Session::fill_row_masks() {
  for (const IoTensor& io : model_->inputs) {
    if (!io.row_mask) continue;
    const TensorDesc& d = graph_.tensor(io.id);
    auto* dst = exec().host_pool() + layout_.host_offset[static_cast<size_t>(io.id)];
    const auto n = static_cast<size_t>(d.numel());
    const size_t rows = rows_ < 0 ? n : std::min(n, static_cast<size_t>(rows_));
    fill(dst, d.dtype, rows, 1.0);
    fill(static_cast<std::byte*>(dst) + rows * dtype_size(d.dtype), d.dtype, n - rows, io.pad);
  }
}

void Session::prepare_run(const Schedule& s) {
  fill_row_masks();
  if (s.training) ++ctx_->step;  // Adam's t and dropout's counter key
  ctx_->training = s.training ? 1 : 0;
}

void Session::run(ProgramKind p) {
  check_cancel();
  const auto& c = programs_[static_cast<int>(p)];
  if (!c)
    throw Error(POOCH_ERR_UNSUPPORTED,
                fmt::format("this session has no {} program ({})", program_name(p),
                            p == ProgramKind::train_step
                                ? (model_->losses.empty() ? "the model has no loss"
                                                          : "it was created for inference")
                                : "the model has no outputs for it"));
  if (p == ProgramKind::train_step && ooc_.active && !cfg_.machine &&
      measured_runs_.size() < kMeasuredSteps) {
    run_profiled_train_step();
    return;
  }
  prepare_run(c->schedule);
  exec().run(c->bound);
}

void Session::run_profiled_train_step() {
  check_cancel();
  auto& c = programs_[static_cast<int>(ProgramKind::train_step)];
  if (!c) run(ProgramKind::train_step);  // says why there is none
  prepare_run(c->schedule);
  const StepTimes t = exec().run_timed(c->bound);
  // Every run falls back on the link model the session started from (where a
  // run copied too little to measure it), not on an earlier run's measurement,
  // so that runs stay independent.
  if (measured_runs_.empty()) unmeasured_link_ = profile_.link;
  if (measured_runs_.size() == kProfileRuns) measured_runs_.erase(measured_runs_.begin());
  measured_runs_.push_back(measured_profile(graph_, c->schedule, t, unmeasured_link_));
  profile_ = median_profile(measured_runs_);
  profile_measured_ = true;
  if (ooc_.active) {
    const auto t0 = std::chrono::steady_clock::now();
    // A search over other times may find no plan in the arena taken (at the
    // smallest budget, under load): the plan that runs fits, and stays.
    std::optional<OocPlan> op;
    try {
      op = plan_out_of_core(graph_, train_request_, *backend_, layout_,
                            {cfg_.deterministic, cfg_.blocked_layouts}, cfg_.strategy,
                            exec().arena_bytes(), profile_, exec().host_bytes());
    } catch (const OutOfBudget&) {
    }
    ooc_.plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (op && op->schedule.host_bytes <= exec().host_bytes()) {
      c->schedule = std::move(op->schedule);
      c->bound = exec().bind(c->schedule, ctx_.get());
      ooc_.strategy = op->strategy;
      ooc_.swapped_bytes = c->schedule.swapped_bytes;
      ooc_.recomputed_bytes = c->schedule.recomputed_bytes;
      ooc_.plans_tried = op->plans_tried;
    }
  }
  ooc_.predicted_seconds = simulate(c->schedule, profile_).seconds;
}

int Session::compile(const std::vector<TensorId>& wanted, bool training, bool with_updates) {
  auto p = std::make_unique<CompiledProgram>();
  std::vector<TensorId> outs;
  for (TensorId t : wanted)
    if (layout_.host_offset[static_cast<size_t>(t)] != kUnplaced) outs.push_back(t);
  p->outputs = outs;
  ProgramRequest rq;
  rq.nodes = select_nodes(graph_, wanted, with_updates);
  rq.outputs = outs;
  rq.training = training;
  p->schedule =
      plan_schedule(graph_, rq, *backend_, layout_, {cfg_.deterministic, cfg_.blocked_layouts});
  p->bound = exec().bind(p->schedule, ctx_.get());
  custom_.push_back(std::move(p));
  return static_cast<int>(custom_.size() - 1);
}

void Session::run_compiled(int id) {
  check_cancel();
  const CompiledProgram& c = *custom_.at(static_cast<size_t>(id));
  prepare_run(c.schedule);
  exec().run(c.bound);
}

const void* Session::staged(TensorId t) const {
  const size_t off = layout_.host_offset.at(static_cast<size_t>(t));
  if (off == kUnplaced)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("tensor '{}' is not an input or output", graph_.tensor(t).name));
  return exec().host_pool() + off;
}

const void* Session::output_buffer(std::string_view name) const {
  return staged(staged_tensor(name, false));
}

void Session::get_output(std::string_view name, void* data, size_t bytes) const {
  const TensorId t = staged_tensor(name, false);
  const TensorDesc& d = graph_.tensor(t);
  if (bytes != d.bytes())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("output '{}' is {} {} ({} bytes); the buffer holds {} bytes", d.name,
                            dtype_name(d.dtype), shape_str(d.shape), d.bytes(), bytes));
  if (bytes) std::memcpy(data, staged(t), bytes);
}

kern::Layout Session::held_layout(TensorId t) const {
  return layout_.layouts.empty() ? kern::Layout::plain : layout_.layouts[static_cast<size_t>(t)];
}

void Session::store(TensorId t, const void* plain) {
  const TensorDesc& d = graph_.tensor(t);
  std::vector<std::byte> blocked;
  if (const kern::Layout l = held_layout(t); l != kern::Layout::plain) {
    blocked.resize(d.bytes());
    kern::relayout(l, d.shape.data(), static_cast<const float*>(plain),
                   reinterpret_cast<float*>(blocked.data()), false);
    plain = blocked.data();
  }
  if (layout_.paged(t))
    std::memcpy(exec().host_pool() + layout_.home_offset[static_cast<size_t>(t)], plain, d.bytes());
  else
    exec().write(layout_.device_offset[static_cast<size_t>(t)], plain, d.bytes());
}

std::vector<std::byte> Session::read_tensor(std::string_view name) const {
  const auto id = graph_.find(name);
  if (!id || !persistent(graph_.tensor(*id).role))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("no weight or optimizer state named '{}'", name));
  std::vector<std::byte> out(graph_.tensor(*id).bytes());
  read_tensor_to(*id, out.data());
  return out;
}

void Session::read_tensor_to(TensorId t, void* plain) const {
  const TensorDesc& d = graph_.tensor(t);
  const auto i = static_cast<size_t>(t);
  // Its home is the host pool (current after every run), or the arena.
  const std::byte* at = layout_.paged(t) ? exec().host_pool() + layout_.home_offset[i]
                                         : exec().host_view(layout_.device_offset[i]);
  const kern::Layout l = held_layout(t);
  if (l == kern::Layout::plain) {
    if (at)
      std::memcpy(plain, at, d.bytes());
    else
      exec().read(layout_.device_offset[i], plain, d.bytes());
    return;
  }
  std::vector<std::byte> copy;  // off the host: the blocked bytes first
  if (!at) {
    copy.resize(d.bytes());
    exec().read(layout_.device_offset[i], copy.data(), copy.size());
    at = copy.data();
  }
  kern::relayout(l, d.shape.data(), reinterpret_cast<const float*>(at), static_cast<float*>(plain),
                 true);
}

void Session::write_tensor(std::string_view name, const void* data, size_t bytes) {
  const auto id = graph_.find(name);
  if (!id || !persistent(graph_.tensor(*id).role))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("no weight or optimizer state named '{}'", name));
  const TensorDesc& d = graph_.tensor(*id);
  if (bytes != d.bytes())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("tensor '{}' has {} bytes, got {}", name, d.bytes(), bytes));
  store(*id, data);
}

const std::byte* Session::host_view(TensorId t) const {
  if (held_layout(t) != kern::Layout::plain) return nullptr;  // its bytes are not the plain ones
  if (layout_.paged(t)) return exec().host_pool() + layout_.home_offset[static_cast<size_t>(t)];
  const size_t off = layout_.device_offset.at(static_cast<size_t>(t));
  return off == kUnplaced ? nullptr : exec().host_view(off);
}

}  // namespace pooch
