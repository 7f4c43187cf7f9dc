// The CPU backend: the reference every other backend is checked against and
// the machine the out-of-core engine is tested on. Its "device" is one arena
// with an enforced budget, its "host" a second pool, and its copies real
// memcpys on their own threads, so swap and prefetch overlap compute just as
// they do on a GPU.
#pragma once
#include <memory>
#include <vector>

#include "../backend.h"
#include "stream_worker.h"

namespace pooch::cpu {

// Tasks each stream holds before the host blocks; enough for a whole step of
// a large graph, so the host rarely waits on a full ring.
inline constexpr size_t kStreamQueueCapacity = 1024;

// Host memory this process can still take: what the system has available,
// and no more than its address-space limit (ulimit -v) leaves.
size_t host_memory_available();

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendParams& p);
  ~CpuBackend() override;

  const char* name() const override { return "cpu"; }
  double copy_compute_seconds_per_byte() const override;
  BackendCaps caps() const override;
  MemoryInfo memory_info() const override;

  void arena_reserve(size_t bytes) override;
  std::byte* arena_base() const override { return arena_; }
  void host_pool_reserve(size_t bytes) override;
  std::byte* host_pool_base() const override { return pool_; }

  EventId event_create() override;
  void event_record(Stream s, EventId e) override;
  void stream_wait(Stream s, EventId e) override;
  void event_sync(EventId e) override;
  EventId event_create_timed() override { return event_create(); }  // every event notes its time
  double event_elapsed(EventId from, EventId to) override;

  void copy_async(Stream s, void* dst, const void* src, size_t n) override;
  void launch(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) override;
  void stream_sync(Stream s) override;

  std::span<const kern::KernelVariant> kernels() const override;
  // The "device" is the host: host kernels are the same kernels, queued on
  // the stream's worker like any launch.
  std::span<const kern::KernelVariant> host_kernels() const override { return kernels(); }
  void launch_host(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) override {
    launch(s, k, args);
  }

  // Threads a kernel may use (what the executor puts in KernelContext).
  int threads() const { return threads_; }
  // The same count, for what kernels prepare at plan time.
  const void* kernel_device() const override { return &device_; }

 private:
  StreamWorker& worker(Stream s, const char* call);
  EventState& event(EventId e, const char* call);

  size_t budget_ = 0;
  int threads_ = 1;
  kern::CpuDevice device_;
  double link_bandwidth_ = 0, link_latency_ = 0;
  bool arena_reserved_ = false;
  std::byte* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  bool pool_reserved_ = false;
  std::byte* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  // Workers hold pointers into these, so they are declared first and
  // therefore outlive the workers.
  std::vector<std::unique_ptr<EventState>> events_;
  std::unique_ptr<StreamWorker> streams_[kNumStreams];
};

}  // namespace pooch::cpu
