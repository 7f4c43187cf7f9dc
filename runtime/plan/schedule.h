// A Schedule: everything one program (a train step, a forward pass...) does,
// decided at plan time, in order. The executor binds its offsets to the
// backend's memory once and then only walks these steps.
//
// A launch carries its own kernel arguments, so one node may be launched
// several times with different operands (recompute will need that); copies
// move a tensor between its device offset and its host staging slot; events
// order the streams.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "../backend/backend.h"
#include "../core/graph.h"
#include "../memory/arena_plan.h"

namespace pooch {

inline constexpr size_t kUnplaced = SIZE_MAX;

enum class StepKind : uint8_t { launch, copy_in, copy_out, record, wait };

struct ScheduleStep {
  StepKind kind = StepKind::launch;
  Stream stream = Stream::compute;
  // launch: index into Schedule::launches; copy_in/copy_out: index into
  // Schedule::copies; record/wait: the schedule's event number (0 .. events-1).
  int32_t index = 0;
};

// A copy between an arena offset and a host pool offset: an input staged in,
// an output back, an activation swapped out to the host and prefetched back.
struct ScheduledCopy {
  TensorId tensor = kNoTensor;
  size_t device_offset = 0;
  size_t host_offset = 0;
  size_t bytes = 0;
};

// Where a saved activation spends the gap between its last forward use and
// its first backward use.
enum class Residency : uint8_t {
  keep,       // stays on the device
  swap,       // copied to the host pool after it is made, prefetched before its next use
  recompute,  // freed after its last forward use, its producer rerun before the next
};
const char* residency_name(Residency r);

struct Launch {
  int node = -1;  // the graph node this computes (for reports and profiles)
  const kern::KernelVariant* kernel = nullptr;
  // Shapes, attributes and workspace size; data pointers are left null here
  // and bound by the executor from the offsets below.
  kern::KernelArgs args;
  size_t in_offset[kern::kMaxOperands] = {};  // arena offsets of the operands
  size_t out_offset[kern::kMaxOperands] = {};
  size_t workspace_offset = kUnplaced;  // kUnplaced: no workspace
  // A host kernel (Backend::host_kernels), queued on the d2h stream: the
  // offsets above (its workspace's too) are host pool offsets.
  bool on_host = false;
};

struct Schedule {
  std::vector<Launch> launches;
  std::vector<int> launch_node;  // per launch slot: the graph node it runs (the simulator's key)
  // Per launch slot: 1 where it runs its node's replay (OpDef::replay) for a
  // recompute, which the profile times apart from the node.
  std::vector<char> launch_replay;
  std::vector<ScheduleStep> steps;
  std::vector<ScheduledCopy> copies;
  int events = 0;
  bool training = false;  // advances the optimizer step; dropout active
  // Inputs the program reads and outputs it writes: the only tensors copied.
  std::vector<TensorId> copied_in, copied_out;
  // Arena offset of every tensor the program touches (kUnplaced elsewhere).
  std::vector<size_t> tensor_offset;
  // The program's own buffers (activations, gradients, inputs, workspaces),
  // planned above the session's persistent region.
  ArenaPlan transient;
  // Its requests (transient.offsets[i] places request i): each a live
  // interval over launch slots (slot i runs launches[i]), for occupancy
  // reports; and the tensor each holds (kNoTensor: a launch's workspace).
  std::vector<BufferRequest> transient_requests;
  std::vector<TensorId> transient_tensor;
  size_t arena_bytes = 0;  // persistent region + transient peak
  // The host pool it needs: the session's staging slots plus its swap slots.
  size_t host_bytes = 0;
  // Per tensor: what the planner did with it (keep for all but the saved
  // activations it swapped or recomputed), and the bytes of each kind.
  std::vector<Residency> residency;
  size_t swapped_bytes = 0, recomputed_bytes = 0;
  // Paged weights and optimizer state, whose home is the host pool
  // (SessionLayout::home_offset), and the bytes the program copies each way.
  size_t paged_bytes = 0, paged_in_bytes = 0, paged_out_bytes = 0;
  // Launches on the host (SessionLayout::host_update): optimizer updates, and
  // all of them (with a sparse input layer's forward and row gradient); the
  // bytes copied out for them (gradients, the clipping norm); and the host
  // pool they use beyond the swap slots (copies, outputs, workspaces, each
  // aligned), the same whatever the activations' decisions.
  int host_updates = 0, host_launches = 0;
  size_t host_update_copy_bytes = 0, host_side_bytes = 0;

  int add_event() { return events++; }
  int add_launch(Launch l) {
    launch_node.push_back(l.node);
    launch_replay.push_back(0);
    launches.push_back(l);
    steps.push_back({StepKind::launch, Stream::compute, static_cast<int32_t>(launches.size() - 1)});
    return static_cast<int>(launches.size() - 1);
  }
  int add_copy(StepKind kind, Stream s, ScheduledCopy c) {
    copies.push_back(c);
    steps.push_back({kind, s, static_cast<int32_t>(copies.size() - 1)});
    return static_cast<int>(copies.size() - 1);
  }
  // One line per step, for `pooch-run info` and tests.
  std::string describe(const Graph& g) const;
};

// What a timed run of a schedule measured (Executor::run_timed): the
// profiler's raw material.
struct StepTimes {
  std::vector<double> launch_seconds;  // per launch
  std::vector<double> copy_seconds;    // per copy
};

}  // namespace pooch
