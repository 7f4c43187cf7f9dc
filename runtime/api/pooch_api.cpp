// The C API: argument checks, then a call into the C++ runtime with every
// exception turned into a pooch_status and a per-thread message. No logic of
// its own beyond that.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "../../formats/xmc_data.h"
#include "../core/error.h"
#include "../train/xmc_session.h"
#include "pooch/pooch.h"

struct pooch_model {
  pooch::ModelSpec spec;
};

struct pooch_session {
  std::unique_ptr<pooch::XmcSession> impl;
  pooch_progress_fn progress = nullptr;
  void* progress_user = nullptr;
};

struct pooch_dataset {
  pooch::XmcDataset data;
};

namespace {

thread_local std::string g_last_error;

struct LogSink {
  std::mutex mu;
  pooch_log_fn fn = nullptr;
  void* user = nullptr;
  pooch_log_level min_level = POOCH_LOG_INFO;
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

pooch_status fail(pooch_status st, std::string msg) {
  g_last_error = std::move(msg);
  return st;
}

// Runs f, mapping every exception to a status; nothing escapes the C boundary.
template <class F>
pooch_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return POOCH_OK;
  } catch (const pooch::Error& e) {
    return fail(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(POOCH_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(POOCH_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(POOCH_ERR_INTERNAL, "internal error: unknown exception");
  }
}

#define POOCH_REQUIRE_ARG(cond, msg) \
  if (!(cond)) return fail(POOCH_ERR_INVALID_ARG, msg)

pooch::BatchView to_view(const pooch_batch* b) {
  pooch::BatchView v;
  v.rows = b->rows;
  v.row_ptr = b->row_ptr;
  v.col = b->col;
  v.val = b->val;
  v.label_ptr = b->label_ptr;
  v.label = b->label;
  return v;
}

}  // namespace

extern "C" {

const char* pooch_status_str(pooch_status status) {
  switch (status) {
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

unsigned pooch_version(void) {
  return (POOCH_VERSION_MAJOR << 16) | (POOCH_VERSION_MINOR << 8) | POOCH_VERSION_PATCH;
}

const char* pooch_version_str(void) {
  return "0.1.0";
}

void pooch_set_log(pooch_log_fn fn, void* user, pooch_log_level min_level) {
  LogSink& s = log_sink();
  std::lock_guard lock(s.mu);
  s.fn = fn;
  s.user = user;
  s.min_level = min_level;
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
  POOCH_REQUIRE_ARG(
      p->loss >= POOCH_LOSS_BCE && p->loss <= POOCH_LOSS_SOFTMAX,
      fmt::format("pooch_model_create_xmc: unknown loss {}", static_cast<int>(p->loss)));
  return guarded([&] {
    const pooch::LossKind loss = p->loss == POOCH_LOSS_BCE             ? pooch::LossKind::bce
                                 : p->loss == POOCH_LOSS_SQUARED_HINGE ? pooch::LossKind::squared_hinge
                                                                       : pooch::LossKind::softmax;
    pooch::ModelSpec s = pooch::spec_from_flags(pooch::InputKind::sparse, p->features, p->labels,
                                                p->hidden, 0, p->fan_in, loss, p->dropout);
    s.batch = p->batch_size;
    s.max_nnz = p->max_nnz;
    s.seed = p->seed;
    s.topk = p->topk;
    // Build once now so that a bad spec fails here, not at session creation.
    (void)pooch::build_xmc_model(s, pooch::OptimizerConfig{});
    *out = new pooch_model{s};
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
}

pooch_status pooch_session_create(pooch_model* model, const pooch_session_params* p,
                                  pooch_session** out) {
  POOCH_REQUIRE_ARG(model && p && out,
                    "pooch_session_create: model, params and out must not be NULL");
  *out = nullptr;
  POOCH_REQUIRE_ARG(p->learning_rate > 0, "pooch_session_create: learning_rate must be positive");
  POOCH_REQUIRE_ARG(p->threads >= 0, "pooch_session_create: threads must be >= 0");
  return guarded([&] {
    pooch::SessionConfig c;
    c.device = p->device == POOCH_DEVICE_CPU    ? pooch::DeviceKind::cpu
               : p->device == POOCH_DEVICE_CUDA ? pooch::DeviceKind::cuda
                                                : pooch::DeviceKind::automatic;
    c.device_memory = p->device_memory;
    c.threads = p->threads;
    c.deterministic = p->deterministic != 0;
    auto& o = c.optimizer;
    o.kind = p->optimizer == POOCH_OPT_SGD     ? pooch::OptimizerConfig::Kind::sgd
             : p->optimizer == POOCH_OPT_ADAMW ? pooch::OptimizerConfig::Kind::adamw
                                               : pooch::OptimizerConfig::Kind::adam;
    o.lr = p->learning_rate;
    o.beta1 = p->beta1;
    o.beta2 = p->beta2;
    o.eps = p->eps;
    o.weight_decay = p->weight_decay;
    o.momentum = p->momentum;
    auto built = pooch::build_xmc_model(model->spec, o);
    auto s = std::make_unique<pooch_session>();
    s->impl = std::make_unique<pooch::XmcSession>(
        std::move(built), c, [](void*, const char* line) { log_line(POOCH_LOG_INFO, line); },
        nullptr);
    s->progress = p->progress;
    s->progress_user = p->progress_user;
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
    const float l = s->impl->step(to_view(batch));
    if (loss) *loss = l;
    if (s->progress &&
        !s->progress(s->progress_user, static_cast<int64_t>(s->impl->executor().step()), l))
      throw pooch::Error(POOCH_ERR_CANCELLED, "cancelled by the progress callback");
  });
}

pooch_status pooch_session_predict(pooch_session* s, const pooch_batch* batch, int k,
                                   int32_t* labels, float* scores) {
  POOCH_REQUIRE_ARG(s && batch, "pooch_session_predict: session and batch must not be NULL");
  return guarded([&] { s->impl->predict(to_view(batch), k, labels, scores); });
}

void pooch_session_cancel(pooch_session* s) {
  if (s) s->impl->cancel();
}

pooch_status pooch_session_memory(const pooch_session* s, pooch_memory_report* out) {
  POOCH_REQUIRE_ARG(s && out, "pooch_session_memory: session and out must not be NULL");
  return guarded([&] {
    const pooch::ArenaPlan& plan = s->impl->executor().plan();
    out->arena_bytes = plan.peak;
    for (int r = 0; r < pooch::kNumRoles; ++r) out->by_role[r] = plan.bytes_by_role[r];
    out->budget = s->impl->budget();
    out->backend = s->impl->backend_name();
  });
}

pooch_status pooch_session_read_tensor(const pooch_session* s, const char* name, void* dst,
                                       size_t* bytes) {
  POOCH_REQUIRE_ARG(s && name && bytes,
                    "pooch_session_read_tensor: session, name and bytes must not be NULL");
  return guarded([&] {
    const auto id = s->impl->model().graph.find(name);
    if (!id) throw pooch::Error(POOCH_ERR_INVALID_ARG, fmt::format("no tensor named '{}'", name));
    const size_t need = s->impl->model().graph.tensor(*id).bytes();
    if (!dst) {
      *bytes = need;
      return;
    }
    if (*bytes != need)
      throw pooch::Error(
          POOCH_ERR_INVALID_ARG,
          fmt::format("tensor '{}' has {} bytes, the buffer {}", name, need, *bytes));
    s->impl->executor().read_tensor(*id, dst, need);
  });
}

void pooch_planted_default_params(pooch_planted_params* p) {
  if (!p) return;
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
  return POOCH_OK;
}

}  // extern "C"
