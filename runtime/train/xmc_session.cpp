#include "xmc_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "../core/error.h"

namespace pooch {

XmcSession::XmcSession(std::shared_ptr<const Model> model, const SessionConfig& cfg,
                       BackendNote note, void* note_user)
    : session_(std::move(model), cfg, note, note_user) {
  if (session_.model().family != "xmc")
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("an XMC session needs an xmc model, not '{}'",
                                                   session_.model().family));
  spec_ = spec_from_json(session_.model().spec_json, "the model's spec");
}

void XmcSession::stage(const BatchView& b, bool with_labels) {
  const ModelSpec& s = spec_;
  const int64_t B = s.run.batch;
  if (b.rows < 0 || b.rows > B)
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("batch has {} rows; the session was planned for at most {}", b.rows, B));
  if (s.input == InputKind::dense) {
    if (!b.dense && b.rows > 0)
      throw Error(POOCH_ERR_INVALID_ARG,
                  "batch: the model takes dense rows but batch.dense is null");
    const int64_t D = s.input_width;
    for (int64_t i = 0; i < b.rows * D; ++i)
      if (!std::isfinite(b.dense[i]))
        throw Error(POOCH_ERR_BAD_INPUT,
                    fmt::format("batch row {}, column {}: value is not finite", i / D, i % D));
    auto* x = static_cast<float*>(session_.input_buffer("batch.x", b.rows));
    if (b.rows > 0) std::memcpy(x, b.dense, static_cast<size_t>(b.rows * D) * 4);
    std::memset(x + b.rows * D, 0, static_cast<size_t>((B - b.rows) * D) * 4);
  } else {
    if (!b.row_ptr) throw Error(POOCH_ERR_INVALID_ARG, "batch: row_ptr must not be null");
    const int64_t base = b.row_ptr[0];
    const int64_t nnz = b.row_ptr[b.rows] - base;
    if (nnz > 0 && (!b.col || !b.val))
      throw Error(POOCH_ERR_INVALID_ARG, "batch: col and val must not be null");
    if (nnz > s.run.max_nnz)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("batch has {} nonzeros; the session reserved {} (raise max_nnz)", nnz,
                              s.run.max_nnz));
    auto* ptr = static_cast<int32_t*>(session_.input_buffer("batch.ptr", b.rows));
    auto* idx = static_cast<int32_t*>(session_.input_buffer("batch.idx", b.rows));
    auto* val = static_cast<float*>(session_.input_buffer("batch.val", b.rows));
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
    for (int64_t r = 0; r <= B; ++r)
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
  if (labels > s.run.max_labels)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("batch has {} labels; the session reserved {} (raise max_labels)",
                            labels, s.run.max_labels));
  auto* lptr = static_cast<int32_t*>(session_.input_buffer("batch.lptr", b.rows));
  auto* lidx = static_cast<int32_t*>(session_.input_buffer("batch.lidx", b.rows));
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
  for (int64_t r = b.rows + 1; r <= B; ++r) lptr[r] = static_cast<int32_t>(n);
}

float XmcSession::train_step(const BatchView& b) {
  stage(b, true);
  session_.run(ProgramKind::train_step);
  float loss;
  std::memcpy(&loss, session_.output_buffer("loss"), 4);
  return loss;
}

void XmcSession::predict(const BatchView& b, int k, int32_t* labels, float* scores) {
  const int K = spec_.run.topk;
  if (k < 1 || k > K)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("top-k must be between 1 and {} (the session's topk), got {}", K, k));
  stage(b, false);
  session_.run(ProgramKind::forward);
  const auto* v = static_cast<const float*>(session_.output_buffer("top.values"));
  const auto* i = static_cast<const int32_t*>(session_.output_buffer("top.indices"));
  for (int64_t r = 0; r < b.rows; ++r)
    for (int j = 0; j < k; ++j) {
      if (labels) labels[r * k + j] = i[r * K + j];
      if (scores) scores[r * k + j] = v[r * K + j];
    }
}

}  // namespace pooch
