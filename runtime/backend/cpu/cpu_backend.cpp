#include "cpu_backend.h"

#include <cblas.h>
#include <fmt/format.h>
#include <mimalloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "../../../kernels/common/util.h"
#include "../../../kernels/cpu/cpu_kernels.h"
#include "../../core/error.h"
#include "../denormals.h"

namespace pooch {

namespace cpu {

namespace {

constexpr size_t kAlignment = 256;

size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

// What the process's address-space limit (ulimit -v, RLIMIT_AS) still
// allows it to map; SIZE_MAX when there is no limit.
size_t address_space_left() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  unsigned long long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const long page = sysconf(_SC_PAGESIZE);
  const auto mapped = static_cast<unsigned long long>(pages) *
                      static_cast<unsigned long long>(page > 0 ? page : 4096);
  return rl.rlim_cur > mapped ? static_cast<size_t>(rl.rlim_cur - mapped) : 0;
}

// MemAvailable counts reclaimable page cache, which _SC_AVPHYS_PAGES misses;
// the latter is only the fallback where /proc is not mounted.
size_t system_available_memory() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f))
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return static_cast<size_t>(kib) * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

// What the system has free, and no more than the address-space limit leaves.
size_t available_memory() {
  return std::min(system_available_memory(), address_space_left());
}

const char* stream_name(int i) {
  static const char* const names[kNumStreams] = {"compute", "d2h", "h2d"};
  return names[i];
}

std::byte* take_host_memory(size_t bytes, const char* what, const char* fix) {
  // At least one byte, so that even an empty plan gets a base that is not null.
  void* p = mi_malloc_aligned(std::max<size_t>(bytes, 1), kAlignment);
  if (p == nullptr)
    throw Error(POOCH_ERR_OUT_OF_MEMORY,
                fmt::format("the cpu backend could not take {} bytes ({:.2f} MiB) of host memory "
                            "for its {}; {:.2f} MiB are available. Free host memory, or {}",
                            bytes, to_mib(bytes), what, to_mib(available_memory()), fix));
  return static_cast<std::byte*>(p);
}

// What one memcpy thread takes a byte: the fastest of three copies of
// 16 MiB (larger than the caches that would flatter it), measured once per
// process (about 10 ms).
double memcpy_seconds_per_byte() {
  static const double measured = [] {
    constexpr size_t kBytes = size_t{16} << 20;
    std::vector<std::byte> from(kBytes, std::byte{1}), to(kBytes);
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(to.data(), from.data(), kBytes);
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best / static_cast<double>(kBytes);
  }();
  return measured;
}

}  // namespace

// A copy is a memcpy by a stream thread; where the kernels' threads take
// every core it takes its time from them (bench/ooc: VGG-16's swap-all plans
// measured 3-10% slower than simulated with two kernel threads on two
// cores, 0-4% with one).
double CpuBackend::copy_compute_seconds_per_byte() const {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores != 0 && static_cast<unsigned>(threads_) < cores ? 0 : memcpy_seconds_per_byte();
}

size_t host_memory_available() {
  return available_memory();
}

CpuBackend::CpuBackend(const CpuBackendParams& p)
    : budget_(p.device_budget), link_bandwidth_(p.link_bandwidth), link_latency_(p.link_latency) {
  if (!(p.link_bandwidth >= 0) || !(p.link_latency >= 0))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend: link bandwidth {} and latency {} must not be negative",
                            p.link_bandwidth, p.link_latency));
  if (p.threads < 0)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend: threads is {}; pass a positive count, or 0 for all cores",
                            p.threads));
  threads_ = resolve_threads(p.threads);
  device_.threads = threads_;
  // OpenBLAS runs this many threads too (its pool grows to it on demand;
  // pooch-run starts it without one). OpenMP regions name theirs. Threads
  // it starts now inherit the flushing of denormals (denormals.h); the
  // caller's own mode is put back.
  {
    ScopedFlushDenormals flush;
    openblas_set_num_threads(threads_);
  }
  try {
    for (int i = 0; i < kNumStreams; ++i)
      streams_[i] = std::make_unique<StreamWorker>(stream_name(i), kStreamQueueCapacity);
  } catch (const std::system_error& e) {
    // pthread_create fails with EAGAIN when a thread's stack cannot be mapped.
    for (auto& s : streams_) s.reset();
    throw Error(POOCH_ERR_OUT_OF_MEMORY,
                fmt::format("the cpu backend could not start its copy and compute threads: {}; "
                            "{:.2f} MiB of host memory are available to this process",
                            e.what(), static_cast<double>(available_memory()) / kMiB));
  }
}

CpuBackend::~CpuBackend() {
  // Queued work may still touch the arena and the pool: the workers finish
  // and join before the memory goes back.
  for (auto& s : streams_) s.reset();
  mi_free(arena_);
  mi_free(pool_);
}

BackendCaps CpuBackend::caps() const {
  BackendCaps c;
  c.async_copies = true;
  c.host_is_device = true;
  c.alignment = kAlignment;
  return c;
}

MemoryInfo CpuBackend::memory_info() const {
  MemoryInfo m;
  m.total = physical_memory();
  m.free = available_memory();
  m.budget = budget_ != 0 ? budget_ : m.total;
  m.arena_bytes = arena_bytes_;
  m.host_pool_bytes = pool_bytes_;
  m.host_pool_pinned = false;
  return m;
}

void CpuBackend::arena_reserve(size_t bytes) {
  if (arena_reserved_)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend: the arena is already reserved ({} bytes) and a backend "
                            "takes it once; reserve the plan's peak a single time, or create a "
                            "new backend for a different size",
                            arena_bytes_));
  if (budget_ != 0 && bytes > budget_)
    throw OutOfBudget(
        bytes, fmt::format("the arena needs {} bytes ({} MiB) of device memory but the cpu "
                           "device budget is {} bytes ({:.2f} MiB); it needs a budget of at "
                           "least {} MiB",
                           bytes, mib_ceil(bytes), budget_, to_mib(budget_), mib_ceil(bytes)));
  arena_ = take_host_memory(bytes, "device arena",
                            "lower the device budget so the planner swaps more to the host pool");
  arena_bytes_ = bytes;
  arena_reserved_ = true;
}

void CpuBackend::host_pool_reserve(size_t bytes) {
  if (pool_reserved_)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend: the host pool is already reserved ({} bytes) and a "
                            "backend takes it once; reserve the planned size a single time",
                            pool_bytes_));
  pool_ = take_host_memory(bytes, "host pool",
                           "use a smaller batch size so fewer activations are swapped");
  pool_bytes_ = bytes;
  pool_reserved_ = true;
}

StreamWorker& CpuBackend::worker(Stream s, const char* call) {
  const int i = static_cast<int>(s);
  if (i < 0 || i >= kNumStreams)
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("cpu backend {}: stream {} does not exist (compute=0, d2h=1, h2d=2)", call, i));
  return *streams_[i];
}

EventState& CpuBackend::event(EventId e, const char* call) {
  if (e < 0 || static_cast<size_t>(e) >= events_.size())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend {}: event {} was never created ({} exist); create "
                            "events with event_create while planning",
                            call, e, events_.size()));
  return *events_[static_cast<size_t>(e)];
}

EventId CpuBackend::event_create() {
  events_.push_back(std::make_unique<EventState>());
  return static_cast<EventId>(events_.size() - 1);
}

void CpuBackend::event_record(Stream s, EventId e) {
  StreamWorker& w = worker(s, "event_record");
  EventState& ev = event(e, "event_record");
  Task t;
  t.kind = Task::Kind::record;
  t.event = &ev;
  t.count = ev.next_record();
  w.push(t);
}

void CpuBackend::stream_wait(Stream s, EventId e) {
  StreamWorker& w = worker(s, "stream_wait");
  EventState& ev = event(e, "stream_wait");
  // As with CUDA, waiting on an event nobody recorded yet waits for nothing.
  if (ev.recorded() == 0) return;
  Task t;
  t.kind = Task::Kind::wait;
  t.event = &ev;
  t.count = ev.recorded();
  w.push(t);
}

void CpuBackend::event_sync(EventId e) {
  EventState& ev = event(e, "event_sync");
  ev.wait(ev.recorded());
}

double CpuBackend::event_elapsed(EventId from, EventId to) {
  std::chrono::steady_clock::time_point a, b;
  if (!event(from, "event_elapsed").completed_at(a) || !event(to, "event_elapsed").completed_at(b))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend event_elapsed: event {} or {} has not completed its "
                            "latest record; synchronise first",
                            from, to));
  return std::chrono::duration<double>(b - a).count();
}

void CpuBackend::copy_async(Stream s, void* dst, const void* src, size_t n) {
  StreamWorker& w = worker(s, "copy_async");
  if (n != 0) {
    if (dst == nullptr || src == nullptr)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cpu backend copy_async: a copy of {} bytes on the {} stream has a "
                              "null {} pointer",
                              n, w.name(), dst == nullptr ? "destination" : "source"));
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto r = reinterpret_cast<uintptr_t>(src);
    if (d < r + n && r < d + n)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cpu backend copy_async: a copy of {} bytes on the {} stream has "
                              "overlapping source and destination",
                              n, w.name()));
  }
  Task t;
  t.kind = Task::Kind::copy;
  t.dst = dst;
  t.src = src;
  t.n = n;
  // A copy with exactly one side in the arena crosses the emulated link.
  auto in_arena = [&](const void* q) {
    const auto* b = static_cast<const std::byte*>(q);
    return arena_ && b >= arena_ && b < arena_ + arena_bytes_;
  };
  if ((link_bandwidth_ > 0 || link_latency_ > 0) && in_arena(dst) != in_arena(src))
    t.link_seconds =
        link_latency_ + (link_bandwidth_ > 0 ? static_cast<double>(n) / link_bandwidth_ : 0);
  w.push(t);
}

void CpuBackend::launch(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) {
  StreamWorker& w = worker(s, "launch");
  if (k.fn == nullptr)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cpu backend launch: kernel '{}' (variant '{}') has no function",
                            k.op ? k.op : "?", k.variant ? k.variant : "?"));
  Task t;
  t.kind = Task::Kind::kernel;
  t.fn = k.fn;
  t.args = &args;
  t.op = k.op;
  t.variant = k.variant;
  w.push(t);
}

void CpuBackend::stream_sync(Stream s) {
  worker(s, "stream_sync").sync();
}

std::span<const kern::KernelVariant> CpuBackend::kernels() const {
  return kern::cpu_kernels();
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendParams& p) {
  return std::make_unique<cpu::CpuBackend>(p);
}

}  // namespace pooch
