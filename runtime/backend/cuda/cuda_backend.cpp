#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <new>
#include <system_error>
#include <vector>

#include "../../../kernels/common/util.h"
#include "../../../kernels/cpu/cpu_kernels.h"
#include "../../../kernels/cuda/cuda_kernels.h"
#include "../../../kernels/cuda/cuda_libs.h"
#include "../../core/error.h"
#include "../cpu/stream_worker.h"

#ifndef POOCH_CUDA_ARCHS
#define POOCH_CUDA_ARCHS "?"
#endif

// Every CUDA, cuBLAS and cuSPARSE call is checked; a failure becomes a
// pooch::Error naming the call and the library's error string. cuBLAS and
// cuSPARSE are called through the table of kernels/cuda/cuda_libs.h (loaded
// with dlopen): POOCH_CUBLAS_CHECK(cublasCreate, &h) calls
// cuda_libs().cublasCreate(&h).
#define POOCH_CUDA_CHECK(call) ::pooch::cuda::check_cuda((call), #call)
#define POOCH_CUBLAS_CHECK(fn, ...)                                             \
  ::pooch::cuda::check_cublas(::pooch::kern::cuda::cuda_libs().fn(__VA_ARGS__), \
                              #fn "(" #__VA_ARGS__ ")")
#define POOCH_CUSPARSE_CHECK(fn, ...)                                             \
  ::pooch::cuda::check_cusparse(::pooch::kern::cuda::cuda_libs().fn(__VA_ARGS__), \
                                #fn "(" #__VA_ARGS__ ")")

namespace pooch {
namespace cuda {

using kern::cuda::cuda_libs;

namespace {

constexpr size_t kAlignment = 256;
// Left free when the budget is taken from free memory: the CUDA context,
// library kernels and other processes need some.
constexpr size_t kMarginFixed = size_t{256} << 20;

std::string cuda_error(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
}

const char* stream_name(int i) {
  static const char* const names[kNumStreams] = {"compute", "d2h", "h2d"};
  return i >= 0 && i < kNumStreams ? names[i] : "?";
}

// The device's f32 roofline from its attributes, at the efficiencies that
// machines/*.json assume (60% of peak f32 for cuBLAS's training shapes, 80%
// of peak memory bandwidth): the planner's estimate until a step is
// measured. f32 lanes per multiprocessor: 64 on Volta, Turing and the A100
// (compute capability 7.x, 8.0), 128 from 8.6 on (Ampere's others, Ada,
// Hopper, Blackwell). The CPU's 20 GFLOP/s guess was 3000 times too slow
// for an H200, and out-of-core plans made from it swap what they should keep.
Backend::Roofline device_roofline(int device, const cudaDeviceProp& prop) {
  Backend::Roofline r;
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return r;  // the default guess: a measured step corrects it
  }
  const int lanes = prop.major < 8 || (prop.major == 8 && prop.minor == 0) ? 64 : 128;
  const double flops = 2.0 * lanes * prop.multiProcessorCount * clock_khz * 1e3;
  const double bytes = 2.0 * mem_khz * 1e3 * bus_bits / 8.0;  // double data rate
  if (flops > 0) r.flops_per_second = 0.6 * flops;
  if (bytes > 0) r.bytes_per_second = 0.8 * bytes;
  r.faster_by = 1 / 0.6;  // at most the card's peak
  return r;
}

}  // namespace

void check_cuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  throw Error(POOCH_ERR_INTERNAL, fmt::format("cuda backend: {} failed: {}", call, cuda_error(e)));
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(POOCH_ERR_INTERNAL, fmt::format("cuda backend: {} failed: {}", call,
                                              cuda_libs().cublasGetStatusString(s)));
}

void check_cusparse(cusparseStatus_t s, const char* call) {
  if (s == CUSPARSE_STATUS_SUCCESS) return;
  throw Error(POOCH_ERR_INTERNAL, fmt::format("cuda backend: {} failed: {}", call,
                                              cuda_libs().cusparseGetErrorString(s)));
}

// The first failure of work queued on one stream since its last sync.
struct Pending {
  bool failed = false;
  pooch_status code = POOCH_OK;
  std::string message;
};

// A host kernel queued with cudaLaunchHostFunc: what it runs, and what it
// raised (read after the stream is synchronised, never while it may run),
// with the code launch() would give a launcher's exception, as the CPU
// backend's stream threads keep a kernel's.
struct HostCall {
  const kern::KernelVariant* kernel = nullptr;
  kern::KernelArgs args;
  // Set by the first host kernel of its stream that fails; the later ones
  // then do not run, as on the CPU backend's stream threads (their inputs
  // may be what the failed one did not write). Cleared at the next sync.
  // Unlike there, device launches and copies queued on the stream behind it
  // still run (they were queued before the failure was known); the error
  // surfaces at the next sync all the same.
  std::atomic<bool>* stream_failed = nullptr;
  // The thread the kernel runs on (its stream's): pooch's own, flushing
  // denormals, whose OpenMP teams inherit that; not the CUDA runtime's
  // thread, whose OpenMP team an application's own host functions may have
  // started, in their floating-point mode (and would find in ours after).
  cpu::StreamWorker* worker = nullptr;
  bool failed = false;  // false: it ran, or has not yet
  pooch_status code = POOCH_OK;
  std::string error;
};

// noexcept: an exception leaving a host function unwinds into the CUDA
// runtime's thread, which ends the process (std::terminate). It hands the
// kernel to its worker and waits (a host function may block; it must not
// call CUDA, and neither do the host kernels).
void CUDART_CB run_host_call(void* p) noexcept {
  auto* c = static_cast<HostCall*>(p);
  if (c->stream_failed->load(std::memory_order_acquire)) return;  // an earlier one failed
  const auto raised = [c](pooch_status code, const char* what) noexcept {
    c->stream_failed->store(true, std::memory_order_release);
    c->failed = true;
    c->code = code;
    try {
      c->error = what;
    } catch (...) {  // no memory for the message: the failure and its code still surface
    }
  };
  try {
    cpu::Task t;
    t.kind = cpu::Task::Kind::kernel;
    t.fn = c->kernel->fn;
    t.args = &c->args;
    t.op = c->kernel->op;
    t.variant = c->kernel->variant;
    c->worker->push(t);
    c->worker->sync();  // throws what the kernel raised
  } catch (const Error& e) {
    raised(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    raised(POOCH_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    raised(POOCH_ERR_INTERNAL, e.what());
  } catch (...) {
    raised(POOCH_ERR_INTERNAL, "an exception that is not a std::exception");
  }
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendParams& p);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
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
  EventId event_create_timed() override { return create_event(cudaEventBlockingSync); }
  double event_elapsed(EventId from, EventId to) override;

  void copy_async(Stream s, void* dst, const void* src, size_t n) override;
  void launch(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) override;
  void stream_sync(Stream s) override;

  std::span<const kern::KernelVariant> kernels() const override;
  // The CPU kernels, on pinned (or pageable) host pool memory.
  std::span<const kern::KernelVariant> host_kernels() const override { return kern::cpu_kernels(); }
  void launch_host(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) override;
  // The launch environment: its device and library handles, for the
  // kernels' workspace and supports queries while planning.
  const void* kernel_device() const override { return &env_; }
  Roofline nominal_roofline() const override { return roofline_; }
  size_t kept_from_budget() const override { return cublas_ws_; }

 private:
  void release() noexcept;
  void bind() const { POOCH_CUDA_CHECK(cudaSetDevice(device_)); }
  int index(Stream s, const char* call) const;
  cudaEvent_t event(EventId e, const char* call) const;
  EventId create_event(unsigned flags);
  cudaError_t wait_for(int stream) noexcept;
  void fail(int stream, pooch_status code, std::string message);
  void warn(const std::string& message) const;
  size_t arena_limit() const { return budget_ > cublas_ws_ ? budget_ - cublas_ws_ : 0; }

  int device_ = 0;
  std::string device_name_;
  Roofline roofline_;
  size_t budget_ = 0;
  bool budget_from_free_ = false;
  size_t cublas_ws_ = 0;  // cuBLAS workspace, allocated with the arena, after it
  int threads_ = 1;
  void (*warn_)(void* user, const char* line) = nullptr;
  void* warn_user_ = nullptr;

  bool arena_reserved_ = false;
  std::byte* arena_ = nullptr;          // the one cudaMalloc: arena, then cuBLAS's workspace
  std::byte* cublas_ws_ptr_ = nullptr;  // that workspace, inside the same allocation
  size_t arena_bytes_ = 0;
  bool pool_reserved_ = false;
  bool pool_pinned_ = false;
  std::byte* pool_ = nullptr;
  size_t pool_bytes_ = 0;

  cudaStream_t streams_[kNumStreams] = {};
  // stream_sync's: recorded on its stream, then waited on. Created with
  // cudaEventBlockingSync, as every event here, so that a waiting thread
  // sleeps: cudaStreamSynchronize (and a plain event's wait) spins a core
  // for the whole wait under the runtime's default scheduling
  // (cudaDeviceScheduleAuto spins while there are fewer CUDA contexts than
  // cores), and pooch never spins a host application's cores. The
  // device-wide cudaDeviceScheduleBlockingSync would change the
  // application's own CUDA work too.
  cudaEvent_t sync_[kNumStreams] = {};
  Pending pending_[kNumStreams];
  std::vector<cudaEvent_t> events_;
  cublasHandle_t cublas_ = nullptr;
  cusparseHandle_t cusparse_ = nullptr;
  int bound_stream_ = 0;  // the stream both handles are bound to
  // Recorded on the old stream when the handles move to another one (see
  // launch): cuBLAS's one workspace is then never in use on two streams.
  cudaEvent_t rebind_ = nullptr;
  kern::cuda::LaunchEnv env_;
  // Host kernels queued per stream since its last synchronisation.
  std::deque<std::unique_ptr<HostCall>> host_calls_[kNumStreams];
  std::atomic<bool> host_failed_[kNumStreams] = {};  // HostCall::stream_failed
  // Where each stream's host kernels run (HostCall::worker): started at its
  // first host kernel; a stream's host functions run one at a time, so each
  // worker has one producer.
  std::unique_ptr<cpu::StreamWorker> host_workers_[kNumStreams];
};

CudaBackend::CudaBackend(const CudaBackendParams& p)
    : device_(p.device), budget_(p.device_budget), warn_(p.warn), warn_user_(p.warn_user) {
  if (p.threads < 0)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend: threads is {}; pass a positive count, or 0 for all "
                            "cores",
                            p.threads));
  threads_ = resolve_threads(p.threads);
  // make_cuda_backend loaded cuBLAS and cuSPARSE already (cuda_device_available).
  if (std::string why; !kern::cuda::load_cuda_libs(&why))
    throw Error(POOCH_ERR_NO_DEVICE, fmt::format("the CUDA backend is not available: {}", why));
  try {
    bind();
    cudaDeviceProp prop{};
    POOCH_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    // NVIDIA's recommendation for cuBLAS's workspace: 32 MiB on Hopper and
    // newer, 4 MiB before.
    cublas_ws_ = prop.major >= 9 ? size_t{32} << 20 : size_t{4} << 20;
    for (cudaStream_t& s : streams_)
      POOCH_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (cudaEvent_t& e : sync_)
      POOCH_CUDA_CHECK(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    POOCH_CUBLAS_CHECK(cublasCreate, &cublas_);
    POOCH_CUBLAS_CHECK(cublasSetStream, cublas_, streams_[0]);
    POOCH_CUBLAS_CHECK(cublasSetPointerMode, cublas_, CUBLAS_POINTER_MODE_HOST);
    // Full f32 GEMMs (no TF32): the kernels are checked against f64 references.
    POOCH_CUBLAS_CHECK(cublasSetMathMode, cublas_, CUBLAS_DEFAULT_MATH);
    POOCH_CUSPARSE_CHECK(cusparseCreate, &cusparse_);
    POOCH_CUSPARSE_CHECK(cusparseSetStream, cusparse_, streams_[0]);
    POOCH_CUDA_CHECK(cudaEventCreateWithFlags(&rebind_, cudaEventDisableTiming));
    if (budget_ == 0) {
      size_t free = 0, total = 0;
      POOCH_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      const size_t margin = kMarginFixed + total / 100;
      budget_ = free > margin ? free - margin : 0;
      budget_from_free_ = true;
    }
    env_.cublas = cublas_;
    env_.cusparse = cusparse_;
    env_.device = device_;
    env_.sm_count = prop.multiProcessorCount;
    roofline_ = device_roofline(device_, prop);
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  release();
}

void CudaBackend::release() noexcept {
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  // Queued work may still touch the arena and the pool: it finishes first.
  // Errors are ignored here; they were (or can no longer be) reported.
  for (int i = 0; i < kNumStreams; ++i)
    if (streams_[i]) (void)wait_for(i);
  if (cusparse_) (void)cuda_libs().cusparseDestroy(cusparse_);
  if (cublas_) (void)cuda_libs().cublasDestroy(cublas_);
  cusparse_ = nullptr;
  cublas_ = nullptr;
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  events_.clear();
  if (rebind_) (void)cudaEventDestroy(rebind_);
  rebind_ = nullptr;
  for (cudaEvent_t& e : sync_) {
    if (e) (void)cudaEventDestroy(e);
    e = nullptr;
  }
  for (cudaStream_t& s : streams_) {
    if (s) (void)cudaStreamDestroy(s);
    s = nullptr;
  }
  if (arena_) (void)cudaFree(arena_);
  arena_ = nullptr;
  cublas_ws_ptr_ = nullptr;
  if (pool_) {
    if (pool_pinned_)
      (void)cudaFreeHost(pool_);
    else
      std::free(pool_);
  }
  pool_ = nullptr;
  (void)cudaGetLastError();
}

void CudaBackend::warn(const std::string& message) const {
  if (warn_)
    warn_(warn_user_, ("warning: " + message).c_str());
  else
    std::fprintf(stderr, "pooch: warning: %s\n", message.c_str());
}

BackendCaps CudaBackend::caps() const {
  BackendCaps c;
  c.async_copies = true;
  c.host_is_device = false;
  c.alignment = kAlignment;
  return c;
}

MemoryInfo CudaBackend::memory_info() const {
  bind();
  MemoryInfo m;
  POOCH_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  m.budget = arena_limit();
  m.arena_bytes = arena_bytes_;
  m.host_pool_bytes = pool_bytes_;
  m.host_pool_pinned = pool_pinned_;
  return m;
}

void CudaBackend::arena_reserve(size_t bytes) {
  if (arena_reserved_)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend: the arena is already reserved ({} bytes) and a backend "
                            "takes it once; reserve the plan's peak a single time, or create a "
                            "new backend for a different size",
                            arena_bytes_));
  const size_t limit = arena_limit();
  if (bytes > limit)
    throw OutOfBudget(
        bytes + cublas_ws_,
        fmt::format("the arena needs {} bytes ({} MiB) of device memory but the cuda device "
                    "budget leaves {} bytes ({:.2f} MiB) for it ({} budget {:.2f} MiB, less "
                    "{} MiB for cuBLAS's workspace); it needs a budget of at least {} MiB{}",
                    bytes, mib_ceil(bytes), limit, to_mib(limit),
                    budget_from_free_ ? "the free memory's" : "a", to_mib(budget_),
                    cublas_ws_ >> 20, mib_ceil(bytes + cublas_ws_),
                    budget_from_free_ ? ", more than the device has free: free device memory "
                                        "(other processes hold some), or lower the batch size so "
                                        "the planner needs less"
                                      : ""));
  bind();
  const size_t arena_part = align_up(std::max<size_t>(bytes, 1), kAlignment);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, arena_part + cublas_ws_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
    throw Error(
        POOCH_ERR_OUT_OF_BUDGET,
        fmt::format("cuda backend: cudaMalloc of {} bytes ({:.2f} MiB: the arena and "
                    "{} MiB for cuBLAS) on {} failed: {}; {:.2f} MiB of {:.2f} MiB are "
                    "free. Free device memory, or lower the device budget so the planner "
                    "swaps more to the host",
                    arena_part + cublas_ws_, to_mib(arena_part + cublas_ws_), cublas_ws_ >> 20,
                    device_name_, cuda_error(e), to_mib(free), to_mib(total)));
  }
  arena_ = static_cast<std::byte*>(p);
  try {
    POOCH_CUBLAS_CHECK(cublasSetWorkspace, cublas_, arena_ + arena_part, cublas_ws_);
  } catch (...) {
    (void)cudaFree(arena_);
    arena_ = nullptr;
    throw;
  }
  cublas_ws_ptr_ = arena_ + arena_part;
  arena_bytes_ = bytes;
  arena_reserved_ = true;
}

void CudaBackend::host_pool_reserve(size_t bytes) {
  if (pool_reserved_)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend: the host pool is already reserved ({} bytes) and a "
                            "backend takes it once; reserve the planned size a single time",
                            pool_bytes_));
  bind();
  // At least one byte, so that even an empty plan gets a base that is not null.
  const size_t n = align_up(std::max<size_t>(bytes, 1), kAlignment);
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable);
  if (e == cudaSuccess) {
    pool_pinned_ = true;
  } else {
    (void)cudaGetLastError();
    warn(
        fmt::format("cuda backend: pinning {:.2f} MiB of host memory for the host pool failed "
                    "({}); using pageable memory, so copies to and from the device will be "
                    "slower and will not overlap compute. Raise the locked-memory limit "
                    "(ulimit -l) or free host memory",
                    to_mib(n), cuda_error(e)));
    p = std::aligned_alloc(kAlignment, n);
    if (p == nullptr)
      throw Error(POOCH_ERR_OUT_OF_MEMORY,
                  fmt::format("the cuda backend could not take {} bytes ({:.2f} MiB) of host "
                              "memory for its host pool. Free host memory, or use a smaller "
                              "batch size so fewer activations are swapped",
                              n, to_mib(n)));
    pool_pinned_ = false;
  }
  pool_ = static_cast<std::byte*>(p);
  pool_bytes_ = bytes;
  pool_reserved_ = true;
}

int CudaBackend::index(Stream s, const char* call) const {
  const int i = static_cast<int>(s);
  if (i < 0 || i >= kNumStreams)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend {}: stream {} does not exist (compute=0, d2h=1, h2d=2)",
                            call, i));
  return i;
}

cudaEvent_t CudaBackend::event(EventId e, const char* call) const {
  if (e < 0 || static_cast<size_t>(e) >= events_.size())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend {}: event {} was never created ({} exist); create "
                            "events with event_create while planning",
                            call, e, events_.size()));
  return events_[static_cast<size_t>(e)];
}

void CudaBackend::fail(int stream, pooch_status code, std::string message) {
  Pending& p = pending_[stream];
  if (p.failed) return;
  p.failed = true;
  p.code = code;
  p.message = std::move(message);
}

EventId CudaBackend::event_create() {
  return create_event(cudaEventDisableTiming | cudaEventBlockingSync);
}

EventId CudaBackend::create_event(unsigned flags) {
  bind();
  cudaEvent_t e = nullptr;
  POOCH_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  try {
    events_.push_back(e);
  } catch (...) {
    (void)cudaEventDestroy(e);
    throw;
  }
  return static_cast<EventId>(events_.size() - 1);
}

// Records and waits go through even while a stream has a pending failure, so
// other streams and the host never wait on a record that was skipped.
void CudaBackend::event_record(Stream s, EventId e) {
  const int i = index(s, "event_record");
  const cudaEvent_t ev = event(e, "event_record");
  bind();
  const cudaError_t err = cudaEventRecord(ev, streams_[i]);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(i, POOCH_ERR_INTERNAL,
         fmt::format("cudaEventRecord(event {}) on the {} stream failed: {}", e, stream_name(i),
                     cuda_error(err)));
  }
}

void CudaBackend::stream_wait(Stream s, EventId e) {
  const int i = index(s, "stream_wait");
  const cudaEvent_t ev = event(e, "stream_wait");
  bind();
  // As on the CPU backend, an event nobody recorded yet waits for nothing.
  const cudaError_t err = cudaStreamWaitEvent(streams_[i], ev, 0);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(i, POOCH_ERR_INTERNAL,
         fmt::format("cudaStreamWaitEvent(event {}) on the {} stream failed: {}", e, stream_name(i),
                     cuda_error(err)));
  }
}

void CudaBackend::event_sync(EventId e) {
  const cudaEvent_t ev = event(e, "event_sync");
  bind();
  const cudaError_t err = cudaEventSynchronize(ev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(POOCH_ERR_INTERNAL,
                fmt::format("cuda backend: cudaEventSynchronize(event {}) failed: {}; work "
                            "queued before the event's record failed",
                            e, cuda_error(err)));
  }
}

double CudaBackend::event_elapsed(EventId from, EventId to) {
  const cudaEvent_t a = event(from, "event_elapsed"), b = event(to, "event_elapsed");
  bind();
  float ms = 0;
  const cudaError_t err = cudaEventElapsedTime(&ms, a, b);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(err == cudaErrorNotReady ? POOCH_ERR_INVALID_ARG : POOCH_ERR_INTERNAL,
                fmt::format("cuda backend: cudaEventElapsedTime(event {}, event {}) failed: {}; "
                            "both must be timed events (event_create_timed) whose records "
                            "completed",
                            from, to, cuda_error(err)));
  }
  return ms * 1e-3;
}

void CudaBackend::copy_async(Stream s, void* dst, const void* src, size_t n) {
  const int i = index(s, "copy_async");
  if (n != 0) {
    if (dst == nullptr || src == nullptr)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cuda backend copy_async: a copy of {} bytes on the {} stream has a "
                              "null {} pointer",
                              n, stream_name(i), dst == nullptr ? "destination" : "source"));
    // Unified addressing: device and host pointers share one address space.
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto r = reinterpret_cast<uintptr_t>(src);
    if (d < r + n && r < d + n)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cuda backend copy_async: a copy of {} bytes on the {} stream has "
                              "overlapping source and destination",
                              n, stream_name(i)));
  }
  if (n == 0 || pending_[i].failed) return;
  bind();
  // From a pageable pool the driver may read the source as the call is made,
  // before this stream's earlier waits are met (a host kernel's output, which
  // it writes later on CUDA's own thread): the stream finishes first.
  // Pinned memory is read in stream order.
  const auto* from = static_cast<const std::byte*>(src);
  if (!pool_pinned_ && pool_ && from >= pool_ && from < pool_ + pool_bytes_) stream_sync(s);
  const cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, streams_[i]);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(i, POOCH_ERR_INTERNAL,
         fmt::format("a task on the {} stream failed: cudaMemcpyAsync({} bytes) failed: {}",
                     stream_name(i), n, cuda_error(err)));
  }
}

void CudaBackend::launch(Stream s, const kern::KernelVariant& k, const kern::KernelArgs& args) {
  const int i = index(s, "launch");
  if (k.fn == nullptr)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cuda backend launch: kernel '{}' (variant '{}') has no function",
                            k.op ? k.op : "?", k.variant ? k.variant : "?"));
  if (pending_[i].failed) return;  // it would work on garbage
  bind();
  const auto where = [&] {
    return fmt::format("kernel '{}' (variant '{}') on the {} stream failed: ", k.op ? k.op : "?",
                       k.variant ? k.variant : "?", stream_name(i));
  };
  if (i != bound_stream_) {
    // cublasSetStream resets the handle to cuBLAS's own default workspace,
    // which cuBLAS would then cudaMalloc past the arena and the budget: the
    // arena's slice is set again. As both streams would share that slice,
    // the new stream first waits for the old one's work queued so far.
    const char* call = "cudaEventRecord";
    cudaError_t ce = cudaEventRecord(rebind_, streams_[bound_stream_]);
    if (ce == cudaSuccess) {
      call = "cudaStreamWaitEvent";
      ce = cudaStreamWaitEvent(streams_[i], rebind_, 0);
    }
    if (ce != cudaSuccess) {
      (void)cudaGetLastError();
      fail(i, POOCH_ERR_INTERNAL, where() + fmt::format("{}: {}", call, cuda_error(ce)));
      return;
    }
    const char* failed = nullptr;
    const kern::cuda::CudaLibs& lib = cuda_libs();
    cublasStatus_t bs = lib.cublasSetStream(cublas_, streams_[i]);
    if (bs != CUBLAS_STATUS_SUCCESS) failed = "cublasSetStream";
    if (!failed && cublas_ws_ptr_ != nullptr) {
      bs = lib.cublasSetWorkspace(cublas_, cublas_ws_ptr_, cublas_ws_);
      if (bs != CUBLAS_STATUS_SUCCESS) failed = "cublasSetWorkspace";
    }
    if (failed) {
      fail(i, POOCH_ERR_INTERNAL,
           where() + fmt::format("{}: {}", failed, lib.cublasGetStatusString(bs)));
      return;
    }
    const cusparseStatus_t ss = lib.cusparseSetStream(cusparse_, streams_[i]);
    if (ss != CUSPARSE_STATUS_SUCCESS) {
      fail(i, POOCH_ERR_INTERNAL,
           where() + fmt::format("cusparseSetStream: {}", lib.cusparseGetErrorString(ss)));
      return;
    }
    bound_stream_ = i;
  }
  // An error pending before this launcher runs is an earlier kernel's (a
  // fault in one surfaces at the next call), not this one's.
  if (const cudaError_t before = cudaPeekAtLastError(); before != cudaSuccess) {
    (void)cudaGetLastError();
    fail(i, POOCH_ERR_INTERNAL,
         fmt::format("before kernel '{}' on the {} stream, an earlier kernel on this device "
                     "failed: {} (a fault such as an illegal address leaves the device unusable "
                     "until the process restarts; compute-sanitizer finds the kernel)",
                     k.op ? k.op : "?", stream_name(i), cuda_error(before)));
    return;
  }
  kern::KernelArgs a = args;  // a copy on the stack: the launcher runs now
  a.stream = streams_[i];
  a.device = &env_;
  env_.failed = false;
  env_.error[0] = '\0';
  {
    kern::cuda::ScopedLaunchEnv scope(&env_);
    try {
      k.fn(a);
    } catch (const Error& e) {
      fail(i, e.code(), where() + e.what());
    } catch (const std::bad_alloc&) {
      fail(i, POOCH_ERR_OUT_OF_MEMORY, where() + "out of host memory");
    } catch (const std::exception& e) {
      fail(i, POOCH_ERR_INTERNAL, where() + e.what());
    } catch (...) {
      fail(i, POOCH_ERR_INTERNAL, where() + "an exception that is not a std::exception");
    }
  }
  if (env_.failed) fail(i, POOCH_ERR_INTERNAL, where() + env_.error);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail(i, POOCH_ERR_INTERNAL, where() + cuda_error(err));
}

void CudaBackend::launch_host(Stream s, const kern::KernelVariant& k,
                              const kern::KernelArgs& args) {
  const int i = index(s, "launch_host");
  if (k.fn == nullptr)
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("cuda backend launch_host: kernel '{}' has no function", k.op ? k.op : "?"));
  if (pending_[i].failed) return;
  bind();
  if (!host_workers_[i]) {
    try {
      host_workers_[i] = std::make_unique<cpu::StreamWorker>("host", 4);
    } catch (const std::system_error& e) {  // pthread_create: EAGAIN
      fail(i, POOCH_ERR_OUT_OF_MEMORY,
           fmt::format("host kernel '{}': the thread that runs host kernels could not start: {}",
                       k.op ? k.op : "?", e.what()));
      return;
    }
  }
  auto call = std::make_unique<HostCall>();
  call->kernel = &k;
  call->args = args;
  call->stream_failed = &host_failed_[i];
  call->worker = host_workers_[i].get();
  // Kept before it is queued: once queued it may run at any moment, and a
  // push_back that threw after cudaLaunchHostFunc would free it under the
  // runtime's thread.
  host_calls_[i].push_back(std::move(call));
  const cudaError_t err =
      cudaLaunchHostFunc(streams_[i], run_host_call, host_calls_[i].back().get());
  if (err != cudaSuccess) {
    host_calls_[i].pop_back();  // never queued: nothing runs it
    (void)cudaGetLastError();
    fail(i, POOCH_ERR_INTERNAL,
         fmt::format("host kernel '{}' on the {} stream: cudaLaunchHostFunc failed: {}",
                     k.op ? k.op : "?", stream_name(i), cuda_error(err)));
  }
}

// Waits for everything queued on stream i, asleep (sync_'s comment).
cudaError_t CudaBackend::wait_for(int i) noexcept {
  if (!sync_[i]) return cudaStreamSynchronize(streams_[i]);  // not made: a failed start
  const cudaError_t err = cudaEventRecord(sync_[i], streams_[i]);
  return err != cudaSuccess ? err : cudaEventSynchronize(sync_[i]);
}

void CudaBackend::stream_sync(Stream s) {
  const int i = index(s, "stream_sync");
  bind();
  const cudaError_t err = wait_for(i);
  if (err != cudaSuccess) (void)cudaGetLastError();
  for (const auto& c : host_calls_[i])
    if (c->failed && !pending_[i].failed)
      fail(i, c->code,
           fmt::format("host kernel '{}' on the {} stream failed: {}",
                       c->kernel->op ? c->kernel->op : "?", stream_name(i), c->error));
  if (err == cudaSuccess) {
    host_calls_[i].clear();
    host_failed_[i].store(false, std::memory_order_relaxed);  // nothing of this stream runs now
  }
  Pending& p = pending_[i];
  if (p.failed) {
    p.failed = false;
    const pooch_status code = p.code;
    std::string message = std::move(p.message);
    p.message.clear();
    throw Error(code, std::move(message));
  }
  if (err != cudaSuccess)
    throw Error(POOCH_ERR_INTERNAL,
                fmt::format("cuda backend: work queued on the {} stream failed: "
                            "waiting for it returned {}",
                            stream_name(i), cuda_error(err)));
}

std::span<const kern::KernelVariant> CudaBackend::kernels() const {
  return kern::cuda_kernels();
}

}  // namespace cuda

bool cuda_device_available(std::string* why, int device) {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  try {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      int runtime = 0;
      (void)cudaRuntimeGetVersion(&runtime);
      if (e == cudaErrorInsufficientDriver)
        return no(
            fmt::format("no CUDA driver ({}): no NVIDIA driver is loaded, or it is older "
                        "than this build's CUDA runtime {}.{} needs",
                        cuda::cuda_error(e), runtime / 1000, runtime % 1000 / 10));
      if (e == cudaErrorNoDevice)
        return no(fmt::format("no CUDA device ({})", cuda::cuda_error(e)));
      return no(fmt::format("the CUDA runtime could not count devices ({})", cuda::cuda_error(e)));
    }
    if (count <= 0) return no("no CUDA device (the driver reports none)");
    if (device < 0 || device >= count)
      return no(fmt::format("CUDA device {} requested, but this machine has {} (0 to {})", device,
                            count, count - 1));
    cudaDeviceProp prop{};
    if (const cudaError_t pe = cudaGetDeviceProperties(&prop, device); pe != cudaSuccess) {
      (void)cudaGetLastError();
      return no(fmt::format("CUDA device {} cannot be queried ({})", device, cuda::cuda_error(pe)));
    }
    // cuBLAS and cuSPARSE are loaded here, once a device is known to exist:
    // a machine without one never maps them.
    if (std::string lib_why; !kern::cuda::load_cuda_libs(&lib_why)) return no(std::move(lib_why));
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    if (const cudaError_t se = cudaSetDevice(device); se != cudaSuccess) {
      (void)cudaGetLastError();
      return no(fmt::format("CUDA device {} ({}) cannot be used ({})", device, prop.name,
                            cuda::cuda_error(se)));
    }
    const auto image = static_cast<cudaError_t>(kern::cuda::kernel_image_status());
    if (prev != device) (void)cudaSetDevice(prev);
    (void)cudaGetLastError();
    if (image == cudaErrorNoKernelImageForDevice || image == cudaErrorInvalidDeviceFunction)
      return no(fmt::format(
          "CUDA device {} ({}) is compute capability {}.{}, and this build has "
          "device code for sm {} only; rebuild with -Dcuda-arch={}{}",
          device, prop.name, prop.major, prop.minor, POOCH_CUDA_ARCHS, prop.major, prop.minor));
    if (image != cudaSuccess)
      return no(fmt::format("CUDA device {} ({}) cannot run this build's kernels ({})", device,
                            prop.name, cuda::cuda_error(image)));
    return true;
  } catch (const std::exception& ex) {  // fmt or std::string running out of memory
    return no(ex.what());
  }
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendParams& p) {
  std::string why;
  if (!cuda_device_available(&why, p.device))
    throw Error(POOCH_ERR_NO_DEVICE, fmt::format("the CUDA backend is not available: {}", why));
  return std::make_unique<cuda::CudaBackend>(p);
}

}  // namespace pooch
