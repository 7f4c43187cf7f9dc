// The XMC adapter over a generic Session: packs CSR feature rows and their
// label sets into the xmc family's inputs (batch.ptr/idx/val or batch.x, and
// the label CSR batch.lptr/lidx), runs a train step or a forward pass, and
// reads the loss or the top-k labels back. One per thread; cancel() is safe
// from any thread.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "../models/model_spec.h"
#include "../session/session.h"

namespace pooch {

// One batch as the C API passes it (CSR features, CSR labels).
struct BatchView {
  int64_t rows = 0;
  const float* dense = nullptr;  // dense input: rows x input width, row-major
  const int64_t* row_ptr = nullptr;
  const int32_t* col = nullptr;
  const float* val = nullptr;
  const int64_t* label_ptr = nullptr;  // may be null for predict
  const int32_t* label = nullptr;
};

class XmcSession {
 public:
  // `model` must be of the xmc family (build_xmc_model or a loaded xmc file).
  XmcSession(std::shared_ptr<const Model> model, const SessionConfig& cfg,
             BackendNote note = nullptr, void* note_user = nullptr);

  // One forward, backward and update; returns the batch loss.
  float train_step(const BatchView& b);
  // Top-k labels and scores per row, best first (k <= spec().run.topk).
  void predict(const BatchView& b, int k, int32_t* labels, float* scores);
  void cancel() { session_.cancel(); }

  const ModelSpec& spec() const { return spec_; }
  Session& session() { return session_; }
  const Session& session() const { return session_; }
  const Model& model() const { return session_.model(); }
  std::vector<std::byte> read(std::string_view tensor_name) const {
    return session_.read_tensor(tensor_name);
  }
  void write(std::string_view tensor_name, const void* data, size_t bytes) {
    session_.write_tensor(tensor_name, data, bytes);
  }

  // Packs a batch into the session's inputs (checked: Error naming the row).
  void stage(const BatchView& b, bool with_labels);

 private:
  Session session_;
  ModelSpec spec_;
};

}  // namespace pooch
