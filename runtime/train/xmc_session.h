// A training and prediction session over an XMC model: owns the backend, the
// planned executor and the batch staging. One session per thread; cancel()
// is safe from any thread.
#pragma once
#include <atomic>
#include <memory>
#include <string_view>
#include <vector>

#include "../backend/backend.h"
#include "../exec/executor.h"
#include "xmc_model.h"

namespace pooch {

enum class DeviceKind { automatic, cpu, cuda };

struct SessionConfig {
  DeviceKind device = DeviceKind::automatic;
  size_t device_memory = 0;  // 0: no cap beyond the device
  int threads = 0;           // 0: all cores
  bool deterministic = true;
  OptimizerConfig optimizer;
};

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

// Called with one line when the session falls back or notes something.
using SessionLog = void (*)(void* user, const char* line);

class XmcSession {
 public:
  XmcSession(std::unique_ptr<XmcModel> model, const SessionConfig& cfg, SessionLog log = nullptr,
             void* log_user = nullptr);
  ~XmcSession();

  // One forward, backward and update; returns the batch loss.
  float step(const BatchView& b);
  // Top-k labels and scores per row, best first (k <= spec().topk).
  void predict(const BatchView& b, int k, int32_t* labels, float* scores);
  void cancel() { cancel_.store(true); }

  const XmcModel& model() const { return *model_; }
  const Executor& executor() const { return *exec_; }
  // Copies a tensor (weight, state) out of the arena, or into it.
  std::vector<std::byte> read(std::string_view tensor_name) const;
  void write(std::string_view tensor_name, const void* data, size_t bytes);
  // The optimizer step counter (Adam's t; dropout masks are keyed by it).
  uint64_t step() const { return exec_->step(); }
  void set_step(uint64_t s) { exec_->set_step(s); }
  void set_lr_scale(double s) { exec_->set_lr_scale(s); }
  const char* backend_name() const { return backend_->name(); }
  const OptimizerConfig& optimizer() const { return optimizer_; }
  size_t budget() const { return budget_; }

 private:
  void stage(const BatchView& b, bool with_labels);
  void check_cancel();
  std::unique_ptr<XmcModel> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executor> exec_;
  Program train_, predict_;
  std::atomic<bool> cancel_{false};
  size_t budget_ = 0;
  OptimizerConfig optimizer_;
};

}  // namespace pooch
