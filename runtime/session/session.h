// A Session puts a Model on a backend. It appends the backward pass and the
// optimizer updates when it trains, compiles each program (train step,
// forward, evaluate) once into its own Schedule, takes one arena that fits the
// largest, and then runs programs over inputs set by name. One session per
// thread; cancel() is safe from any thread.
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "../backend/make_backend.h"
#include "../core/error.h"
#include "../core/optimizer.h"
#include "../exec/executor.h"
#include "../models/model.h"
#include "../plan/machine.h"
#include "../plan/ooc.h"
#include "../plan/planner.h"

namespace pooch {

enum class ProgramKind { train_step = 0, forward = 1, evaluate = 2 };
inline constexpr int kNumPrograms = 3;
const char* program_name(ProgramKind p);

struct SessionConfig {
  DeviceKind device = DeviceKind::automatic;
  size_t device_memory = 0;  // 0: no cap beyond the device
  int threads = 0;           // 0: all cores
  bool deterministic = true;
  // Activations in the blocked layout oneDNN's convolutions run in, where
  // the kernels around them take it (CPU; runtime/plan/layouts.h); false:
  // plain NCHW everywhere, the same results up to the rounding of batch
  // normalisation's sums.
  bool blocked_layouts = true;
  bool train = true;  // append the backward pass and optimizer updates to the model's losses
  OptimizerConfig optimizer;
  // When the in-core train step does not fit device_memory: how the planner
  // makes it fit (keep: refuse instead).
  Strategy strategy = Strategy::automatic;
  size_t host_memory = 0;  // cap on the host pool (staging and swap slots); 0: none
  // The CPU backend's emulated device link (0: memcpy speed), and the link the
  // planner assumes before anything is measured (0: a PCIe-like default).
  double link_bandwidth = 0;
  double link_latency = 0;
  // A card described instead of profiled (--machine): the planner's node
  // times and link come from it, and its usable memory is the budget unless
  // device_memory is set. The session then takes only the arena its plan
  // needs (not the whole budget: the card's memory need not exist here).
  std::optional<Machine> machine;
  // Plan every program and report, but take no memory and run nothing (what
  // `pooch-run plan` needs: a model planned for a card far larger than this
  // machine must not be allocated here). Every call that would touch memory
  // is Error(POOCH_ERR_UNSUPPORTED).
  bool plan_only = false;
  // How far the session may page persistent tensors to the host pool when
  // no plan of the activations fits: 0 never, 1 the optimizer state, 2 the
  // weights too, 3 and their updates run on the host (on a backend with
  // host kernels).
  int max_paging = 3;
  // Under `auto`, out of core: plan the paging again from the measured
  // steps, moving the weights and optimizer states where it changes
  // (Session::replan_paging). false: the paging chosen at creation stays
  // (bench/ooc --repaging measures the difference).
  bool replan_paging = true;
  // false: every weight and optimizer state starts as zeros instead of from
  // its initialiser, for a caller that writes them all before the first run
  // (the generator's decoder, whose weights come from a session or a file:
  // drawing GPT-2 124M's random weights first took 2.2 s).
  bool initialise = true;
};

// What the planner decided for the train step.
struct OutOfCoreReport {
  bool active = false;  // the in-core step did not fit: activations swapped or recomputed, or
                        // weights and optimizer state paged
  Strategy strategy = Strategy::keep;
  size_t in_core_arena = 0;  // what the train step needs in core
  size_t swapped_bytes = 0, recomputed_bytes = 0;
  // Weights and optimizer state whose home is the host pool, and the bytes a
  // train step copies for them (in before their uses, updated ones back).
  size_t paged_bytes = 0, paged_copy_bytes = 0;
  // Optimizer updates that run on the host, where their weight and state
  // live, and the bytes a step copies out for them (gradients, the norm).
  int host_updates = 0, host_launches = 0;  // the updates, and every launch on the host
  size_t host_update_copy_bytes = 0;
  double predicted_seconds = 0;  // the simulator's step time
  double predicted_in_core = 0;  // the same for the in-core step
  // What the session judged its paging by, as planned (before any measured
  // step): the step's slowdown against in core at the estimated profile, or,
  // where the profile is the backend's nominal estimate, the worse of that
  // and the slowdown with compute Backend::Roofline::faster_by times faster
  // (10 on the CPU, 1/0.6 on CUDA).
  double judged_slowdown = 0;
  // The paging was planned again from the measured profile and changed
  // (Session::replan_paging): the weights and optimizer states moved.
  bool repaged = false;
  double repage_seconds = 0;  // that planning's wall time, with the move
  int plans_tried = 0;
  double plan_seconds = 0;  // wall time of the out-of-core search (the last one)
  // Wall time of all the session's planning: every paging level and count
  // tried, each with its search (what a caller waits for before a step).
  double planning_seconds = 0;
};

// One program compiled for this session.
struct CompiledProgram {
  Schedule schedule;
  BoundSchedule bound;
  std::vector<TensorId> outputs;  // what it copies back
  ProgramRequest request;         // what it was planned from (planned again when paging changes)
};

class Session {
 public:
  Session(std::shared_ptr<const Model> model, const SessionConfig& cfg, BackendNote note = nullptr,
          void* note_user = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Model& model() const { return *model_; }
  // The model's graph with the backward pass and optimizer updates.
  const Graph& graph() const { return graph_; }

  // Sets an input by name (any case). With a batch dimension, `bytes` may
  // hold fewer rows than planned: the rest are filled with the input's pad
  // value. Error POOCH_ERR_INVALID_ARG naming the input otherwise.
  void set_input(std::string_view name, const void* data, size_t bytes);
  // The same, checking the caller's dtype and shape against the input's.
  void set_input(std::string_view name, DType dtype, const Shape& shape, const void* data);
  // The host buffer an input is copied from, for adapters that pack their
  // rows in place; `rows` is how many rows of it they filled (row masks
  // follow it).
  void* input_buffer(std::string_view name, int64_t rows);

  bool has_program(ProgramKind p) const { return programs_[static_cast<int>(p)] != nullptr; }
  // Runs a program. A train step advances the optimizer step counter. Out
  // of core (and not planning for a --machine card), the kMeasuredSteps
  // train steps after the first run as run_profiled_train_step does, so the
  // plan is made again from measured times: the estimate the session
  // started from can be off by orders of magnitude (20 GFLOP/s where an H200
  // ran GPT-2's step at 16 TFLOP/s), and a plan that trusts it swaps what it
  // should keep. The session's first train step runs cold and is not
  // measured: timed, ResNet-50's (bench/ooc, 64 pixels, a fifth of its
  // activations' memory) took 92-108 ms in launches against 76-86 ms for the
  // steps after it, and with it among three measured steps the plans
  // simulated 5-13% over their steps.
  void run(ProgramKind p);
  static constexpr size_t kMeasuredSteps = 3;
  // Runs one real train step, timing each launch and copy on its stream
  // (Executor::run_timed). The measured profile is each node's median over this and the
  // earlier profiled steps (the last kProfileRuns), so calling it several
  // times steadies it. A step out of core is then planned again from the
  // measured times (the arena and host pool it took stay).
  void run_profiled_train_step();
  static constexpr size_t kProfileRuns = 5;
  // Under `auto`, out of core: the paging search again (which weights and
  // optimizer states live in the host pool, whose updates run there), and
  // every program, from profile `p`, which becomes the session's (judged as
  // measured: without the backend's doubt). Where it pages differently and
  // fits the arena and host pool taken, every weight and optimizer state
  // whose place changes moves there (through the host: each crosses the
  // link once each way, as it lies, in a buffer of them all) and every
  // program, compiled ones too, is planned and bound again; the staged
  // inputs and outputs stay where they are. Returns
  // whether the paging changed; where it did not, nothing did. The last of
  // the kMeasuredSteps measured steps calls it with the measured profile:
  // paging chosen from the estimate alone bet on it.
  bool replan_paging(const Profile& p);
  bool profile_measured() const { return profile_measured_; }
  // A program over any tensors of the graph (tests, tools): compiled now; it
  // must fit the arena the session took. Outputs must be staged tensors.
  int compile(const std::vector<TensorId>& wanted, bool training, bool with_updates);
  void run_compiled(int id);
  const Schedule& schedule_of(int id) const {
    return custom_.at(static_cast<size_t>(id))->schedule;
  }

  // Copies an output of the last run that computed it.
  void get_output(std::string_view name, void* data, size_t bytes) const;
  const void* output_buffer(std::string_view name) const;
  const void* staged(TensorId t) const;
  void cancel() { cancel_.store(true); }

  // Whole tensors by name (weights, optimizer state), synchronously.
  std::vector<std::byte> read_tensor(std::string_view name) const;
  // The same into `plain` (the tensor's bytes long), for weight or
  // optimizer state t (no check of either).
  void read_tensor_to(TensorId t, void* plain) const;
  void write_tensor(std::string_view name, const void* data, size_t bytes);
  // A weight's bytes in place when the device's memory is host memory and
  // the weight lies there plain (not in a blocked layout), else null.
  const std::byte* host_view(TensorId t) const;

  uint64_t optimizer_step() const { return ctx_->step; }
  void set_optimizer_step(uint64_t s) { ctx_->step = s; }
  void set_lr_scale(double s) { ctx_->lr_scale = s; }
  double lr_scale() const { return ctx_->lr_scale; }
  const OptimizerConfig& optimizer() const { return cfg_.optimizer; }
  const char* backend_name() const { return backend_->name(); }
  Backend& backend() const { return *backend_; }
  size_t budget() const { return budget_; }
  // The host pool and arena the session took (or would take, plan_only).
  size_t host_pool_bytes() const { return host_taken_; }
  size_t arena_taken() const { return arena_taken_; }
  bool plan_only() const { return !exec_; }
  // The arena the session took and what it holds (the persistent region
  // plus the largest program's buffers), by role.
  const ArenaPlan& memory_plan() const { return memory_; }
  const Schedule* schedule(ProgramKind p) const;
  const OutOfCoreReport& out_of_core() const { return ooc_; }
  const Profile& profile() const { return profile_; }
  // The card the session plans for (SessionConfig::machine), or null.
  const Machine* machine() const { return cfg_.machine ? &*cfg_.machine : nullptr; }
  // The train step as the planner sees it (its nodes and split), for reports:
  // saved_activations(graph(), train_request()).
  const ProgramRequest& train_request() const { return train_request_; }
  // Where the persistent tensors live (device offsets, host homes of paged ones).
  const SessionLayout& layout() const { return layout_; }

 private:
  TensorId staged_tensor(std::string_view name, bool input) const;
  void fill_row_masks();
  // Row masks, step counter and training flag for a run of `s`.
  void prepare_run(const Schedule& s);
  void check_cancel();
  // The executor; Error(POOCH_ERR_UNSUPPORTED) for a plan_only session.
  Executor& exec() const;
  // The layout weight or optimizer state t lies in (SessionLayout::layouts).
  kern::Layout held_layout(TensorId t) const;
  // Writes persistent tensor t from its plain bytes, into its layout.
  void store(TensorId t, const void* plain);

  // Planning the programs (session_plan.cpp). What one planning judges by:
  struct PlanningRun {
    // The profile with compute Roofline::faster_by times faster than the
    // estimate (the backend's doubt about it), or none.
    std::optional<Profile> doubt;
    double in_core_doubt = 0;  // the last in-core train step planned, under `doubt`
    size_t host_cap = 0;       // the host pool the out-of-core search may use (0: any)
  };
  // Plans one standard program over layout_ into programs_, and for the
  // train step the out-of-core search where the in-core step does not fit.
  void plan_program(ProgramKind kind, const std::vector<TensorId>& wanted, bool training,
                    PlanningRun& run);
  // Every standard program over one layout of the persistent tensors:
  // `paged`, the weights and optimizer states whose home is the host pool;
  // `host_update`, the paged weights whose updates run there.
  void plan_programs(const std::vector<char>& paged, const std::vector<char>& host_update,
                     PlanningRun& run);
  // Chooses what to page (the levels and counts) and plans every program
  // with it, from profile_; fills ooc_.
  void plan_paging(PlanningRun& run);
  // The host pool the programs planned need (staging, homes, swap slots).
  size_t host_pool_needed() const;
  // `e` with the part of the budget the backend keeps counted in.
  OutOfBudget with_kept(const OutOfBudget& e) const;
  std::shared_ptr<const Model> model_;
  SessionConfig cfg_;
  Graph graph_;
  std::unique_ptr<Backend> backend_;
  SessionLayout layout_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<kern::KernelContext> ctx_;  // stable address: bound launches point at it
  std::unique_ptr<CompiledProgram> programs_[kNumPrograms];
  std::vector<std::unique_ptr<CompiledProgram>> custom_;
  ArenaPlan memory_;
  OutOfCoreReport ooc_;
  Profile profile_;
  bool profile_measured_ = false;
  bool trained_ = false;                // a train step ran (the first runs cold: not measured)
  std::vector<Profile> measured_runs_;  // the last kProfileRuns profiled steps
  LinkModel unmeasured_link_;           // the link model before any measurement
  ProgramRequest train_request_;  // kept for planning again from a measured profile and reports
  size_t budget_ = 0;
  size_t kept_by_backend_ = 0;  // of the device budget, by the backend (cuBLAS's workspace)
  // What the standard programs compute: the tensors staged in the host
  // pool, the losses, the other outputs, all outputs, what a train step
  // returns as the loss.
  std::vector<TensorId> staged_, losses_, results_, all_;
  TensorId train_loss_ = kNoTensor;
  bool trains_ = false;  // the session has a train step
  // The layout each weight and optimizer state lies in, for every program.
  std::vector<kern::Layout> held_;
  std::vector<char> paged_, host_update_;  // the masks the programs are planned with
  bool paging_replanned_ = false;          // replan_paging ran after the measured steps
  size_t arena_taken_ = 0, host_taken_ = 0;
  int64_t rows_ = -1;  // rows of the last batch input set (-1: none yet: every row counts)
  std::atomic<bool> cancel_{false};
};

}  // namespace pooch
