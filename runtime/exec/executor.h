// Runs schedules on a backend. The executor takes the arena and the host pool
// once, binds each schedule's offsets to pointers once (bind), and then a run
// only walks the schedule's steps, queueing prepared work on the backend's
// streams. It decides nothing: every choice is the planner's (runtime/plan).
// Nothing is allocated during a run.
#pragma once
#include <vector>

#include "../backend/backend.h"
#include "../plan/schedule.h"

namespace pooch {

// A schedule with its pointers bound; valid while the executor lives.
struct BoundSchedule {
  const Schedule* schedule = nullptr;
  std::vector<kern::KernelArgs> args;  // per launch, pointing into the arena
  std::vector<EventId> events;         // the backend's event for each schedule event
};

class Executor {
 public:
  // Reserves `arena_bytes` of device memory and `host_bytes` of host pool
  // (Error POOCH_ERR_OUT_OF_BUDGET from the backend when they do not fit).
  Executor(Backend& backend, size_t arena_bytes, size_t host_bytes);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Binds a schedule planned for at most arena_bytes() and host_bytes().
  // `ctx` is the kernel context every launch reads; it must outlive the binding.
  BoundSchedule bind(const Schedule& s, const kern::KernelContext* ctx);
  // Queues the schedule's steps and waits for all of them; rethrows the
  // first error a kernel or copy raised.
  void run(const BoundSchedule& b);
  // The same, timing each launch and copy between two timed events recorded
  // around it on its stream: the device's own clock, without the host's
  // synchronisation (the profiler's run). Everything is queued as in a step;
  // a stream runs one thing at a time, so each time is its own.
  StepTimes run_timed(const BoundSchedule& b);

  // Synchronous copies between host memory and an arena offset.
  void write(size_t offset, const void* src, size_t bytes);
  void read(size_t offset, void* dst, size_t bytes) const;
  // The bytes at an arena offset, readable in place when the device's memory
  // is host memory (the CPU backend), after waiting for queued work; null
  // otherwise.
  const std::byte* host_view(size_t offset) const;

  std::byte* host_pool() const { return backend_.host_pool_base(); }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t host_bytes() const { return host_bytes_; }
  Backend& backend() const { return backend_; }

 private:
  void step(const BoundSchedule& b, const ScheduleStep& st);
  Backend& backend_;
  size_t arena_bytes_ = 0;
  size_t host_bytes_ = 0;
  std::vector<EventId> launch_timers_;  // run_timed's, two a launch, made as needed
  std::vector<EventId> copy_timers_;    // run_timed's, two a copy, made as needed
};

}  // namespace pooch
