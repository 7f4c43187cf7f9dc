#include "stream_worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <thread>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "../../core/error.h"
#include "../denormals.h"

namespace pooch::cpu {

void EventState::complete(uint64_t n, std::optional<std::chrono::steady_clock::time_point> at) {
  const auto now = at ? *at : std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    if (n > completed_) {
      completed_ = n;
      completed_at_ = now;
    }
  }
  cv_.notify_all();
}

bool EventState::completed_at(std::chrono::steady_clock::time_point& when) {
  std::lock_guard lock(mu_);
  if (completed_ == 0 || completed_ < recorded_) return false;
  when = completed_at_;
  return true;
}

std::optional<std::chrono::steady_clock::time_point> EventState::wait(uint64_t n) {
  std::unique_lock lock(mu_);
  if (completed_ >= n) return std::nullopt;
  cv_.wait(lock, [&] { return completed_ >= n; });
  return completed_at_;
}

StreamWorker::StreamWorker(const char* name, size_t capacity)
    : name_(name), ring_(capacity == 0 ? 1 : capacity) {
  thread_ = std::thread([this] { run(); });
}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  not_empty_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamWorker::push(const Task& t) {
  {
    std::unique_lock lock(mu_);
    not_full_.wait(lock, [&] { return count_ < ring_.size(); });
    ring_[(head_ + count_) % ring_.size()] = t;
    ++count_;
    ++pushed_;
  }
  not_empty_.notify_one();
}

void StreamWorker::sync() {
  std::unique_lock lock(mu_);
  const uint64_t target = pushed_;
  while (finished_ < target) {
    // Every waiter registers again after each wake-up (the worker clears
    // wake_at_ when it wakes them), so the smallest target stands.
    wake_at_ = std::min(wake_at_, target);
    progressed_.wait(lock);
  }
  if (!failed_) return;
  failed_ = false;
  const pooch_status code = error_code_;
  std::string message = std::move(error_message_);
  error_message_.clear();
  throw Error(code, std::move(message));
}

void StreamWorker::run() {
  // Kernels run here, and the OpenMP teams they start inherit the mode.
  flush_denormals_on_this_thread();
#ifdef __linux__
  // The emulated link's sleeps end when the copy would (Linux's default
  // timer slack of 50 us let a 169 us sleep overshoot by 78 us, median of
  // 200 on the 2-core VM, 30 us with 1 ns of slack; bench/ooc's copies were
  // 90 us longer than the link they emulate). Only this thread's timed
  // sleeps change; its other waits have no timeout.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  for (;;) {
    Task t;
    bool skip = false;
    {
      std::unique_lock lock(mu_);
      if (count_ == 0) link_busy_ = false;  // the link idles until the next copy comes
      not_empty_.wait(lock, [&] { return count_ > 0 || stopping_; });
      if (count_ == 0) return;  // stopping and drained
      t = ring_[head_];
      head_ = (head_ + 1) % ring_.size();
      --count_;
      skip = failed_ && (t.kind == Task::Kind::kernel || t.kind == Task::Kind::copy);
    }
    not_full_.notify_one();
    if (!skip) execute(t);
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      ++finished_;
      if (finished_ >= wake_at_) {
        wake_at_ = UINT64_MAX;
        wake = true;
      }
    }
    if (wake) progressed_.notify_all();
  }
}

void StreamWorker::execute(const Task& t) {
  try {
    switch (t.kind) {
      case Task::Kind::kernel:
        t.fn(*t.args);
        link_busy_ = false;
        break;
      case Task::Kind::copy: {
        using Clock = std::chrono::steady_clock;
        const Clock::time_point now = Clock::now();
        const Clock::time_point start = link_busy_ ? std::min(link_free_, now) : now;
        if (t.n != 0) std::memcpy(t.dst, t.src, t.n);
        if (t.link_seconds <= 0) {
          link_busy_ = false;  // not over the link: it idled meanwhile
          break;
        }
        // The emulated link sleeps (never spins) for the rest of the copy's
        // time, and is free again when the copy would end, however late this
        // thread wakes (or when the memcpy ends, where it took longer).
        const Clock::time_point end = start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::duration<double>(t.link_seconds));
        const Clock::time_point copied = Clock::now();
        if (copied < end) std::this_thread::sleep_until(end);
        link_free_ = std::max(end, copied);
        link_busy_ = true;
        break;
      }
      case Task::Kind::record:
        // Behind a copy (or a wait that blocked) the stream reached the record
        // when the link was free again (the device's clock), however late
        // this thread woke: a copy's two events then span its link time.
        t.event->complete(t.count, link_busy_ ? std::optional(link_free_) : std::nullopt);
        break;
      case Task::Kind::wait:
        // A copy behind a wait that blocked could start when the event
        // completed, not when this thread woke to it.
        if (const auto completed = t.event->wait(t.count)) {
          link_free_ = link_busy_ ? std::max(link_free_, *completed) : *completed;
          link_busy_ = true;
        }
        break;
    }
  } catch (const Error& e) {
    fail(t, e.code(), e.what());
  } catch (const std::bad_alloc&) {
    fail(t, POOCH_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    fail(t, POOCH_ERR_INTERNAL, e.what());
  } catch (...) {
    fail(t, POOCH_ERR_INTERNAL, "an exception that is not a std::exception");
  }
}

void StreamWorker::fail(const Task& t, pooch_status code, const char* what) {
  std::lock_guard lock(mu_);
  if (failed_) return;
  failed_ = true;
  error_code_ = code;
  try {
    if (t.kind == Task::Kind::kernel)
      error_message_ = std::string("kernel '") + (t.op ? t.op : "?") + "' (variant '" +
                       (t.variant ? t.variant : "?") + "') on the " + name_ +
                       " stream failed: " + what;
    else
      error_message_ = std::string("a task on the ") + name_ + " stream failed: " + what;
  } catch (...) {
    // Building the message itself ran out of memory; the code still tells.
    error_code_ = POOCH_ERR_OUT_OF_MEMORY;
  }
}

}  // namespace pooch::cpu
