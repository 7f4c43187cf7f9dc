// The C API: argument checks, then a call into the C++ runtime with every
// exception turned into a pooch_status and a per-thread message. No logic of
// its own beyond that.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "../../formats/file_check.h"
#include "../../formats/synth.h"
#include "../../formats/xmc_data.h"
#include "../../formats/xmc_text.h"
#include "../backend/cpu/cpu_backend.h"
#include "../core/error.h"
#include "../core/op_registry.h"
#include "../models/build.h"
#include "../models/gpt_spec.h"
#include "../train/generate.h"
#include "../train/lm_data.h"
#include "../train/model_io.h"
#include "../train/trainer.h"
#include "../train/xmc_session.h"
#include "api_guard.h"
#include "pooch/pooch.h"

struct pooch_model {
  // A family with a spec (xmc, mlp) is rebuilt from it for each session, so
  // that its run shape and head can change; a model file of another family
  // runs as the file's graph describes it (`file->model`).
  bool has_spec = true;
  pooch::ModelSpec spec;
  std::string spec_json;  // what pooch_model_spec_json returns
  // Weights (and, for a checkpoint, state) a session starts from.
  std::shared_ptr<pooch::LoadedFile> file;
  bool head_replaced = false;   // the file's head and optimizer state no longer apply
  bool adapters_added = false;  // LoRA added: the file has no adapters, its state no longer applies
  // The model a session will run (built on first need, cleared on change).
  std::shared_ptr<const pooch::Model> built;
  const pooch::Model& model() {
    if (!built)
      built = has_spec ? std::shared_ptr<const pooch::Model>(pooch::build_model(spec))
                       : std::shared_ptr<const pooch::Model>(file->model);
    return *built;
  }
  void set_spec(const pooch::ModelSpec& s) {
    spec = s;
    spec_json = pooch::spec_to_json(s);
    built.reset();
    (void)model();  // a bad spec fails here, not at session creation
  }
};

struct pooch_session {
  // The XMC adapter for xmc models (it owns the session); the bare session
  // for every other family.
  std::unique_ptr<pooch::XmcSession> xmc;
  std::unique_ptr<pooch::Session> generic;
  pooch::Session& session() const { return xmc ? xmc->session() : *generic; }
  pooch::XmcSession& impl(const char* call) const {
    if (!xmc)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("{}: the model is of family '{}', not xmc; use "
                                     "pooch_session_set_input and pooch_session_run",
                                     call, generic->model().family));
    return *xmc;
  }
  pooch_progress_fn progress = nullptr;
  void* progress_user = nullptr;
  pooch::TrainerState state;  // where training stands (restored from a checkpoint)
  std::string resumed_from;   // the checkpoint it resumes ("": a fresh run)
  // Generation (gpt models): a decoder on the session's device, made on the
  // first pooch_generate, given the session's current weights at each call.
  pooch::SessionConfig config;
  std::unique_ptr<pooch::Generator> generator;
};

struct pooch_dataset {
  pooch::XmcDataset data;
};

namespace {

thread_local std::string g_last_error;
thread_local size_t g_last_error_budget = 0;  // OutOfBudget::needed_bytes of the last failure

struct LogSink {
  std::mutex mu;
  pooch_log_fn fn = nullptr;
  void* user = nullptr;
  int min_level = POOCH_LOG_INFO;  // as the caller gave it (pooch::api::raw_enum)
};
LogSink& log_sink() {
  static LogSink s;
  return s;
}

void log_line(pooch_log_level level, const char* msg) {
  LogSink& s = log_sink();
  std::lock_guard lock(s.mu);
  if (level < s.min_level) return;
  if (s.fn)
    s.fn(s.user, level, msg);
  else
    std::fprintf(stderr, "pooch: %s\n", msg);
}

// The formats layer's one-line notes (stale temporaries removed) go to the log.
[[maybe_unused]] const bool g_file_notes_logged = [] {
  pooch::file_check::set_note_sink([](const char* line) { log_line(POOCH_LOG_INFO, line); });
  return true;
}();

pooch_status fail(pooch_status st, std::string msg) {
  g_last_error = std::move(msg);
  g_last_error_budget = 0;
  return st;
}

// Runs f, mapping every exception to a status; nothing escapes the C boundary.
template <class F>
pooch_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    g_last_error_budget = 0;
    return POOCH_OK;
  } catch (const pooch::OutOfBudget& e) {
    fail(e.code(), e.what());
    g_last_error_budget = e.needed_bytes();
    return e.code();
  } catch (const pooch::Error& e) {
    return fail(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(
        POOCH_ERR_OUT_OF_MEMORY,
        fmt::format("out of host memory: an allocation was refused; {:.2f} MiB are "
                    "available to this process",
                    static_cast<double>(pooch::cpu::host_memory_available()) / (1024.0 * 1024.0)));
  } catch (const std::system_error& e) {
    // A thread that could not start (its stack could not be mapped) is memory too.
    if (e.code() == std::errc::resource_unavailable_try_again ||
        e.code() == std::errc::not_enough_memory)
      return fail(
          POOCH_ERR_OUT_OF_MEMORY,
          fmt::format(
              "out of host memory: {}; {:.2f} MiB are available to this process", e.what(),
              static_cast<double>(pooch::cpu::host_memory_available()) / (1024.0 * 1024.0)));
    return fail(POOCH_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (const std::exception& e) {
    return fail(POOCH_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(POOCH_ERR_INTERNAL, "internal error: unknown exception");
  }
}

#define POOCH_REQUIRE_ARG(cond, msg) \
  if (!(cond)) return fail(POOCH_ERR_INVALID_ARG, msg)

void require_spec(const pooch_model* m, const char* call) {
  if (!m->has_spec)
    throw pooch::Error(POOCH_ERR_INVALID_ARG,
                       fmt::format("{}: the model (family '{}') has no spec to rebuild it from",
                                   call, m->built ? m->built->family : std::string()));
}

pooch::BatchView to_view(const pooch_batch* b) {
  pooch::BatchView v;
  v.rows = b->rows;
  v.row_ptr = b->row_ptr;
  v.col = b->col;
  v.val = b->val;
  v.label_ptr = b->label_ptr;
  v.label = b->label;
  v.dense = b->dense;
  return v;
}

}  // namespace

extern "C" {

const char* pooch_status_str(pooch_status status) {
  switch (pooch::api::raw_enum(status)) {
    case POOCH_OK:
      return "ok";
    case POOCH_ERR_INVALID_ARG:
      return "invalid argument";
    case POOCH_ERR_BAD_INPUT:
      return "bad input data";
    case POOCH_ERR_OUT_OF_BUDGET:
      return "does not fit the device memory budget";
    case POOCH_ERR_NO_DEVICE:
      return "device not available";
    case POOCH_ERR_UNSUPPORTED:
      return "not supported";
    case POOCH_ERR_CANCELLED:
      return "cancelled";
    case POOCH_ERR_IO:
      return "i/o error";
    case POOCH_ERR_OUT_OF_MEMORY:
      return "out of host memory";
    case POOCH_ERR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

const char* pooch_last_error(void) {
  return g_last_error.c_str();
}

size_t pooch_last_error_budget(void) {
  return g_last_error_budget;
}

unsigned pooch_version(void) {
  return (POOCH_VERSION_MAJOR << 16) | (POOCH_VERSION_MINOR << 8) | POOCH_VERSION_PATCH;
}

const char* pooch_version_str(void) {
  return POOCH_VERSION_STRING;
}

void pooch_set_log(pooch_log_fn fn, void* user, pooch_log_level min_level) {
  LogSink& s = log_sink();
  std::lock_guard lock(s.mu);
  s.fn = fn;
  s.user = user;
  s.min_level = pooch::api::raw_enum(min_level);
}

void pooch_xmc_default_params(pooch_xmc_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  p->hidden = 256;
  p->fan_in = 32;
  p->batch_size = 64;
  p->loss = POOCH_LOSS_BCE;
  p->seed = 1;
  p->topk = 5;
}

pooch_status pooch_model_create_xmc(const pooch_xmc_params* p, pooch_model** out) {
  POOCH_REQUIRE_ARG(p && out, "pooch_model_create_xmc: params and out must not be NULL");
  *out = nullptr;
  const int loss_value = pooch::api::raw_enum(p->loss);
  POOCH_REQUIRE_ARG(loss_value >= POOCH_LOSS_BCE && loss_value <= POOCH_LOSS_SOFTMAX,
                    fmt::format("pooch_model_create_xmc: unknown loss {}", loss_value));
  return guarded([&] {
    const pooch::LossKind loss = loss_value == POOCH_LOSS_BCE ? pooch::LossKind::bce
                                 : loss_value == POOCH_LOSS_SQUARED_HINGE
                                     ? pooch::LossKind::squared_hinge
                                     : pooch::LossKind::softmax;
    pooch::ModelSpec s = pooch::spec_from_flags(pooch::InputKind::sparse, p->features, p->labels,
                                                p->hidden, 0, p->fan_in, loss, p->dropout);
    s.run.batch = p->batch_size;
    s.run.max_nnz = p->max_nnz;
    s.seed = p->seed;
    s.run.topk = p->topk;
    auto m = std::make_unique<pooch_model>();
    m->set_spec(s);
    *out = m.release();
  });
}

void pooch_model_free(pooch_model** model) {
  if (!model) return;
  delete *model;
  *model = nullptr;
}

void pooch_session_default_params(pooch_session_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  p->device = POOCH_DEVICE_AUTO;
  p->optimizer = POOCH_OPT_ADAM;
  p->learning_rate = 1e-3f;
  p->beta1 = 0.9f;
  p->beta2 = 0.999f;
  p->eps = 1e-8f;
  p->momentum = 0.9f;
  p->deterministic = 1;
  p->resume = 1;
  p->strategy = POOCH_STRATEGY_AUTO;
}

pooch_status pooch_session_create(pooch_model* model, const pooch_session_params* p,
                                  pooch_session** out) {
  POOCH_REQUIRE_ARG(model && p && out,
                    "pooch_session_create: model, params and out must not be NULL");
  *out = nullptr;
  POOCH_REQUIRE_ARG(p->learning_rate > 0, "pooch_session_create: learning_rate must be positive");
  POOCH_REQUIRE_ARG(p->threads >= 0, "pooch_session_create: threads must be >= 0");
  const int device = pooch::api::raw_enum(p->device);
  const int optimizer = pooch::api::raw_enum(p->optimizer);
  POOCH_REQUIRE_ARG(device >= POOCH_DEVICE_AUTO && device <= POOCH_DEVICE_CUDA,
                    fmt::format("pooch_session_create: unknown device {}", device));
  POOCH_REQUIRE_ARG(optimizer >= POOCH_OPT_ADAM && optimizer <= POOCH_OPT_SGD,
                    fmt::format("pooch_session_create: unknown optimizer {}", optimizer));
  return guarded([&] {
    pooch::SessionConfig c;
    c.device = device == POOCH_DEVICE_CPU    ? pooch::DeviceKind::cpu
               : device == POOCH_DEVICE_CUDA ? pooch::DeviceKind::cuda
                                             : pooch::DeviceKind::automatic;
    c.device_memory = p->device_memory;
    c.threads = p->threads;
    c.deterministic = p->deterministic != 0;
    if (p->strategy < POOCH_STRATEGY_KEEP || p->strategy > POOCH_STRATEGY_AUTO)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_session_create: unknown strategy {}", p->strategy));
    c.strategy = static_cast<pooch::Strategy>(p->strategy);
    c.host_memory = p->host_memory;
    c.link_bandwidth = p->link_bandwidth;
    c.link_latency = p->link_latency;
    if (p->machine_file) c.machine = pooch::read_machine(p->machine_file);
    c.plan_only = p->plan_only != 0;
    auto& o = c.optimizer;
    o.kind = optimizer == POOCH_OPT_SGD     ? pooch::OptimizerConfig::Kind::sgd
             : optimizer == POOCH_OPT_ADAMW ? pooch::OptimizerConfig::Kind::adamw
                                            : pooch::OptimizerConfig::Kind::adam;
    o.lr = p->learning_rate;
    o.beta1 = p->beta1;
    o.beta2 = p->beta2;
    o.eps = p->eps;
    o.weight_decay = p->weight_decay;
    o.momentum = p->momentum;
    o.clip_norm = p->clip_norm;  // append_optimizer refuses a negative or non-finite one
    const bool resume = model->file && model->file->checkpoint && !model->head_replaced &&
                        !model->adapters_added && p->resume;
    model->model();
    // GPT-2's convention (and nanoGPT's): biases and layernorm gains do not decay.
    if (model->built->family == "gpt") o.decay_vectors = false;
    if (resume) c.optimizer = model->file->optimizer;
    auto s = std::make_unique<pooch_session>();
    auto note = [](void*, const char* line) { log_line(POOCH_LOG_INFO, line); };
    if (model->built->family == "xmc")
      s->xmc = std::make_unique<pooch::XmcSession>(model->built, c, note, nullptr);
    else
      s->generic = std::make_unique<pooch::Session>(model->built, c, note, nullptr);
    if (model->file && !c.plan_only) {
      const pooch::PoochFile& f = model->file->file;
      pooch::restore_tensors(s->session(), f, resume,
                             model->head_replaced ? pooch::head_prefix(model->spec.family) : "",
                             model->adapters_added);
      if (resume) {
        try {
          s->session().set_optimizer_step(f.metadata().get_u64(pooch::meta_keys::kStep));
          s->state = pooch::get_state(f.metadata());
          s->resumed_from = f.path();
        } catch (const pooch::Error& e) {
          // The metadata does not know its file; the message must name it.
          throw pooch::Error(e.code(), fmt::format("{}: {}", f.path(), e.what()));
        }
      }
    }
    s->progress = p->progress;
    s->progress_user = p->progress_user;
    s->config = c;
    *out = s.release();
  });
}

void pooch_session_free(pooch_session** session) {
  if (!session) return;
  delete *session;
  *session = nullptr;
}

pooch_status pooch_session_step(pooch_session* s, const pooch_batch* batch, float* loss) {
  POOCH_REQUIRE_ARG(s && batch, "pooch_session_step: session and batch must not be NULL");
  return guarded([&] {
    const float l = s->impl("pooch_session_step").train_step(to_view(batch));
    if (loss) *loss = l;
    if (s->progress &&
        !s->progress(s->progress_user, static_cast<int64_t>(s->session().optimizer_step()), l))
      throw pooch::Error(POOCH_ERR_CANCELLED, "cancelled by the progress callback");
  });
}

pooch_status pooch_session_predict(pooch_session* s, const pooch_batch* batch, int k,
                                   int32_t* labels, float* scores) {
  POOCH_REQUIRE_ARG(s && batch, "pooch_session_predict: session and batch must not be NULL");
  POOCH_REQUIRE_ARG(labels || scores,
                    "pooch_session_predict: labels and scores are both NULL; pass at least one");
  return guarded(
      [&] { s->impl("pooch_session_predict").predict(to_view(batch), k, labels, scores); });
}

void pooch_session_cancel(pooch_session* s) {
  if (s) s->session().cancel();
}

pooch_status pooch_session_memory(const pooch_session* s, pooch_memory_report* out) {
  POOCH_REQUIRE_ARG(s && out, "pooch_session_memory: session and out must not be NULL");
  std::memset(out, 0, sizeof(*out));
  return guarded([&] {
    const pooch::ArenaPlan& plan = s->session().memory_plan();
    std::memset(out, 0, sizeof(*out));
    out->arena_bytes = plan.peak;
    for (int r = 0; r < pooch::kNumRoles; ++r) out->by_role[r] = plan.bytes_by_role[r];
    out->budget = s->session().budget();
    out->backend = s->session().backend_name();
    const pooch::OutOfCoreReport& r = s->session().out_of_core();
    out->in_core_bytes = r.in_core_arena;
    out->swapped_bytes = r.swapped_bytes;
    out->recomputed_bytes = r.recomputed_bytes;
    out->host_bytes = s->session().host_pool_bytes();
    out->predicted_step_seconds = r.predicted_seconds;
    out->predicted_in_core_seconds = r.predicted_in_core;
    out->out_of_core = r.active ? 1 : 0;
    out->strategy = static_cast<int>(r.strategy);
  });
}

}  // extern "C"

namespace {

char* json_copy(const nlohmann::ordered_json& doc) {
  const std::string text = doc.dump();
  char* buf = static_cast<char*>(std::malloc(text.size() + 1));
  if (!buf) throw std::bad_alloc();
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return buf;
}

const pooch::Schedule& train_schedule(const pooch::Session& s) {
  const pooch::Schedule* sc = s.schedule(pooch::ProgramKind::train_step);
  if (!sc)
    throw pooch::Error(POOCH_ERR_UNSUPPORTED,
                       "this session has no train step (the model has no loss, or it was "
                       "created for inference)");
  return *sc;
}

const char* stream_name(pooch::Stream st) {
  switch (st) {
    case pooch::Stream::compute:
      return "compute";
    case pooch::Stream::h2d:
      return "h2d";
    case pooch::Stream::d2h:
      return "d2h";
  }
  return "?";
}

const char* step_kind_name(pooch::StepKind k) {
  switch (k) {
    case pooch::StepKind::launch:
      return "launch";
    case pooch::StepKind::copy_in:
      return "copy_in";
    case pooch::StepKind::copy_out:
      return "copy_out";
    case pooch::StepKind::record:
      return "record";
    case pooch::StepKind::wait:
      return "wait";
  }
  return "?";
}

// Keys in the order the header documents them.
nlohmann::ordered_json plan_json(const pooch::Session& ss) {
  using json = nlohmann::ordered_json;
  const pooch::Schedule& sc = train_schedule(ss);
  const pooch::Graph& g = ss.graph();
  const pooch::OutOfCoreReport& r = ss.out_of_core();
  const pooch::Profile& prof = ss.profile();
  const pooch::Simulation sim = pooch::simulate(sc, prof);
  const std::vector<pooch::StepTiming> tl = pooch::simulate_timeline(sc, prof);
  const size_t persistent = sc.arena_bytes - sc.transient.peak;
  json doc{{"backend", ss.backend_name()},
           {"strategy", pooch::strategy_name(r.strategy)},
           {"out_of_core", r.active},
           {"profile", ss.profile_measured() ? "measured" : "estimated"},
           {"budget", ss.budget()},
           {"backend_kept", ss.backend().kept_from_budget()},
           {"in_core_arena", r.in_core_arena},
           {"arena", sc.arena_bytes},
           {"arena_taken", ss.arena_taken()},
           {"persistent_bytes", persistent},
           {"host_pool", ss.host_pool_bytes()},
           {"host_bytes", sc.host_bytes},
           {"predicted_seconds", sim.seconds},
           {"predicted_in_core_seconds", r.predicted_in_core},
           {"compute_seconds", sim.compute_seconds},
           {"host_launch_seconds", sim.host_seconds},
           {"swapped_bytes", sc.swapped_bytes},
           {"recomputed_bytes", sc.recomputed_bytes},
           {"paged_bytes", sc.paged_bytes},
           {"paged_copy_bytes", sc.paged_in_bytes + sc.paged_out_bytes},
           {"host_updates", sc.host_updates},
           {"host_launches", sc.host_launches},
           {"host_update_copy_bytes", sc.host_update_copy_bytes},
           {"plans_tried", r.plans_tried},
           {"plan_seconds", r.plan_seconds},
           {"planning_seconds", r.planning_seconds},
           {"repaged", r.repaged},
           {"repage_seconds", r.repage_seconds}};
  if (const pooch::Machine* m = ss.machine()) {
    doc["machine"] = {{"name", m->name},
                      {"file", m->file},
                      {"memory", m->memory},
                      {"usable_memory", m->usable_memory()},
                      {"flops", m->flops * m->compute_efficiency},
                      {"memory_bandwidth", m->memory_bandwidth * m->memory_efficiency},
                      {"h2d_bandwidth", m->h2d_bandwidth * m->link_efficiency},
                      {"d2h_bandwidth", m->d2h_bandwidth * m->link_efficiency},
                      {"link_latency", m->link_latency}};
    doc["profile"] = ss.profile_measured() ? "measured" : "machine";
  }
  json acts = json::array();
  for (const pooch::SavedActivation& sa : pooch::saved_activations(g, ss.train_request())) {
    const auto t = static_cast<size_t>(sa.tensor);
    const pooch::Residency d = t < sc.residency.size() ? sc.residency[t] : pooch::Residency::keep;
    acts.push_back({{"name", g.tensor(sa.tensor).name},
                    {"bytes", sa.bytes},
                    {"decision", pooch::residency_name(d)},
                    {"producer", sa.producer},
                    {"last_forward", sa.last_forward},
                    {"first_backward", sa.first_backward},
                    {"recomputable", sa.recomputable},
                    {"gradient", sa.gradient}});
  }
  doc["activations"] = std::move(acts);
  json paged = json::array();
  for (size_t t = 0; t < g.num_tensors(); ++t)
    if (ss.layout().paged(static_cast<pooch::TensorId>(t))) {
      const pooch::TensorDesc& d = g.tensor(static_cast<pooch::TensorId>(t));
      paged.push_back({{"name", d.name}, {"bytes", d.bytes()}, {"role", pooch::role_name(d.role)}});
    }
  doc["paged"] = std::move(paged);
  doc["step_fields"] = {"kind", "stream", "name", "bytes", "start", "end"};
  json steps = json::array();
  std::vector<double> slot_start(sc.launches.size(), 0), slot_end(sc.launches.size(), 0);
  std::vector<char> launched(g.nodes().size(), 0);
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    const pooch::ScheduleStep& st = sc.steps[i];
    const auto idx = static_cast<size_t>(st.index);
    std::string name;
    const char* kind = step_kind_name(st.kind);
    size_t bytes = 0;
    switch (st.kind) {
      case pooch::StepKind::launch: {
        const pooch::Launch& l = sc.launches[idx];
        const pooch::Node& nd = g.nodes()[static_cast<size_t>(l.node)];
        name = nd.op;
        if (launched[static_cast<size_t>(l.node)]) kind = "recompute";  // its second launch
        launched[static_cast<size_t>(l.node)] = 1;
        for (pooch::TensorId y : nd.outputs) bytes += g.tensor(y).bytes();
        slot_start[idx] = tl[i].start;
        slot_end[idx] = tl[i].end;
        break;
      }
      case pooch::StepKind::copy_in:
      case pooch::StepKind::copy_out:
        name = g.tensor(sc.copies[idx].tensor).name;
        bytes = sc.copies[idx].bytes;
        break;
      case pooch::StepKind::record:
      case pooch::StepKind::wait:
        name = "event " + std::to_string(st.index);
        break;
    }
    steps.push_back({kind, stream_name(st.stream), name, bytes, tl[i].start, tl[i].end});
  }
  doc["steps"] = std::move(steps);
  doc["occupancy_fields"] = {"start",   "end",        "input",    "activation",
                             "swapped", "recomputed", "gradient", "workspace",
                             "total",   "top",        "paged"};
  json occ = json::array();
  const std::vector<pooch::SlotOccupancy> o = pooch::transient_occupancy(g, sc);
  for (size_t i = 0; i < o.size(); ++i)
    occ.push_back({slot_start[i], slot_end[i], o[i].input, o[i].activation, o[i].swapped,
                   o[i].recomputed, o[i].gradient, o[i].workspace, o[i].total(), o[i].top,
                   o[i].paged});
  doc["occupancy"] = std::move(occ);
  return doc;
}

nlohmann::ordered_json profile_json(pooch::Session& ss) {
  using json = nlohmann::ordered_json;
  ss.run_profiled_train_step();
  const pooch::Schedule& sc = train_schedule(ss);
  const pooch::Graph& g = ss.graph();
  const pooch::Profile& prof = ss.profile();
  std::vector<char> seen(g.nodes().size(), 0);
  json ops = json::array();
  double total = 0;
  for (const pooch::Launch& l : sc.launches) {
    const auto n = static_cast<size_t>(l.node);
    if (seen[n]) continue;  // a recompute launch: measured once
    seen[n] = 1;
    const pooch::Node& nd = g.nodes()[n];
    const double flops = pooch::node_flops(g, nd);
    const double secs = prof.node_seconds[n];
    total += secs;
    ops.push_back({{"op", nd.op},
                   {"node", l.node},
                   {"seconds", secs},
                   {"flops", flops},
                   {"bytes", pooch::node_bytes(g, nd)},
                   {"gflops", secs > 0 ? flops / secs * 1e-9 : 0.0}});
  }
  return json{{"seconds", total}, {"step", ss.optimizer_step()}, {"ops", std::move(ops)}};
}

}  // namespace

extern "C" {

pooch_status pooch_session_plan_json(const pooch_session* s, char** json_out) {
  POOCH_REQUIRE_ARG(s && json_out,
                    "pooch_session_plan_json: session and json_out must not be NULL");
  *json_out = nullptr;
  return guarded([&] { *json_out = json_copy(plan_json(s->session())); });
}

pooch_status pooch_session_profile_json(pooch_session* s, char** json_out) {
  POOCH_REQUIRE_ARG(s && json_out,
                    "pooch_session_profile_json: session and json_out must not be NULL");
  *json_out = nullptr;
  return guarded([&] { *json_out = json_copy(profile_json(s->session())); });
}

pooch_status pooch_session_read_tensor(const pooch_session* s, const char* name, void* dst,
                                       size_t* bytes) {
  POOCH_REQUIRE_ARG(s && name && bytes,
                    "pooch_session_read_tensor: session, name and bytes must not be NULL");
  return guarded([&] {
    const auto id = s->session().graph().find(name);
    if (!id) throw pooch::Error(POOCH_ERR_INVALID_ARG, fmt::format("no tensor named '{}'", name));
    const size_t need = s->session().graph().tensor(*id).bytes();
    if (!dst) {
      *bytes = need;
      return;
    }
    if (*bytes != need)
      throw pooch::Error(
          POOCH_ERR_INVALID_ARG,
          fmt::format("tensor '{}' has {} bytes, the buffer {}", name, need, *bytes));
    const std::vector<std::byte> v = s->session().read_tensor(name);
    std::memcpy(dst, v.data(), need);
  });
}

pooch_status pooch_session_write_tensor(pooch_session* s, const char* name, const void* src,
                                        size_t bytes) {
  POOCH_REQUIRE_ARG(s && name && src,
                    "pooch_session_write_tensor: session, name and src must not be NULL");
  return guarded([&] { s->session().write_tensor(name, src, bytes); });
}

void pooch_planted_default_params(pooch_planted_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  const pooch::PlantedParams d;
  p->rows = d.rows;
  p->features = d.features;
  p->labels = d.labels;
  p->topic_features = d.topic_features;
  p->noise_features = d.noise_features;
  p->seed = d.seed;
}

pooch_status pooch_dataset_create_planted(const pooch_planted_params* p, pooch_dataset** out) {
  POOCH_REQUIRE_ARG(p && out, "pooch_dataset_create_planted: params and out must not be NULL");
  *out = nullptr;
  POOCH_REQUIRE_ARG(p->rows >= 0 && p->features > 0 && p->labels > 0 && p->topic_features >= 0 &&
                        p->noise_features >= 0 && p->features <= INT32_MAX &&
                        p->labels <= INT32_MAX,
                    "pooch_dataset_create_planted: rows >= 0, 0 < features, labels < 2^31, "
                    "feature counts >= 0");
  return guarded([&] {
    pooch::PlantedParams pp;
    pp.rows = p->rows;
    pp.features = p->features;
    pp.labels = p->labels;
    pp.topic_features = p->topic_features;
    pp.noise_features = p->noise_features;
    pp.seed = p->seed;
    *out = new pooch_dataset{pooch::make_planted(pp)};
  });
}

void pooch_dataset_free(pooch_dataset** ds) {
  if (!ds) return;
  delete *ds;
  *ds = nullptr;
}

pooch_status pooch_dataset_shape(const pooch_dataset* ds, int64_t* rows, int64_t* features,
                                 int64_t* labels) {
  POOCH_REQUIRE_ARG(ds, "pooch_dataset_shape: dataset must not be NULL");
  if (rows) *rows = ds->data.rows();
  if (features) *features = ds->data.features;
  if (labels) *labels = ds->data.labels;
  return POOCH_OK;
}

pooch_status pooch_dataset_batch(const pooch_dataset* ds, int64_t first, int64_t rows,
                                 pooch_batch* out) {
  POOCH_REQUIRE_ARG(ds && out, "pooch_dataset_batch: dataset and out must not be NULL");
  const int64_t n = ds->data.rows();
  POOCH_REQUIRE_ARG(first >= 0 && first <= n && rows >= 0,
                    fmt::format("pooch_dataset_batch: first row {} is outside [0, {}]", first, n));
  const auto& d = ds->data;
  out->rows = std::min(rows, n - first);
  out->row_ptr = d.row_ptr.data() + first;
  out->col = d.col.data();
  out->val = d.val.data();
  out->label_ptr = d.label_ptr.data() + first;
  out->label = d.label.data();
  out->dense = d.has_dense() ? d.dense.data() + first * d.dense_dim : nullptr;
  return POOCH_OK;
}

pooch_status pooch_model_create_from_spec(const char* json, const char* source, pooch_model** out) {
  POOCH_REQUIRE_ARG(json && out, "pooch_model_create_from_spec: json and out must not be NULL");
  *out = nullptr;
  return guarded([&] {
    auto m = std::make_unique<pooch_model>();
    m->set_spec(pooch::spec_from_json(json, source ? source : "model spec"));
    *out = m.release();
  });
}

pooch_status pooch_model_load(const char* path, pooch_model** out) {
  POOCH_REQUIRE_ARG(path && out, "pooch_model_load: path and out must not be NULL");
  *out = nullptr;
  return guarded([&] {
    auto file = std::make_shared<pooch::LoadedFile>(pooch::load_model_file(path));
    auto m = std::make_unique<pooch_model>();
    m->has_spec = file->has_spec;
    m->file = file;
    if (file->has_spec)
      m->set_spec(file->spec);
    else
      m->built = file->model;
    *out = m.release();
  });
}

pooch_status pooch_model_replace_head(pooch_model* m, int64_t labels) {
  POOCH_REQUIRE_ARG(m, "pooch_model_replace_head: model must not be NULL");
  POOCH_REQUIRE_ARG(
      labels > 0, fmt::format("pooch_model_replace_head: labels must be positive, got {}", labels));
  return guarded([&] {
    require_spec(m, "pooch_model_replace_head");
    pooch::ModelSpec s = m->spec;
    s.labels = labels;
    s.run.topk = std::max(s.run.topk, 5);
    m->set_spec(s);
    m->head_replaced = true;
  });
}

pooch_status pooch_model_set_run_shape(pooch_model* m, int64_t batch_size, int64_t max_nnz,
                                       int topk) {
  POOCH_REQUIRE_ARG(m, "pooch_model_set_run_shape: model must not be NULL");
  POOCH_REQUIRE_ARG(batch_size >= 0 && max_nnz >= 0 && topk >= 0,
                    "pooch_model_set_run_shape: values must not be negative");
  return guarded([&] {
    require_spec(m, "pooch_model_set_run_shape");
    pooch::ModelSpec s = m->spec;
    if (batch_size) {
      s.run.batch = batch_size;
      s.run.max_labels = 0;             // re-derived from the batch
      if (!max_nnz) s.run.max_nnz = 0;  // likewise
    }
    if (max_nnz) s.run.max_nnz = max_nnz;
    if (topk) s.run.topk = topk;
    m->set_spec(s);
  });
}

pooch_status pooch_model_set_max_labels(pooch_model* m, int64_t max_labels) {
  POOCH_REQUIRE_ARG(m, "pooch_model_set_max_labels: model must not be NULL");
  POOCH_REQUIRE_ARG(max_labels >= 0,
                    fmt::format("pooch_model_set_max_labels: max_labels must not be negative, "
                                "got {}",
                                max_labels));
  return guarded([&] {
    require_spec(m, "pooch_model_set_max_labels");
    pooch::ModelSpec s = m->spec;
    s.run.max_labels = max_labels;
    m->set_spec(s);
  });
}

pooch_status pooch_model_set_sequence_length(pooch_model* m, int64_t tokens) {
  POOCH_REQUIRE_ARG(m, "pooch_model_set_sequence_length: model must not be NULL");
  return guarded([&] {
    require_spec(m, "pooch_model_set_sequence_length");
    if (m->spec.family != pooch::Family::gpt)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_model_set_sequence_length: the model is of family "
                                     "'{}'; only gpt models have a sequence length",
                                     m->model().family));
    if (tokens < 0 || tokens > m->spec.gpt.n_ctx)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_model_set_sequence_length: {} tokens per row; the "
                                     "model's context length (n_ctx) is {}, so use 1 to {}",
                                     tokens, m->spec.gpt.n_ctx, m->spec.gpt.n_ctx));
    pooch::ModelSpec s = m->spec;
    s.run.seq = tokens;
    m->set_spec(s);
  });
}

pooch_status pooch_model_add_lora(pooch_model* m, int64_t rank, double alpha, const char* targets) {
  POOCH_REQUIRE_ARG(m, "pooch_model_add_lora: model must not be NULL");
  return guarded([&] {
    require_spec(m, "pooch_model_add_lora");
    if (m->spec.family != pooch::Family::gpt)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_model_add_lora: the model is of family '{}'; LoRA "
                                     "adapters are for gpt models",
                                     m->model().family));
    if (m->spec.gpt.lora.rank > 0)
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_model_add_lora: the model already has rank-{} "
                                     "adapters (merge them first: pooch_lora_merge)",
                                     m->spec.gpt.lora.rank));
    if (rank < 1)
      throw pooch::Error(
          POOCH_ERR_INVALID_ARG,
          fmt::format("pooch_model_add_lora: rank is {}; it must be at least 1", rank));
    pooch::ModelSpec s = m->spec;
    s.gpt.lora.rank = rank;
    s.gpt.lora.alpha = alpha;
    pooch::set_lora_targets(s.gpt.lora, targets ? targets : "attn");
    try {
      pooch::validate_spec(s);
    } catch (const pooch::Error& e) {
      throw pooch::Error(POOCH_ERR_INVALID_ARG, fmt::format("pooch_model_add_lora: {}", e.what()));
    }
    m->set_spec(s);
    m->adapters_added = true;
  });
}

const char* pooch_model_spec_json(const pooch_model* m) {
  return m ? m->spec_json.c_str() : "";
}

int pooch_model_is_checkpoint(const pooch_model* m) {
  return m && m->file && m->file->checkpoint ? 1 : 0;
}

void pooch_string_free(char** s) {
  if (!s) return;
  std::free(*s);
  *s = nullptr;
}

pooch_status pooch_file_describe(const char* path, char** json_out) {
  POOCH_REQUIRE_ARG(path && json_out, "pooch_file_describe: path and json_out must not be NULL");
  *json_out = nullptr;
  return guarded([&] {
    using nlohmann::json;
    const pooch::PoochFile f = pooch::read_pooch_file(path);
    json meta = json::object();
    for (const auto& item : f.metadata().items()) {
      const std::string& key = item.first;  // not a binding: clang's lambdas cannot capture one
      std::visit([&](const auto& x) { meta[key] = x; }, item.second);
    }
    json tensors = json::array();
    const pooch::Graph& g = f.graph();
    for (size_t t = 0; t < g.num_tensors(); ++t) {
      const pooch::TensorDesc& d = g.tensor(static_cast<pooch::TensorId>(t));
      json o{{"name", d.name},
             {"dtype", pooch::dtype_name(d.dtype)},
             {"shape", d.shape},
             {"role", pooch::role_name(d.role)},
             {"bytes", d.bytes()}};
      if (d.trainable) o["trainable"] = true;
      if (const pooch::TensorEntry* e = f.find(static_cast<pooch::TensorId>(t))) {
        o["offset"] = e->offset;
        o["xxh3"] = fmt::format("{:016x}", e->xxh3);
      }
      tensors.push_back(o);
    }
    json nodes = json::array();
    for (const pooch::Node& n : g.nodes()) {
      json attrs = json::object();
      for (const auto& [k, v] : n.attrs.items()) attrs[k] = v;
      json in = json::array(), outs = json::array();
      for (pooch::TensorId i : n.inputs) in.push_back(g.tensor(i).name);
      for (pooch::TensorId o : n.outputs) outs.push_back(g.tensor(o).name);
      nodes.push_back({{"op", n.op}, {"attrs", attrs}, {"inputs", in}, {"outputs", outs}});
    }
    const json doc{{"path", f.path()},
                   {"format_version", f.version()},
                   {"file_bytes", f.layout().file_size},
                   {"metadata", meta},
                   {"tensors", tensors},
                   {"nodes", nodes}};
    const std::string text = doc.dump(2);
    char* buf = static_cast<char*>(std::malloc(text.size() + 1));
    if (!buf) throw std::bad_alloc();
    std::memcpy(buf, text.c_str(), text.size() + 1);
    *json_out = buf;
  });
}

pooch_status pooch_session_save(const pooch_session* s, const char* path) {
  POOCH_REQUIRE_ARG(s && path, "pooch_session_save: session and path must not be NULL");
  return guarded([&] { pooch::save_session(s->session(), path, false); });
}

pooch_status pooch_dataset_load(const char* path, pooch_dataset** out) {
  POOCH_REQUIRE_ARG(path && out, "pooch_dataset_load: path and out must not be NULL");
  *out = nullptr;
  return guarded([&] { *out = new pooch_dataset{pooch::load_xmc(path)}; });
}

pooch_status pooch_dataset_load_split(const char* features_path, const char* labels_path,
                                      pooch_dataset** out) {
  POOCH_REQUIRE_ARG(features_path && labels_path && out,
                    "pooch_dataset_load_split: paths and out must not be NULL");
  *out = nullptr;
  return guarded(
      [&] { *out = new pooch_dataset{pooch::load_xmc_split(features_path, labels_path)}; });
}

pooch_status pooch_dataset_save(const pooch_dataset* ds, const char* path) {
  POOCH_REQUIRE_ARG(ds && path, "pooch_dataset_save: dataset and path must not be NULL");
  return guarded([&] { pooch::write_xmc_bow(path, ds->data); });
}

pooch_status pooch_dataset_split(const pooch_dataset* ds, int64_t held_out, uint64_t seed,
                                 pooch_dataset** rest, pooch_dataset** held) {
  POOCH_REQUIRE_ARG(ds && rest && held,
                    "pooch_dataset_split: dataset, rest and held must not be NULL");
  *rest = *held = nullptr;
  POOCH_REQUIRE_ARG(held_out >= 0 && held_out <= ds->data.rows(),
                    "pooch_dataset_split: held_out must be in [0, the data set's rows]");
  return guarded([&] {
    auto a = std::make_unique<pooch_dataset>();
    auto b = std::make_unique<pooch_dataset>();
    pooch::split_rows(ds->data, held_out, seed, a->data, b->data);
    *rest = a.release();
    *held = b.release();
  });
}

int64_t pooch_dataset_max_batch_nnz(const pooch_dataset* ds, int64_t batch_size) {
  return ds ? pooch::most_in_rows(ds->data.row_ptr, batch_size) : 0;
}

int64_t pooch_dataset_max_batch_labels(const pooch_dataset* ds, int64_t batch_size) {
  return ds ? pooch::most_in_rows(ds->data.label_ptr, batch_size) : 0;
}

int pooch_dataset_is_dense(const pooch_dataset* ds) {
  return ds && ds->data.has_dense() ? 1 : 0;
}

pooch_status pooch_dataset_create_synth(const char* preset, double scale, uint64_t seed,
                                        pooch_dataset** train, pooch_dataset** test) {
  POOCH_REQUIRE_ARG(preset && train && test,
                    "pooch_dataset_create_synth: preset, train and test must not be NULL");
  *train = *test = nullptr;
  return guarded([&] {
    pooch::SynthOptions o;
    o.seed = seed;
    pooch::SynthData d = pooch::make_synth(preset, scale, o);
    auto tr = std::make_unique<pooch_dataset>(pooch_dataset{std::move(d.train)});
    auto te = std::make_unique<pooch_dataset>(pooch_dataset{std::move(d.test)});
    *train = tr.release();
    *test = te.release();
  });
}

void pooch_propensity_defaults(const char* name, float* a, float* b) {
  const auto [pa, pb] = pooch::default_propensity_ab(name ? name : "");
  if (a) *a = static_cast<float>(pa);
  if (b) *b = static_cast<float>(pb);
}

void pooch_train_default_params(pooch_train_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  const pooch::TrainConfig d;
  p->epochs = d.epochs;
  p->warmup_steps = d.warmup_steps;
  p->rewire_fraction = static_cast<float>(d.rewire_fraction);
  p->plateau_factor = static_cast<float>(d.plateau_factor);
  p->plateau_patience = d.plateau_patience;
  p->early_stop_patience = d.early_stop_patience;
  p->shuffle = 1;
  p->data_seed = d.data_seed;
  p->psp_a = static_cast<float>(d.psp_a);
  p->psp_b = static_cast<float>(d.psp_b);
  p->max_steps = d.max_steps;
  p->lr_schedule = d.cosine ? POOCH_LR_COSINE : POOCH_LR_PLATEAU;
  p->min_lr_ratio = static_cast<float>(d.min_lr_ratio);
}

void pooch_lm_default_params(pooch_lm_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  const pooch::LmTrainConfig d;
  p->val_fraction = d.val_fraction;
  p->eval_every = d.eval_every;
}

}  // extern "C"

namespace {

void to_c(const pooch::XmcMetricsResult& r, pooch_metrics* out);

// The trainer's configuration from the C parameters (pooch_train and
// pooch_train_tokens), with the data's fingerprint checked against a
// resumed checkpoint's.
pooch::TrainConfig train_config(const pooch_session* s, const pooch_train_params* p,
                                const std::string& fingerprint, const char* call) {
  pooch::TrainConfig c;
  c.epochs = p->epochs;
  c.warmup_steps = p->warmup_steps;
  if (p->rewire_every < 0 || !(p->rewire_fraction >= 0 && p->rewire_fraction <= 1))
    throw pooch::Error(POOCH_ERR_INVALID_ARG,
                       fmt::format("{}: rewire_every must be >= 0 and rewire_fraction "
                                   "in [0, 1]; got {} and {}",
                                   call, p->rewire_every, p->rewire_fraction));
  if (p->max_steps < 0 ||
      (p->lr_schedule != POOCH_LR_PLATEAU && p->lr_schedule != POOCH_LR_COSINE) ||
      !(p->min_lr_ratio >= 0 && p->min_lr_ratio <= 1))
    throw pooch::Error(POOCH_ERR_INVALID_ARG,
                       fmt::format("{}: max_steps must be >= 0, lr_schedule a pooch_lr_schedule "
                                   "and min_lr_ratio in [0, 1]; got {}, {} and {}",
                                   call, p->max_steps, p->lr_schedule, p->min_lr_ratio));
  c.rewire_every = p->rewire_every;
  c.rewire_fraction = p->rewire_fraction;
  c.plateau_factor = p->plateau_factor;
  c.plateau_patience = p->plateau_patience;
  c.early_stop_patience = p->early_stop_patience;
  c.shuffle = p->shuffle != 0;
  c.data_seed = p->data_seed;
  c.psp_a = p->psp_a;
  c.psp_b = p->psp_b;
  c.max_steps = p->max_steps;
  c.cosine = p->lr_schedule == POOCH_LR_COSINE;
  c.min_lr_ratio = p->min_lr_ratio;
  if (p->checkpoint_path) c.checkpoint_path = p->checkpoint_path;
  c.data_fingerprint = fingerprint;
  if (!s->resumed_from.empty() && !s->state.data_fingerprint.empty() &&
      s->state.data_fingerprint != c.data_fingerprint && !p->allow_other_data)
    throw pooch::Error(
        POOCH_ERR_BAD_INPUT,
        fmt::format("{} was trained on other data: the checkpoint's training data have "
                    "fingerprint {}, the data given now {}; resume with the data it was "
                    "trained on, or allow the change (pooch-run: --force; C API: "
                    "pooch_train_params.allow_other_data)",
                    s->resumed_from, s->state.data_fingerprint, c.data_fingerprint));
  return c;
}

// The C callbacks behind the trainer's; `last_eval` (may be null) holds the
// XMC metrics an epoch report carries.
pooch::TrainCallbacks train_callbacks(pooch_session* s, const pooch_train_params* p,
                                      const pooch::XmcMetricsResult* last_eval) {
  pooch::TrainCallbacks cb;
  cb.on_step = [s, p](uint64_t step, float loss, int64_t epoch, int64_t batch, int64_t batches) {
    if (s->progress && !s->progress(s->progress_user, static_cast<int64_t>(step), loss))
      return false;
    return !p->on_step || p->on_step(p->user, static_cast<int64_t>(step), loss,
                                     static_cast<int>(epoch) + 1, batch + 1, batches) != 0;
  };
  cb.on_epoch = [p, last_eval](const pooch::EpochReport& r) {
    if (!p->on_epoch) return;
    pooch_epoch_report c_rep;
    std::memset(&c_rep, 0, sizeof(c_rep));
    c_rep.epoch = static_cast<int>(r.epoch);
    c_rep.train_loss = r.train_loss;
    c_rep.seconds = r.seconds;
    c_rep.learning_rate = r.lr;
    c_rep.evaluated = r.evaluated && last_eval ? 1 : 0;
    if (c_rep.evaluated) to_c(*last_eval, &c_rep.eval);
    c_rep.improved = r.improved;
    c_rep.reduced_lr = r.reduced_lr;
    c_rep.stopping = r.stopping;
    p->on_epoch(p->user, &c_rep);
  };
  return cb;
}

void to_c(const pooch::XmcMetricsResult& r, pooch_metrics* out) {
  std::memset(out, 0, sizeof(*out));
  out->rows = r.rows;
  out->has_psp = r.has_propensity ? 1 : 0;
  for (int k = 1; k <= std::min(5, r.max_k); ++k) {
    out->precision[k - 1] = r.precision_at(k);
    out->ndcg[k - 1] = r.ndcg_at(k);
    if (r.has_propensity) out->psp[k - 1] = r.psp_at(k);
  }
}

}  // namespace

extern "C" {

pooch_status pooch_train(pooch_session* s, const pooch_dataset* train, const pooch_dataset* test,
                         const pooch_train_params* p) {
  POOCH_REQUIRE_ARG(s && train && p, "pooch_train: session, train and params must not be NULL");
  POOCH_REQUIRE_ARG(p->epochs >= 0, "pooch_train: epochs must not be negative");
  POOCH_REQUIRE_ARG(p->plateau_factor > 0 && p->plateau_factor <= 1,
                    "pooch_train: plateau_factor must be in (0, 1]");
  return guarded([&] {
    pooch::TrainConfig c = train_config(s, p, pooch::data_fingerprint(train->data), "pooch_train");
    pooch::XmcMetricsResult last_eval;
    const pooch::TrainCallbacks cb = train_callbacks(s, p, &last_eval);
    pooch::train_xmc(s->impl("pooch_train"), train->data, test ? &test->data : nullptr, c, s->state,
                     cb, &last_eval);
  });
}

pooch_status pooch_train_tokens(pooch_session* s, const int32_t* tokens, int64_t count,
                                const pooch_train_params* p, const pooch_lm_params* lm) {
  POOCH_REQUIRE_ARG(s && p && lm && (tokens || count == 0),
                    "pooch_train_tokens: session, tokens, params and lm must not be NULL");
  POOCH_REQUIRE_ARG(count >= 0, "pooch_train_tokens: count must not be negative");
  POOCH_REQUIRE_ARG(p->epochs >= 0, "pooch_train_tokens: epochs must not be negative");
  POOCH_REQUIRE_ARG(p->plateau_factor > 0 && p->plateau_factor <= 1,
                    "pooch_train_tokens: plateau_factor must be in (0, 1]");
  POOCH_REQUIRE_ARG(lm->eval_every >= 0, "pooch_train_tokens: eval_every must not be negative");
  return guarded([&] {
    pooch::Session& sess = s->session();
    if (sess.model().family != "gpt")
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("pooch_train_tokens: the model is of family '{}'; token "
                                     "streams train a gpt model",
                                     sess.model().family));
    const pooch::ModelSpec spec =
        pooch::spec_from_json(sess.model().spec_json, "the session's model spec");
    pooch::LmTrainConfig c;
    c.train = train_config(s, p, pooch::token_fingerprint(tokens, count), "pooch_train_tokens");
    c.val_fraction = lm->val_fraction;
    c.eval_every = lm->eval_every;
    c.inputs = {"batch.tokens", "batch.targets"};
    const std::vector<int32_t> v(tokens, tokens + count);
    const pooch::TrainCallbacks cb = train_callbacks(s, p, nullptr);
    pooch::train_lm(
        sess, v, spec.gpt.vocab_size, c, s->state, cb,
        [&](const pooch::LmEvalReport& r) {
          if (lm->on_eval)
            lm->on_eval(p->user, static_cast<int64_t>(r.step), r.eval.loss, r.eval.perplexity);
        },
        "the token stream");
  });
}

pooch_status pooch_evaluate(pooch_session* s, const pooch_dataset* ds, const pooch_dataset* train,
                            float a, float b, pooch_metrics* out) {
  POOCH_REQUIRE_ARG(s && ds && out, "pooch_evaluate: session, dataset and out must not be NULL");
  return guarded([&] {
    std::vector<double> inv;
    if (train) {
      inv = pooch::inverse_propensities(pooch::label_counts(train->data),
                                        std::max<int64_t>(1, train->data.rows()), a, b);
      inv.resize(static_cast<size_t>(s->impl("pooch_evaluate").spec().labels), 1.0);
    }
    to_c(pooch::evaluate(s->impl("pooch_evaluate"), ds->data, train ? &inv : nullptr), out);
  });
}

}  // extern "C"

namespace {

pooch_status tensor_info(pooch_model* m, int i, bool input, pooch_tensor_info* out) {
  return guarded([&] {
    const pooch::Model& model = m->model();
    const auto& list = input ? model.inputs : model.outputs;
    if (i < 0 || static_cast<size_t>(i) >= list.size())
      throw pooch::Error(POOCH_ERR_INVALID_ARG,
                         fmt::format("the model has {} {}s; index {} is outside [0, {})",
                                     list.size(), input ? "input" : "output", i, list.size()));
    const pooch::IoTensor& io = list[static_cast<size_t>(i)];
    const pooch::TensorDesc& d = model.graph.tensor(io.id);
    if (d.shape.size() > POOCH_MAX_DIMS)
      throw pooch::Error(POOCH_ERR_UNSUPPORTED,
                         fmt::format("tensor '{}' has rank {}, more than {}", io.name,
                                     d.shape.size(), POOCH_MAX_DIMS));
    std::memset(out, 0, sizeof(*out));
    out->name = io.name.c_str();
    switch (d.dtype) {
      case pooch::DType::f32:
        out->dtype = POOCH_DTYPE_F32;
        break;
      case pooch::DType::f64:
        out->dtype = POOCH_DTYPE_F64;
        break;
      case pooch::DType::i32:
        out->dtype = POOCH_DTYPE_I32;
        break;
      case pooch::DType::u16:
        out->dtype = POOCH_DTYPE_U16;
        break;
      default:
        out->dtype = POOCH_DTYPE_OTHER;
    }
    out->rank = static_cast<int>(d.shape.size());
    for (size_t k = 0; k < d.shape.size(); ++k)
      out->shape[k] = static_cast<int>(k) == io.batch_dim ? -1 : d.shape[k];
    out->max_rows = io.batch_dim >= 0 ? d.shape[static_cast<size_t>(io.batch_dim)] : 0;
    out->bytes = d.bytes();
  });
}

int io_count(pooch_model* m, bool input) {
  if (!m) return 0;
  try {
    const pooch::Model& model = m->model();
    return static_cast<int>(input ? model.inputs.size() : model.outputs.size());
  } catch (...) {
    return 0;
  }
}

}  // namespace

extern "C" {

int pooch_model_input_count(const pooch_model* m) {
  return io_count(const_cast<pooch_model*>(m), true);
}

int pooch_model_output_count(const pooch_model* m) {
  return io_count(const_cast<pooch_model*>(m), false);
}

pooch_status pooch_model_input_info(const pooch_model* m, int i, pooch_tensor_info* out) {
  POOCH_REQUIRE_ARG(m && out, "pooch_model_input_info: model and out must not be NULL");
  return tensor_info(const_cast<pooch_model*>(m), i, true, out);
}

pooch_status pooch_model_output_info(const pooch_model* m, int i, pooch_tensor_info* out) {
  POOCH_REQUIRE_ARG(m && out, "pooch_model_output_info: model and out must not be NULL");
  return tensor_info(const_cast<pooch_model*>(m), i, false, out);
}

const char* pooch_model_family(const pooch_model* m) {
  if (!m) return "";
  try {
    return const_cast<pooch_model*>(m)->model().family.c_str();
  } catch (...) {
    return "";
  }
}

pooch_status pooch_session_set_input(pooch_session* s, const char* name, const void* data,
                                     size_t bytes) {
  POOCH_REQUIRE_ARG(s && name && (data || bytes == 0),
                    "pooch_session_set_input: session, name and data must not be NULL");
  return guarded([&] { s->session().set_input(name, data, bytes); });
}

pooch_status pooch_session_run(pooch_session* s, pooch_program program) {
  POOCH_REQUIRE_ARG(s, "pooch_session_run: session must not be NULL");
  const int program_value = pooch::api::raw_enum(program);
  POOCH_REQUIRE_ARG(
      program_value >= POOCH_PROGRAM_TRAIN_STEP && program_value <= POOCH_PROGRAM_EVALUATE,
      fmt::format("pooch_session_run: unknown program {}", program_value));
  return guarded([&] {
    s->session().run(static_cast<pooch::ProgramKind>(program_value));
    if (program == POOCH_PROGRAM_TRAIN_STEP && s->progress) {
      const pooch::Model& m = s->session().model();
      float loss;
      std::memcpy(&loss, s->session().staged(m.losses[0]), 4);
      if (!s->progress(s->progress_user, static_cast<int64_t>(s->session().optimizer_step()), loss))
        throw pooch::Error(POOCH_ERR_CANCELLED, "cancelled by the progress callback");
    }
  });
}

pooch_status pooch_session_get_output(const pooch_session* s, const char* name, void* data,
                                      size_t bytes) {
  POOCH_REQUIRE_ARG(s && name && (data || bytes == 0),
                    "pooch_session_get_output: session, name and data must not be NULL");
  return guarded([&] { s->session().get_output(name, data, bytes); });
}

}  // extern "C"

// The other C API files (pooch_api_lm.cpp) map exceptions the same way.
namespace pooch::api {
pooch_status run_guarded(const std::function<void()>& f) {
  return guarded(f);
}
pooch_status fail_arg(const char* msg) {
  return fail(POOCH_ERR_INVALID_ARG, msg);
}
}  // namespace pooch::api

/* ---------------------------------------------------------------------- */
/* Generation                                                             */

void pooch_generate_default_params(pooch_generate_params* p) {
  if (!p) return;
  const pooch::SamplingConfig d;
  p->max_tokens = d.max_tokens;
  p->temperature = d.temperature;
  p->top_k = d.top_k;
  p->top_p = d.top_p;
  p->seed = d.seed;
}

pooch_status pooch_generate(pooch_session* s, const int32_t* prompt, int64_t prompt_len,
                            const pooch_generate_params* p, pooch_token_fn on_token, void* user,
                            int32_t* out, int64_t out_capacity, int64_t* out_len) {
  POOCH_REQUIRE_ARG(s && prompt && p,
                    "pooch_generate: session, prompt and params must not be NULL");
  POOCH_REQUIRE_ARG(prompt_len > 0, "pooch_generate: prompt_len must be at least 1");
  POOCH_REQUIRE_ARG(out_capacity >= 0 && (out || out_capacity == 0),
                    "pooch_generate: out must hold out_capacity tokens (NULL only with 0)");
  if (out_len) *out_len = 0;
  return guarded([&] {
    pooch::Session& sess = s->session();
    if (sess.model().family != "gpt")
      throw pooch::Error(POOCH_ERR_UNSUPPORTED,
                         fmt::format("pooch_generate: the model is of family '{}'; generation "
                                     "needs a gpt model",
                                     sess.model().family.empty() ? "(none)" : sess.model().family));
    pooch::SamplingConfig c;
    c.max_tokens = p->max_tokens;
    c.temperature = p->temperature;
    c.top_k = p->top_k;
    c.top_p = p->top_p;
    c.seed = p->seed;
    pooch::validate_sampling(c);
    if (!s->generator) {
      const pooch::ModelSpec spec =
          pooch::spec_from_json(sess.model().spec_json, "the session's model spec");
      pooch::SessionConfig decoder = s->config;
      decoder.initialise = false;  // copy_weights writes every weight
      s->generator = std::make_unique<pooch::Generator>(spec, decoder);
    }
    s->generator->copy_weights(sess);
    int64_t n = 0;
    s->generator->generate(std::span<const int32_t>(prompt, static_cast<size_t>(prompt_len)), c,
                           [&](int32_t tok, int64_t i) {
                             if (i < out_capacity) out[i] = tok;
                             n = std::min(i + 1, out_capacity);
                             return on_token ? on_token(user, tok, i) != 0 : true;
                           });
    if (out_len) *out_len = n;
  });
}
