#include "xmc_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "../core/error.h"
#ifdef POOCH_HAVE_CUDA
#include "../backend/cuda/cuda_backend.h"
#endif

namespace pooch {

XmcSession::XmcSession(std::unique_ptr<XmcModel> model, const SessionConfig& cfg, SessionLog log,
                       void* log_user)
    : model_(std::move(model)) {
  const int threads = cfg.threads > 0 ? cfg.threads
                                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cfg.device != DeviceKind::cpu) {
    std::string why;
#ifdef POOCH_HAVE_CUDA
    if (cuda_device_available(&why)) {
      CudaBackendParams cp;
      cp.device_budget = cfg.device_memory;
      cp.threads = threads;
      backend_ = make_cuda_backend(cp);
    }
#else
    why = "this build of pooch has no CUDA backend (nvcc was not found when it was built)";
#endif
    if (!backend_ && cfg.device == DeviceKind::cuda)
      throw Error(POOCH_ERR_NO_DEVICE,
                  fmt::format("--device cuda: {}; use --device cpu or auto", why));
    if (!backend_ && log)
      log(log_user, fmt::format("device auto: using the CPU backend ({})", why).c_str());
  }
  if (!backend_) {
    CpuBackendParams bp;
    bp.device_budget = cfg.device_memory;
    bp.threads = threads;
    backend_ = make_cpu_backend(bp);
  }
  budget_ = cfg.device_memory;
  optimizer_ = cfg.optimizer;
  ExecutorParams ep;
  ep.budget = cfg.device_memory;
  ep.deterministic = cfg.deterministic;
  ep.threads = threads;
  ep.seed = model_->spec.seed;
  exec_ = std::make_unique<Executor>(model_->graph, *backend_, ep);
  for (const WeightInit& w : model_->init) {
    const auto bytes = initial_value(model_->graph, w, model_->spec.seed);
    exec_->write_tensor(w.tensor, bytes.data(), bytes.size());
  }
  train_ = exec_->program({model_->loss}, true);
  predict_ = exec_->program({model_->top_values, model_->top_indices}, false);
}

XmcSession::~XmcSession() = default;

void XmcSession::check_cancel() {
  if (cancel_.exchange(false)) throw Error(POOCH_ERR_CANCELLED, "cancelled");
}

void XmcSession::stage(const BatchView& b, bool with_labels) {
  const ModelSpec& s = model_->spec;
  if (b.rows < 0 || b.rows > s.batch)
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("batch has {} rows; the session was planned for at most {}", b.rows, s.batch));
  if (s.input == InputKind::dense) {
    if (!b.dense && b.rows > 0)
      throw Error(POOCH_ERR_INVALID_ARG,
                  "batch: the model takes dense rows but batch.dense is null");
    const int64_t D = s.input_width;
    for (int64_t i = 0; i < b.rows * D; ++i)
      if (!std::isfinite(b.dense[i]))
        throw Error(POOCH_ERR_BAD_INPUT,
                    fmt::format("batch row {}, column {}: value is not finite", i / D, i % D));
    auto* x = static_cast<float*>(exec_->input_staging(model_->x));
    if (b.rows > 0) std::memcpy(x, b.dense, static_cast<size_t>(b.rows * D) * 4);
    std::memset(x + b.rows * D, 0, static_cast<size_t>((s.batch - b.rows) * D) * 4);
  } else {
    if (!b.row_ptr) throw Error(POOCH_ERR_INVALID_ARG, "batch: row_ptr must not be null");
    const int64_t base = b.row_ptr[0];
    const int64_t nnz = b.row_ptr[b.rows] - base;
    if (nnz > 0 && (!b.col || !b.val))
      throw Error(POOCH_ERR_INVALID_ARG, "batch: col and val must not be null");
    if (nnz > s.max_nnz)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("batch has {} nonzeros; the session reserved {} (raise max_nnz)", nnz,
                              s.max_nnz));
    auto* ptr = static_cast<int32_t*>(exec_->input_staging(model_->ptr));
    auto* idx = static_cast<int32_t*>(exec_->input_staging(model_->idx));
    auto* val = static_cast<float*>(exec_->input_staging(model_->val));
    for (int64_t r = 0; r < b.rows; ++r) {
      if (b.row_ptr[r + 1] < b.row_ptr[r])
        throw Error(POOCH_ERR_BAD_INPUT, fmt::format("batch row {}: row_ptr decreases", r));
      for (int64_t j = b.row_ptr[r]; j < b.row_ptr[r + 1]; ++j) {
        if (b.col[j] < 0 || b.col[j] >= s.input_width)
          throw Error(POOCH_ERR_BAD_INPUT,
                      fmt::format("batch row {}, entry {}: feature {} is outside [0, {})", r,
                                  j - b.row_ptr[r], b.col[j], s.input_width));
        if (!std::isfinite(b.val[j]))
          throw Error(
              POOCH_ERR_BAD_INPUT,
              fmt::format("batch row {}, entry {}: value is not finite", r, j - b.row_ptr[r]));
      }
    }
    // Padding rows past b.rows are empty.
    for (int64_t r = 0; r <= s.batch; ++r)
      ptr[r] = static_cast<int32_t>(b.row_ptr[std::min(r, b.rows)] - base);
    if (nnz > 0) {
      std::memcpy(idx, b.col + base, static_cast<size_t>(nnz) * 4);
      std::memcpy(val, b.val + base, static_cast<size_t>(nnz) * 4);
    }
  }
  if (!with_labels) return;
  if (!b.label_ptr || (b.label_ptr[b.rows] > b.label_ptr[0] && !b.label))
    throw Error(POOCH_ERR_INVALID_ARG, "batch: label_ptr and label must not be null when training");
  // The targets go to the loss as a label CSR: row offsets relative to the
  // batch, the rows' labels packed from 0, padding rows empty.
  for (int64_t r = 0; r < b.rows; ++r)
    if (b.label_ptr[r + 1] < b.label_ptr[r])
      throw Error(POOCH_ERR_BAD_INPUT, fmt::format("batch row {}: label_ptr decreases", r));
  const int64_t labels = b.label_ptr[b.rows] - b.label_ptr[0];
  if (labels > s.max_labels)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("batch has {} labels; the session reserved {} (raise max_labels)",
                            labels, s.max_labels));
  auto* lptr = static_cast<int32_t*>(exec_->input_staging(model_->lptr));
  auto* lidx = static_cast<int32_t*>(exec_->input_staging(model_->lidx));
  int64_t n = 0;
  lptr[0] = 0;
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t first = n;
    bool ascending = true;
    for (int64_t j = b.label_ptr[r]; j < b.label_ptr[r + 1]; ++j) {
      const int32_t id = b.label[j];
      if (id < 0 || id >= s.labels)
        throw Error(POOCH_ERR_BAD_INPUT,
                    fmt::format("batch row {}: label {} is outside [0, {})", r, id, s.labels));
      if (n > first && id <= lidx[n - 1]) ascending = false;
      lidx[n++] = id;
    }
    // The loss kernels take each row's labels as distinct: a repeated label
    // counts once, as it did in dense 0/1 targets. Rows from a data set
    // arrive sorted and unique, so this is only a check for them.
    if (!ascending) {
      std::sort(lidx + first, lidx + n);
      n = std::unique(lidx + first, lidx + n) - lidx;
    }
    lptr[r + 1] = static_cast<int32_t>(n);
  }
  for (int64_t r = b.rows + 1; r <= s.batch; ++r) lptr[r] = static_cast<int32_t>(n);
}

float XmcSession::step(const BatchView& b) {
  check_cancel();
  stage(b, true);
  exec_->run(train_);
  float loss;
  std::memcpy(&loss, exec_->output_staging(model_->loss), 4);
  return loss;
}

void XmcSession::predict(const BatchView& b, int k, int32_t* labels, float* scores) {
  check_cancel();
  if (k < 1 || k > model_->spec.topk)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("top-k must be between 1 and {} (the session's topk), got {}",
                            model_->spec.topk, k));
  stage(b, false);
  exec_->run(predict_);
  const auto* v = static_cast<const float*>(exec_->output_staging(model_->top_values));
  const auto* i = static_cast<const int32_t*>(exec_->output_staging(model_->top_indices));
  const int K = model_->spec.topk;
  for (int64_t r = 0; r < b.rows; ++r)
    for (int j = 0; j < k; ++j) {
      if (labels) labels[r * k + j] = i[r * K + j];
      if (scores) scores[r * k + j] = v[r * K + j];
    }
}

std::vector<std::byte> XmcSession::read(std::string_view name) const {
  const auto id = model_->graph.find(name);
  if (!id) throw Error(POOCH_ERR_INVALID_ARG, fmt::format("no tensor named '{}'", name));
  std::vector<std::byte> out(model_->graph.tensor(*id).bytes());
  exec_->read_tensor(*id, out.data(), out.size());
  return out;
}

void XmcSession::write(std::string_view name, const void* data, size_t bytes) {
  const auto id = model_->graph.find(name);
  if (!id) throw Error(POOCH_ERR_INVALID_ARG, fmt::format("no tensor named '{}'", name));
  const TensorDesc& d = model_->graph.tensor(*id);
  if (bytes != d.bytes())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("tensor '{}' has {} bytes, got {}", name, d.bytes(), bytes));
  exec_->write_tensor(*id, data, bytes);
}

}  // namespace pooch
