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
  if (cfg.train && !m.losses.empty()) {
    if (m.losses.size() > 1)
      throw Error(POOCH_ERR_UNSUPPORTED,
                  fmt::format("the model has {} losses; a session trains one", m.losses.size()));
    append_optimizer(graph_, build_backward(graph_, m.losses[0]), cfg.optimizer);
    train_loss_ = training_loss(graph_, m.losses[0]);
  }
  const int threads = resolve_threads(cfg.threads);
  backend_ =
      make_backend(cfg.device, {cfg.device_memory, threads, cfg.link_bandwidth, cfg.link_latency},
                   note, note_user);

  for (const IoTensor& t : m.inputs) staged_.push_back(t.id);
  for (const IoTensor& t : m.outputs) staged_.push_back(t.id);
  for (TensorId t : graph_.outputs()) staged_.push_back(t);

  ctx_ = std::make_unique<kern::KernelContext>();
  ctx_->seed = m.seed;
  ctx_->threads = threads;

  // The standard programs, each planned on its own over the persistent region.
  losses_ = m.losses;
  for (const IoTensor& t : m.outputs) {
    all_.push_back(t.id);
    if (std::find(losses_.begin(), losses_.end(), t.id) == losses_.end()) results_.push_back(t.id);
  }
  trains_ = cfg.train && !losses_.empty();
  budget_ = cfg.device_memory ? cfg.device_memory : backend_->memory_info().budget;
  // A backend may keep part of the budget for itself (the CUDA backend:
  // cuBLAS's workspace, allocated beside the arena): the arena is planned in
  // what it leaves, and a budget named in an error counts that part in.
  kept_by_backend_ = cfg.device_memory && !cfg.machine ? backend_->kept_from_budget() : 0;
  if (kept_by_backend_) budget_ = budget_ > kept_by_backend_ ? budget_ - kept_by_backend_ : 1;
  PlanningRun run;
  run.host_cap = cfg.host_memory;
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
  // The paging decisions are made from this profile and stand until the
  // measured steps (replan_paging, under `auto`; the named strategies keep
  // them), so where the profile is only the backend's nominal estimate they
  // are judged by the worse of two slowdowns against in core:
  // at the estimate, and with compute Roofline::faster_by times faster than
  // it (the CPU's 20 GFLOP/s placeholder is 8 times slow on the 2-core
  // development machine; a GPU's nominal roofline is 60% of its peak).
  // Judged at the estimate alone, where every copy looks hidden behind
  // compute, `auto` paged more than it needed on the MLP chain at half its
  // arena and swapped the activations that room would have held: 3.30x its
  // in-core step, against pooch-greedy's 2.57x (bench/ooc).
  if (!cfg.machine && faster_by > 1) {
    run.doubt = profile_;
    for (std::vector<double>* v :
         {&run.doubt->node_seconds, &run.doubt->replay_seconds, &run.doubt->host_node_seconds})
      for (double& t : *v) t /= faster_by;
  }
  // Weights and optimizer states outlive programs, so one layout each serves
  // them all: a blocked one where every program would choose it.
  {
    const PlanOptions po{cfg.deterministic, cfg.blocked_layouts};
    std::vector<ProgramRequest> rqs;
    if (trains_) rqs.push_back(program_request(graph_, {train_loss_}, true));
    if (!results_.empty()) rqs.push_back(program_request(graph_, results_, false));
    if (!losses_.empty()) rqs.push_back(program_request(graph_, all_, false));
    std::vector<const ProgramRequest*> each;
    std::vector<std::vector<kern::Layout>> chosen;
    for (const ProgramRequest& rq : rqs) {
      each.push_back(&rq);
      chosen.push_back(program_layouts(graph_, rq, *backend_, SessionLayout{}, po));
    }
    held_ = persistent_layouts(graph_, each, chosen);
  }
  plan_paging(run);
  const size_t align = backend_->caps().alignment;
  size_t host_bytes = host_pool_needed();
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

// The executor goes first: its destructor waits for whatever is still
// queued, and queued launches read ctx_ and the programs' bound arguments,
// which the members' own order would destroy before it.
Session::~Session() {
  exec_.reset();
}

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
      measured_runs_.size() < kMeasuredSteps && trained_) {
    run_profiled_train_step();
    return;
  }
  prepare_run(c->schedule);
  exec().run(c->bound);
  trained_ = trained_ || p == ProgramKind::train_step;
}

void Session::run_profiled_train_step() {
  check_cancel();
  auto& c = programs_[static_cast<int>(ProgramKind::train_step)];
  if (!c) run(ProgramKind::train_step);  // says why there is none
  prepare_run(c->schedule);
  const StepTimes t = exec().run_timed(c->bound);
  trained_ = true;
  // Every run falls back on the link model the session started from (where a
  // run copied too little to measure it), not on an earlier run's measurement,
  // so that runs stay independent.
  if (measured_runs_.empty()) unmeasured_link_ = profile_.link;
  if (measured_runs_.size() == kProfileRuns) measured_runs_.erase(measured_runs_.begin());
  measured_runs_.push_back(measured_profile(graph_, c->schedule, t, unmeasured_link_));
  profile_ = median_profile(measured_runs_);
  profile_measured_ = true;
  // Once, after the measured steps: the paging too, from measured times.
  if (ooc_.active && cfg_.replan_paging && measured_runs_.size() >= kMeasuredSteps &&
      !paging_replanned_) {
    paging_replanned_ = true;
    if (replan_paging(profile_)) return;
  }
  if (ooc_.active) {
    const auto t0 = std::chrono::steady_clock::now();
    // A search over other times may find no plan in the arena taken (at the
    // smallest budget, under load): the plan that runs fits, and stays. Under
    // `auto` so does one the new search does not beat at the same times: a
    // search from slightly different times can land on a slower plan
    // (mlp-chain50 at a third of its arena planned 229 ms in one bench run
    // and 315 ms in another, each simulated within 1% of what it measured).
    // A named strategy's plan is its own search's (the plan made at creation
    // can be another: where paging made room, every activation kept).
    std::optional<OocPlan> op;
    try {
      op = plan_out_of_core(graph_, train_request_, *backend_, layout_,
                            {cfg_.deterministic, cfg_.blocked_layouts}, cfg_.strategy,
                            exec().arena_bytes(), profile_, exec().host_bytes());
    } catch (const OutOfBudget&) {
    }
    ooc_.plan_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (op && op->schedule.host_bytes <= exec().host_bytes() &&
        (cfg_.strategy != Strategy::automatic ||
         op->sim.seconds < simulate(c->schedule, profile_).seconds)) {
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
  p->request.nodes = select_nodes(graph_, wanted, with_updates);
  p->request.outputs = outs;
  p->request.training = training;
  p->schedule = plan_schedule(graph_, p->request, *backend_, layout_,
                              {cfg_.deterministic, cfg_.blocked_layouts});
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
