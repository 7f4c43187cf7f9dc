#include "executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../core/error.h"

namespace pooch {

Executor::Executor(Backend& backend, size_t arena_bytes, size_t host_bytes)
    : backend_(backend), arena_bytes_(arena_bytes), host_bytes_(host_bytes) {
  const size_t align = backend.caps().alignment;
  backend.arena_reserve(std::max(arena_bytes, align));
  backend.host_pool_reserve(std::max(host_bytes, align));
  std::memset(backend.host_pool_base(), 0, host_bytes);
}

Executor::~Executor() {
  try {
    backend_.sync_all();
  } catch (...) {
    // A destructor must not throw; the error was reported by the run that raised it.
  }
}

BoundSchedule Executor::bind(const Schedule& s, const kern::KernelContext* ctx) {
  if (s.arena_bytes > arena_bytes_ || s.host_bytes > host_bytes_)
    throw Error(POOCH_ERR_OUT_OF_BUDGET,
                fmt::format("the program needs an arena of {} bytes and a host pool of {}; the "
                            "session reserved {} and {}",
                            s.arena_bytes, s.host_bytes, arena_bytes_, host_bytes_));
  BoundSchedule b;
  b.schedule = &s;
  std::byte* base = backend_.arena_base();
  b.args.reserve(s.launches.size());
  std::byte* host = backend_.host_pool_base();
  for (const Launch& l : s.launches) {
    kern::KernelArgs a = l.args;
    std::byte* at = l.on_host ? host : base;  // a host kernel's operands are in the host pool
    for (int j = 0; j < a.n_in; ++j) a.in[j].data = at + l.in_offset[j];
    for (int j = 0; j < a.n_out; ++j) a.out[j].data = at + l.out_offset[j];
    a.workspace = l.workspace_offset == kUnplaced ? nullptr : at + l.workspace_offset;
    a.ctx = ctx;
    b.args.push_back(a);
  }
  for (int e = 0; e < s.events; ++e) b.events.push_back(backend_.event_create());
  return b;
}

void Executor::step(const BoundSchedule& b, const ScheduleStep& st) {
  const Schedule& s = *b.schedule;
  std::byte* base = backend_.arena_base();
  std::byte* host = backend_.host_pool_base();
  switch (st.kind) {
    case StepKind::launch: {
      const auto i = static_cast<size_t>(st.index);
      if (s.launches[i].on_host)
        backend_.launch_host(st.stream, *s.launches[i].kernel, b.args[i]);
      else
        backend_.launch(st.stream, *s.launches[i].kernel, b.args[i]);
      break;
    }
    case StepKind::copy_in: {
      const ScheduledCopy& c = s.copies[static_cast<size_t>(st.index)];
      backend_.copy_async(st.stream, base + c.device_offset, host + c.host_offset, c.bytes);
      break;
    }
    case StepKind::copy_out: {
      const ScheduledCopy& c = s.copies[static_cast<size_t>(st.index)];
      backend_.copy_async(st.stream, host + c.host_offset, base + c.device_offset, c.bytes);
      break;
    }
    case StepKind::record:
      backend_.event_record(st.stream, b.events[static_cast<size_t>(st.index)]);
      break;
    case StepKind::wait:
      backend_.stream_wait(st.stream, b.events[static_cast<size_t>(st.index)]);
      break;
  }
}

namespace {
// Runs `queue`; where it throws, first waits for every stream (a copy still
// running would write into the host pool or the arena after the caller has
// moved on: backend.h, sync_all), then passes the error on.
template <class F>
void settled(Backend& backend, F&& queue) {
  try {
    queue();
  } catch (...) {
    try {
      backend.sync_all();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
}
}  // namespace

void Executor::run(const BoundSchedule& b) {
  settled(backend_, [&] {
    for (const ScheduleStep& st : b.schedule->steps) step(b, st);
  });
  backend_.sync_all();
}

StepTimes Executor::run_timed(const BoundSchedule& b) {
  const Schedule& s = *b.schedule;
  StepTimes t;
  t.launch_seconds.assign(s.launches.size(), 0);
  t.copy_seconds.assign(s.copies.size(), 0);
  // Every launch and copy runs between two timed events of its own on its
  // stream, queued as in a step and read at the end. A launch's start event
  // completes when the stream reaches it: where the host queues ahead of the
  // device, that is when the launch before it ends, so the time is the
  // kernel's own; where the device waits for the host, the wait is in it, as
  // it is in a step. Timing a launch at a time instead (waiting for each)
  // put the host's launcher in every launch's time on a GPU: GPT-2 124M's
  // timed steps took 0.59-0.63 s on an H200 against 0.318 s untimed. Copies
  // run beside the launches, as in a step: waiting for every copy left the
  // cores idle before most launches of a plan that swaps (the emulated link
  // sleeps), and a launch after an idle gap ran slower than in a step (on the
  // CPU backend ResNet-50's swap-all session profiled its nodes at 94-99 ms a
  // step against 70.5 ms in core, and plans made from such profiles
  // simulated up to 23% over their steps).
  // Launch i's events are launch_timers_[2i] and [2i + 1]; copy i's are
  // copy_timers_[2i] and [2i + 1].
  const auto grow = [&](std::vector<EventId>& timers, size_t n) {
    while (timers.size() < 2 * n) timers.push_back(backend_.event_create_timed());
  };
  grow(launch_timers_, s.launches.size());
  grow(copy_timers_, s.copies.size());
  const auto timers_of = [&](const ScheduleStep& st) -> std::vector<EventId>* {
    if (st.kind == StepKind::launch) return &launch_timers_;
    if (st.kind == StepKind::copy_in || st.kind == StepKind::copy_out) return &copy_timers_;
    return nullptr;
  };
  settled(backend_, [&] {
    for (const ScheduleStep& st : s.steps) {
      std::vector<EventId>* timers = timers_of(st);
      if (!timers) {
        step(b, st);
        continue;
      }
      const auto k = 2 * static_cast<size_t>(st.index);
      backend_.event_record(st.stream, (*timers)[k]);
      step(b, st);
      backend_.event_record(st.stream, (*timers)[k + 1]);
    }
  });
  backend_.sync_all();
  for (const ScheduleStep& st : s.steps) {
    const std::vector<EventId>* timers = timers_of(st);
    if (!timers) continue;
    const auto i = static_cast<size_t>(st.index);
    std::vector<double>& out = st.kind == StepKind::launch ? t.launch_seconds : t.copy_seconds;
    out[i] = backend_.event_elapsed((*timers)[2 * i], (*timers)[2 * i + 1]);
  }
  return t;
}

void Executor::write(size_t offset, const void* src, size_t bytes) {
  backend_.copy_async(Stream::h2d, backend_.arena_base() + offset, src, bytes);
  backend_.stream_sync(Stream::h2d);
}

void Executor::read(size_t offset, void* dst, size_t bytes) const {
  backend_.sync_all();
  backend_.copy_async(Stream::d2h, dst, backend_.arena_base() + offset, bytes);
  backend_.stream_sync(Stream::d2h);
}

const std::byte* Executor::host_view(size_t offset) const {
  if (!backend_.caps().host_is_device) return nullptr;
  backend_.sync_all();
  return backend_.arena_base() + offset;
}

}  // namespace pooch
