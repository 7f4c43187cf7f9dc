// One CPU "stream": a worker thread draining a fixed-capacity ring of plain
// task records. The executor promises no allocation during a step, so
// queueing work only copies a record into the ring (blocking while it is
// full) and events are counters under a mutex.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../../../kernels/common/kernel_abi.h"
#include "pooch/pooch.h"

namespace pooch::cpu {

// An event counts how often the host recorded it and how many of those
// records a stream has reached. Waiting for record k means waiting until
// `completed` reaches k, so a later record never satisfies an earlier wait
// too early and re-recording needs no reset.
class EventState {
 public:
  // Host side: the number a wait for the record just queued must reach.
  uint64_t next_record() { return ++recorded_; }
  uint64_t recorded() const { return recorded_; }

  // Completes record n at `at` (the stream's clock where it is not the
  // thread's: behind a copy of the emulated link), else now.
  void complete(uint64_t n, std::optional<std::chrono::steady_clock::time_point> at = {});
  // Returns when the record completed where the wait had to block for it,
  // nothing where it had already completed.
  std::optional<std::chrono::steady_clock::time_point> wait(uint64_t n);
  // When the latest record completed (the stream thread's clock reading as it
  // reached it); false while it has not.
  bool completed_at(std::chrono::steady_clock::time_point& when);

 private:
  uint64_t recorded_ = 0;  // touched by the host thread only
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t completed_ = 0;
  std::chrono::steady_clock::time_point completed_at_{};
};

struct Task {
  enum class Kind : uint8_t { kernel, copy, record, wait };
  Kind kind = Kind::copy;
  // kernel
  kern::KernelFn fn = nullptr;
  const kern::KernelArgs* args = nullptr;
  const char* op = nullptr;
  const char* variant = nullptr;
  // copy
  void* dst = nullptr;
  const void* src = nullptr;
  size_t n = 0;
  double link_seconds = 0;  // an emulated link: the copy takes at least this long
  // record / wait
  EventState* event = nullptr;
  uint64_t count = 0;
};

class StreamWorker {
 public:
  StreamWorker(const char* name, size_t capacity);
  ~StreamWorker();  // runs what is queued, then joins the thread
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Blocks while the ring is full; never allocates.
  void push(const Task& t);
  // Blocks until everything pushed so far ran. Throws the first error a task
  // raised since the last sync as pooch::Error, and clears it.
  void sync();

  const char* name() const { return name_; }
  size_t capacity() const { return ring_.size(); }

 private:
  void run();
  void execute(const Task& t);
  void fail(const Task& t, pooch_status code, const char* what);

  const char* name_;
  std::vector<Task> ring_;
  size_t head_ = 0;  // next task to run
  size_t count_ = 0;
  uint64_t pushed_ = 0;
  uint64_t finished_ = 0;
  // The smallest `finished_` a sync waits for (UINT64_MAX: none). The worker
  // wakes the syncing threads when it gets there, not after every task: a
  // host woken after each of a step's small kernels only to sleep again
  // cost two context switches a kernel (16 a step for a Debtags member).
  uint64_t wake_at_ = UINT64_MAX;
  bool stopping_ = false;
  // The first failure since the last sync. While it is pending, kernels and
  // copies are skipped (they would work on garbage) but event records and
  // waits still run, so other streams and the host never hang on this one.
  bool failed_ = false;
  pooch_status error_code_ = POOCH_OK;
  std::string error_message_;

  // The emulated link, as a copy engine's queue: a copy that follows another
  // (or a wait that blocked) with no break starts when the link became free,
  // not when this thread woke. A real link moves back-to-back copies without
  // the host's help; this thread's wake-ups beside kernel threads that take
  // every core came late (57-87 us a sleep on average in bench/ooc's VGG-16
  // runs, on a link emulated at 68 us a copy), and each late wake-up delayed
  // every copy queued behind it. Touched by the worker thread only.
  bool link_busy_ = false;  // copies ran without a break up to link_free_
  std::chrono::steady_clock::time_point link_free_{};

  std::mutex mu_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::condition_variable progressed_;
  std::thread thread_;
};

}  // namespace pooch::cpu
