// The one interface every device implements (ggml-backend in spirit): a fixed
// arena and a host pool, three streams with events, async copies and kernel
// dispatch. The executor only ever talks to this interface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "../../kernels/common/kernel_abi.h"

namespace pooch {

// Work on one stream runs in order; work on different streams is ordered only
// through events.
enum class Stream : uint8_t { compute = 0, d2h = 1, h2d = 2 };
inline constexpr int kNumStreams = 3;

using EventId = int32_t;

struct BackendCaps {
  bool async_copies = true;     // copies overlap compute
  bool host_is_device = false;  // device pointers are host pointers (the CPU backend)
  size_t alignment = 256;       // arena offsets are multiples of this
};

struct MemoryInfo {
  size_t total = 0;        // device memory in all
  size_t free = 0;         // device memory free now
  size_t budget = 0;       // what this backend may use for its arena
  size_t arena_bytes = 0;  // what the arena took
  size_t host_pool_bytes = 0;
  bool host_pool_pinned = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual BackendCaps caps() const = 0;
  virtual MemoryInfo memory_info() const = 0;

  // Takes the one device buffer. Throws Error(POOCH_ERR_OUT_OF_BUDGET) naming
  // both sizes when `bytes` exceeds the budget. May be called once.
  virtual void arena_reserve(size_t bytes) = 0;
  virtual std::byte* arena_base() const = 0;
  // Takes the host (pinned where possible) pool used for swaps and staging.
  virtual void host_pool_reserve(size_t bytes) = 0;
  virtual std::byte* host_pool_base() const = 0;

  // Events are created while planning, never during a step.
  virtual EventId event_create() = 0;
  // The event completes when `s` reaches this point.
  virtual void event_record(Stream s, EventId e) = 0;
  // Work queued on `s` after this waits for the event's latest record.
  virtual void stream_wait(Stream s, EventId e) = 0;
  // Host blocks until the event's latest record completed.
  virtual void event_sync(EventId e) = 0;
  // An event that also notes when it completes, for event_elapsed: the
  // profiler's. (On CUDA, timing costs a little at every record, so the
  // events that only order streams are created without it.)
  virtual EventId event_create_timed() = 0;
  // Seconds from the completion of `from`'s latest record to that of `to`'s,
  // on the device's clock: both timed events, both completed (after a sync).
  virtual double event_elapsed(EventId from, EventId to) = 0;

  // Queues a copy of n bytes; either side may be arena or host pool memory.
  virtual void copy_async(Stream s, void* dst, const void* src, size_t n) = 0;
  // Queues a kernel. `args` must stay valid until the stream has run it.
  virtual void launch(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) = 0;
  // Host blocks until everything queued on `s` ran; rethrows the first error
  // any queued work raised.
  virtual void stream_sync(Stream s) = 0;
  // Every stream, then rethrows the first error: stopping at a failed stream
  // would leave the others' copies running into memory the caller reads next.
  void sync_all();

  // Of a device budget, the bytes this backend takes beside the arena (the
  // CUDA backend: cuBLAS's workspace): the arena is planned in the rest.
  virtual size_t kept_from_budget() const { return 0; }

  // A rough roofline of the device, before anything is measured: the
  // session's first estimate of each node's time (a measured step replaces
  // it). The default is the CPU's long-standing guess.
  struct Roofline {
    double flops_per_second = 20e9;
    double bytes_per_second = 10e9;
    // How many times faster than flops_per_second compute may run: the
    // session judges its paging choices at both (Session, judged_slowdown).
    // The CPU's placeholder ran 8 times slow on the 2-core development
    // machine.
    double faster_by = 10;
  };
  virtual Roofline nominal_roofline() const { return {}; }
  // Seconds of compute a copy of one byte takes from the kernels running
  // beside it: 0 where copies run on engines of their own (a GPU's DMA),
  // what a memcpy costs where threads on the kernels' cores make them (the
  // CPU backend, when its kernels use every core). The simulator charges it
  // to the compute stream (LinkModel::compute_seconds_per_byte).
  virtual double copy_compute_seconds_per_byte() const { return 0; }

  // What kernels are told about the device when they are planned
  // (KernelArgs::device): null on the CPU, the CUDA launch environment there.
  virtual const void* kernel_device() const { return nullptr; }

  // This backend's kernels, fastest first within each op.
  virtual std::span<const kern::KernelVariant> kernels() const = 0;
  // Kernels that run on the host, on host pool memory, queued in a stream's
  // order (an optimizer update where the optimizer state lives, as
  // ZeRO-Offload runs it). Empty: this backend runs none.
  virtual std::span<const kern::KernelVariant> host_kernels() const { return {}; }
  // Queues one of host_kernels() on `s`: it runs on the host after the work
  // queued on `s` before it, and work queued after it waits for it. Its
  // operands point into the host pool. `args` must stay valid until the
  // stream has run it. Throws Error(POOCH_ERR_UNSUPPORTED) where there are none.
  virtual void launch_host(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args);
  // The first kernel for `op` (with `variant` if given; deterministic ones if
  // asked). Null when this backend has none: the caller reports "not supported".
  const kern::KernelVariant* find_kernel(std::string_view op, std::string_view variant = {},
                                         bool deterministic_only = false) const;
};

struct CpuBackendParams {
  size_t device_budget = 0;  // 0: no limit but host memory
  int threads = 0;           // kernel threads; 0: all cores
  // An emulated link between the "device" arena and host memory, so that
  // overlap and the simulator are tested without a GPU: a copy that crosses
  // it takes at least link_latency + bytes / link_bandwidth seconds (each
  // way). 0: copies run at memcpy speed.
  double link_bandwidth = 0;  // bytes per second
  double link_latency = 0;    // seconds
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendParams& p);

}  // namespace pooch
