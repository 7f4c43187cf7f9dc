// Runs a graph on a backend inside one fixed arena.
//
// At construction everything is decided: each node's kernel, each tensor's
// arena offset (from its live interval over the whole node order), the host
// staging slots of inputs and outputs, and every kernel's arguments. A run
// then only queues prepared work on the backend's streams: inputs are copied
// in on the host-to-device stream, kernels run on the compute stream after an
// event, outputs are copied back on the device-to-host stream. Nothing is
// allocated during a run.
#pragma once
#include <memory>
#include <vector>

#include "../backend/backend.h"
#include "../core/graph.h"
#include "../memory/arena_plan.h"

namespace pooch {

struct ExecutorParams {
  size_t budget = 0;          // device bytes the arena may take; 0: the backend's budget
  bool deterministic = true;  // only bitwise-reproducible kernels
  int threads = 1;            // CPU threads per kernel
  uint64_t seed = 1;          // dropout and other counter-based randomness
};

// A subset of the graph's nodes, run in graph order.
struct Program {
  std::vector<int> nodes;
  bool is_training = true;  // advances the step counter; dropout active
};

class Executor {
 public:
  Executor(const Graph& g, Backend& backend, const ExecutorParams& p);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The nodes needed to compute `wanted`, plus (if `with_updates`) every node
  // that writes into its inputs (optimizer updates) and what they need.
  Program program(const std::vector<TensorId>& wanted, bool with_updates) const;

  // Host-side staging of an input tensor: write the next batch here before run().
  void* input_staging(TensorId input);
  // Host-side copy of an output tensor (Graph::outputs()), valid after run().
  const void* output_staging(TensorId output) const;

  // Synchronous whole-tensor access (weights at start-up, checkpoints, tests).
  void write_tensor(TensorId t, const void* src, size_t bytes);
  void read_tensor(TensorId t, void* dst, size_t bytes) const;
  // Where the tensor's bytes can be read in place, when the device's memory
  // is host memory (the CPU backend), after waiting for queued work; null
  // otherwise (read_tensor copies then).
  const std::byte* host_view(TensorId t) const;

  void run(const Program& prog);

  const ArenaPlan& plan() const { return plan_; }
  uint64_t step() const { return ctx_.step; }
  void set_step(uint64_t s) { ctx_.step = s; }
  void set_lr_scale(double s) { ctx_.lr_scale = s; }
  const Graph& graph() const { return graph_; }
  Backend& backend() const { return backend_; }
  // The kernel variant chosen for each node (for reports).
  const kern::KernelVariant& kernel_of(int node) const {
    return *kernels_[static_cast<size_t>(node)];
  }

 private:
  const Graph& graph_;
  Backend& backend_;
  ExecutorParams params_;
  ArenaPlan plan_;
  kern::KernelContext ctx_;
  std::vector<size_t> tensor_offset_;  // arena offset per tensor
  std::vector<const kern::KernelVariant*> kernels_;
  std::vector<kern::KernelArgs> args_;  // per node, pointing into the arena
  std::vector<TensorId> inputs_;        // role input
  std::vector<size_t> staging_offset_;  // host pool offset per tensor (inputs and outputs)
  EventId inputs_ready_ = -1, compute_done_ = -1;
  std::byte* device_ptr(TensorId t) const;
};

}  // namespace pooch
