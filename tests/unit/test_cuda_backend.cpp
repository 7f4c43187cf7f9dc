// The CUDA backend. Without a usable GPU (CI, this build machine) the
// "NoDevice" tests check the clean refusal: cuda_device_available says why,
// make_cuda_backend throws POOCH_ERR_NO_DEVICE, nothing crashes. With a GPU
// those skip and the device tests run: arena, pool, streams, events, copies,
// kernel launches, error reporting and the budget.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/ref/ref_kernels.h"
#include "runtime/backend/cuda/cuda_backend.h"
#include "runtime/core/error.h"

namespace pooch {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

#define SKIP_WITHOUT_DEVICE()                                \
  do {                                                       \
    std::string why_;                                        \
    if (!cuda_device_available(&why_)) GTEST_SKIP() << why_; \
  } while (0)

// ---- without a device --------------------------------------------------------

TEST(CudaBackendNoDevice, AvailabilitySaysWhyAndNeverThrows) {
  std::string why;
  bool ok = true;
  EXPECT_NO_THROW(ok = cuda_device_available(&why));
  if (ok) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(why.empty());
  EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  // The reason names the runtime's error (cudaErrorInsufficientDriver on a
  // machine with the toolkit but no driver).
  EXPECT_NE(why.find("cudaError"), std::string::npos) << why;
  // Asking again, or without a string, gives the same answer.
  EXPECT_FALSE(cuda_device_available(nullptr));
  std::string again;
  EXPECT_FALSE(cuda_device_available(&again));
  EXPECT_EQ(why, again);
}

TEST(CudaBackendNoDevice, MakeThrowsNoDeviceWithTheReason) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  for (int attempt = 0; attempt < 2; ++attempt) {  // a failed start leaves nothing behind
    try {
      CudaBackendParams p;
      p.device_budget = 64 * kMiB;
      (void)make_cuda_backend(p);
      FAIL() << "make_cuda_backend succeeded without a device";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_NO_DEVICE);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
      EXPECT_EQ(msg.find("--"), std::string::npos) << msg;  // flag advice is pooch-run's
    }
  }
}

TEST(CudaBackend, DeviceIndexOutOfRangeIsRefused) {
  std::string why;
  EXPECT_FALSE(cuda_device_available(&why, 4096));
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(cuda_device_available(&why, -1));
  CudaBackendParams p;
  p.device = 4096;
  try {
    (void)make_cuda_backend(p);
    FAIL() << "device 4096 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_NO_DEVICE) << e.what();
  }
}

// ---- cuBLAS and cuSPARSE, loaded at run time (kernels/cuda/cuda_libs.h) ----------

// Whether the process has `soname` mapped now (without loading it).
bool is_loaded(const char* soname) {
  void* h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

// Nothing maps cuBLAS or cuSPARSE until a device is found: the tests above
// asked for the backend, and on a machine without a device that mapped neither
// (the tests below load them: this one runs first).
TEST(CudaLibsNoDevice, NotLoadedWithoutADevice) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(is_loaded(kern::cuda::cublas_soname()));
  EXPECT_FALSE(is_loaded(kern::cuda::cusparse_soname()));
  EXPECT_FALSE(is_loaded(("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR)).c_str()));
}

TEST(CudaLibs, SonamesFollowTheHeaders) {
  EXPECT_EQ(std::string(kern::cuda::cublas_soname()).rfind("libcublas.so.", 0), 0u);
  EXPECT_EQ(std::string(kern::cuda::cusparse_soname()).rfind("libcusparse.so.", 0), 0u);
}

TEST(CudaLibs, AMissingLibraryIsNamed) {
  kern::cuda::CudaLibs t;
  std::string why;
  EXPECT_FALSE(kern::cuda::load_cuda_libs_from(&t, "libpooch-test-no-such-cublas.so.13",
                                               kern::cuda::cusparse_soname(), &why));
  EXPECT_EQ(why.rfind("libpooch-test-no-such-cublas.so.13 not found: install the CUDA ", 0), 0u)
      << why;
  EXPECT_NE(why.find(" runtime libraries"), std::string::npos) << why;
  EXPECT_EQ(why.find("--"), std::string::npos) << why;  // flag advice is pooch-run's
  EXPECT_EQ(t.cublasSgemm, nullptr);
  // cuSPARSE missing: named too, whether or not this machine has cuBLAS (which
  // is then unloaded again).
  why.clear();
  const bool had_cublas = is_loaded(kern::cuda::cublas_soname());
  EXPECT_FALSE(kern::cuda::load_cuda_libs_from(&t, kern::cuda::cublas_soname(),
                                               "libpooch-test-no-such-cusparse.so.12", &why));
  EXPECT_NE(why.find(" not found: install the CUDA "), std::string::npos) << why;
  EXPECT_TRUE(why.find("libpooch-test-no-such-cusparse.so.12") == 0 ||
              why.find(kern::cuda::cublas_soname()) == 0)
      << why;
  EXPECT_EQ(is_loaded(kern::cuda::cublas_soname()), had_cublas);
  // A path that is not a library: the loader's reason.
  why.clear();
  EXPECT_FALSE(kern::cuda::load_cuda_libs_from(&t, "/dev/null", "/dev/null", &why));
  EXPECT_EQ(why.rfind("/dev/null could not be loaded (", 0), 0u) << why;
}

// Where the libraries are installed (this build machine, a GPU machine), every
// function of the table is found; those that need no device answer.
TEST(CudaLibs, TheTableIsCompleteWhereTheLibrariesAre) {
  kern::cuda::CudaLibs t;
  std::string why;
  if (!kern::cuda::load_cuda_libs_from(&t, kern::cuda::cublas_soname(),
                                       kern::cuda::cusparse_soname(), &why))
    GTEST_SKIP() << why;
#define POOCH_TEST_MEMBER_SET(name) EXPECT_NE(t.name, nullptr) << #name;
  POOCH_CUBLAS_FUNCTIONS(POOCH_TEST_MEMBER_SET)
  POOCH_CUSPARSE_FUNCTIONS(POOCH_TEST_MEMBER_SET)
#undef POOCH_TEST_MEMBER_SET
  EXPECT_NE(std::string(t.cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED)), "");
  EXPECT_NE(std::string(t.cusparseGetErrorString(CUSPARSE_STATUS_NOT_INITIALIZED)), "");
}

// The kernel table is host data: checked with or without a device.
TEST(CudaKernels, TableIsWellFormedAndCoversEveryReferenceOp) {
  const auto& table = kern::cuda_kernels();
  ASSERT_FALSE(table.empty());
  std::set<std::pair<std::string, std::string>> seen;
  std::set<std::string> ops, deterministic_ops;
  for (const kern::KernelVariant& k : table) {
    ASSERT_NE(k.op, nullptr);
    ASSERT_NE(k.variant, nullptr);
    EXPECT_NE(k.fn, nullptr) << k.op;
    EXPECT_TRUE(seen.emplace(k.op, k.variant).second) << k.op << "/" << k.variant << " twice";
    ops.insert(k.op);
    if (k.deterministic) deterministic_ops.insert(k.op);
  }
  for (const kern::KernelVariant& r : kern::ref_kernels()) {
    EXPECT_TRUE(ops.count(r.op)) << "no CUDA kernel for " << r.op;
    EXPECT_TRUE(deterministic_ops.count(r.op)) << "no deterministic CUDA kernel for " << r.op;
  }
  // The scatter with atomics is the one nondeterministic variant.
  bool atomic = false;
  for (const kern::KernelVariant& k : table)
    if (std::string(k.op) == "ffi_grad_input" && std::string(k.variant) == "atomic") {
      atomic = true;
      EXPECT_FALSE(k.deterministic);
    }
  EXPECT_TRUE(atomic);
}

// Workspace functions run while planning, possibly with no backend (and no
// device): they must answer, not crash, with null data pointers.
TEST(CudaKernels, WorkspaceQueriesWorkWithoutABackend) {
  kern::KernelArgs a;
  auto set = [](kern::TensorView& v, DType dt, std::vector<int64_t> shape) {
    v.data = nullptr;
    v.dtype = dt;
    v.ndim = static_cast<int>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  };
  // ffi_grad_input at the paper's shape: B=32, H=65536, L=670091, K=32.
  a.n_in = 3;
  a.n_out = 1;
  set(a.in[0], DType::f32, {32, 670091});
  set(a.in[1], DType::u16, {670091, 32});
  set(a.in[2], DType::f32, {670091, 32});
  set(a.out[0], DType::f32, {32, 65536});
  for (const kern::KernelVariant& k : kern::cuda_kernels())
    if (std::string(k.op) == "ffi_grad_input" && k.workspace) {
      const size_t ws = k.workspace(a);
      EXPECT_GE(ws, size_t{65536} * 32 * sizeof(float)) << k.variant;
    }
}

// ---- with a device -----------------------------------------------------------

std::unique_ptr<Backend> backend_with(size_t arena, size_t pool, size_t budget = 0) {
  CudaBackendParams p;
  p.device_budget = budget;
  auto b = make_cuda_backend(p);
  b->arena_reserve(arena);
  b->host_pool_reserve(pool);
  return b;
}

TEST(CudaBackend, ReportsItselfAndItsMemory) {
  SKIP_WITHOUT_DEVICE();
  auto b = backend_with(kMiB + 3, 2 * kMiB);
  EXPECT_STREQ(b->name(), "cuda");
  const BackendCaps c = b->caps();
  EXPECT_FALSE(c.host_is_device);
  EXPECT_TRUE(c.async_copies);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->arena_base()) % c.alignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->host_pool_base()) % c.alignment, 0u);
  const MemoryInfo m = b->memory_info();
  EXPECT_GT(m.total, 0u);
  EXPECT_LE(m.free, m.total);
  EXPECT_GT(m.budget, 0u);
  EXPECT_EQ(m.arena_bytes, kMiB + 3);
  EXPECT_EQ(m.host_pool_bytes, 2 * kMiB);
  EXPECT_FALSE(b->kernels().empty());
  EXPECT_NE(b->find_kernel("ffi_linear"), nullptr);
  EXPECT_NE(b->find_kernel("ffi_grad_input", {}, true), nullptr);
  EXPECT_TRUE(b->find_kernel("ffi_grad_input", {}, true)->deterministic);
}

TEST(CudaBackend, CopiesRoundTripThroughTheArena) {
  SKIP_WITHOUT_DEVICE();
  constexpr size_t n = 3 * kMiB + 17;
  auto b = backend_with(2 * n, 2 * n);
  std::byte* host = b->host_pool_base();
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<std::byte>((i * 131) & 0xFF);
  std::memset(host + n, 0, n);
  const EventId up = b->event_create();
  // host -> arena (h2d), arena -> arena (compute), arena -> host (d2h), each
  // hop ordered by an event only.
  b->copy_async(Stream::h2d, b->arena_base(), host, n);
  b->event_record(Stream::h2d, up);
  b->stream_wait(Stream::compute, up);
  b->copy_async(Stream::compute, b->arena_base() + n, b->arena_base(), n);
  const EventId moved = b->event_create();
  b->event_record(Stream::compute, moved);
  b->stream_wait(Stream::d2h, moved);
  b->copy_async(Stream::d2h, host + n, b->arena_base() + n, n);
  b->stream_sync(Stream::d2h);
  EXPECT_EQ(std::memcmp(host, host + n, n), 0);
  b->sync_all();
}

TEST(CudaBackend, KernelOutputIsOrderedBeforeACopyByAnEvent) {
  SKIP_WITHOUT_DEVICE();
  constexpr int64_t n = 1 << 20;
  const size_t bytes = n * sizeof(float);
  auto b = backend_with(2 * bytes, 2 * bytes);
  auto* hx = reinterpret_cast<float*>(b->host_pool_base());
  auto* hy = hx + n;
  for (int64_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i % 7) - 3.0f;
  std::byte* dx = b->arena_base();
  std::byte* dy = dx + bytes;
  const kern::KernelVariant* relu = b->find_kernel("relu");
  ASSERT_NE(relu, nullptr);
  kern::KernelArgs a;
  a.n_in = a.n_out = 1;
  a.in[0].data = dx;
  a.in[0].ndim = 1;
  a.in[0].shape[0] = n;
  a.out[0] = a.in[0];
  a.out[0].data = dy;
  kern::KernelContext ctx;
  a.ctx = &ctx;
  const EventId in = b->event_create(), out = b->event_create();
  b->copy_async(Stream::h2d, dx, hx, bytes);
  b->event_record(Stream::h2d, in);
  b->stream_wait(Stream::compute, in);
  b->launch(Stream::compute, *relu, a);
  b->event_record(Stream::compute, out);
  b->stream_wait(Stream::d2h, out);
  b->copy_async(Stream::d2h, hy, dy, bytes);
  b->stream_sync(Stream::d2h);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hy[i], hx[i] < 0 ? 0.0f : hx[i]) << "element " << i;
  b->sync_all();
}

// A host kernel queued on the d2h stream runs after the copy queued before
// it (it reads what the copy wrote into the host pool), on host memory.
TEST(CudaBackend, HostKernelRunsInItsStreamsOrderOnTheHostPool) {
  SKIP_WITHOUT_DEVICE();
  constexpr int64_t n = 1 << 20;
  const size_t bytes = n * sizeof(float);
  auto b = backend_with(bytes, 3 * bytes);
  ASSERT_FALSE(b->host_kernels().empty());
  auto* hx = reinterpret_cast<float*>(b->host_pool_base());
  auto* hmid = hx + n;
  auto* hy = hmid + n;
  for (int64_t i = 0; i < n; ++i) hx[i] = static_cast<float>(i % 7) - 3.0f;
  const kern::KernelVariant* relu = nullptr;
  for (const kern::KernelVariant& k : b->host_kernels())
    if (std::string(k.op) == "relu") relu = &k;
  ASSERT_NE(relu, nullptr);
  kern::KernelArgs a;
  a.n_in = a.n_out = 1;
  a.in[0].data = hmid;
  a.in[0].ndim = 1;
  a.in[0].shape[0] = n;
  a.out[0] = a.in[0];
  a.out[0].data = hy;
  kern::KernelContext ctx;
  a.ctx = &ctx;
  const EventId up = b->event_create();
  b->copy_async(Stream::h2d, b->arena_base(), hx, bytes);
  b->event_record(Stream::h2d, up);
  b->stream_wait(Stream::d2h, up);
  b->copy_async(Stream::d2h, hmid, b->arena_base(), bytes);
  b->launch_host(Stream::d2h, *relu, a);
  b->stream_sync(Stream::d2h);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hy[i], hx[i] < 0 ? 0.0f : hx[i]) << "element " << i;
  b->sync_all();
}

TEST(CudaBackend, WaitingOnAnUnrecordedEventDoesNotBlock) {
  SKIP_WITHOUT_DEVICE();
  auto b = backend_with(kMiB, kMiB);
  const EventId e = b->event_create();
  b->event_sync(e);
  b->stream_wait(Stream::d2h, e);
  b->copy_async(Stream::d2h, b->host_pool_base(), b->arena_base(), 16);
  b->sync_all();
}

// A host kernel that keeps its stream busy for 0.3 s without using a core.
void sleeps(const kern::KernelArgs&) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}
const kern::KernelVariant kSleeps{"test_sleeps", "test", sleeps, nullptr, true};

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// pooch never spins a host application's cores: a thread that waits for a
// stream or an event sleeps (cudaStreamSynchronize would spin a core for the
// whole 0.3 s under the runtime's default scheduling).
TEST(CudaBackend, WaitingSleeps) {
  SKIP_WITHOUT_DEVICE();
  auto b = backend_with(kMiB, kMiB);
  kern::KernelContext ctx;
  kern::KernelArgs a;
  a.ctx = &ctx;
  const EventId e = b->event_create();
  for (int wait = 0; wait < 2; ++wait) {
    const double before = process_cpu_seconds();
    b->launch_host(Stream::d2h, kSleeps, a);
    if (wait == 0) {
      b->stream_sync(Stream::d2h);
    } else {
      b->event_record(Stream::d2h, e);
      b->event_sync(e);
    }
    EXPECT_LT(process_cpu_seconds() - before, 0.1)
        << (wait == 0 ? "stream_sync" : "event_sync") << " spun while it waited";
  }
  b->sync_all();
}

TEST(CudaBackend, BudgetIsEnforced) {
  SKIP_WITHOUT_DEVICE();
  CudaBackendParams p;
  p.device_budget = 96 * kMiB;
  auto b = make_cuda_backend(p);
  const size_t limit = b->memory_info().budget;
  EXPECT_LT(limit, 96 * kMiB);  // cuBLAS's workspace comes out of the budget
  EXPECT_GE(limit, 60 * kMiB);
  try {
    b->arena_reserve(200 * kMiB);
    FAIL() << "an arena over the budget was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(200 * kMiB)), std::string::npos) << msg;
    EXPECT_NE(msg.find("a budget of at least "), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--"), std::string::npos) << msg;  // flag advice is pooch-run's
  }
  EXPECT_EQ(b->arena_base(), nullptr);
  b->arena_reserve(limit);
  EXPECT_NE(b->arena_base(), nullptr);
  EXPECT_EQ(b->memory_info().arena_bytes, limit);
  try {
    b->arena_reserve(kMiB);
    FAIL() << "a second arena_reserve succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
  }
}

TEST(CudaBackend, ArgumentMistakesThrowAtOnce) {
  SKIP_WITHOUT_DEVICE();
  auto b = backend_with(kMiB, kMiB);
  EXPECT_THROW(b->copy_async(Stream::h2d, nullptr, b->host_pool_base(), 8), Error);
  EXPECT_THROW(b->copy_async(Stream::h2d, b->arena_base(), b->arena_base() + 4, 8), Error);
  EXPECT_THROW(b->event_record(Stream::compute, 99), Error);
  EXPECT_THROW(b->stream_sync(static_cast<Stream>(7)), Error);
  EXPECT_THROW(b->host_pool_reserve(kMiB), Error);
  b->sync_all();
}

// Kernels that fail in the ways a launcher can: by throwing (test kernels do)
// and by recording a failed library call in the launch environment.
void throws_error(const kern::KernelArgs&) {
  throw Error(POOCH_ERR_INVALID_ARG, "test kernel refuses its inputs");
}
void records_failure(const kern::KernelArgs& a) {
  kern::cuda::LaunchEnv* env = kern::cuda::current_launch_env();
  if (env == nullptr || a.stream == nullptr) return;  // the test then sees no error
  env->failed = true;
  std::strcpy(env->error, "cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED (test)");
}
int g_calls = 0;
void counts(const kern::KernelArgs&) {
  ++g_calls;
}
const kern::KernelVariant kThrows{"test_throws", "test", throws_error, nullptr, true};
const kern::KernelVariant kRecords{"test_records", "test", records_failure, nullptr, true};
const kern::KernelVariant kCounts{"test_counts", "test", counts, nullptr, true};

TEST(CudaBackend, QueuedFailuresSurfaceAtTheNextSync) {
  SKIP_WITHOUT_DEVICE();
  auto b = backend_with(kMiB, kMiB);
  kern::KernelArgs a;
  b->launch(Stream::compute, kThrows, a);
  g_calls = 0;
  b->launch(Stream::compute, kCounts, a);  // skipped: the stream has failed
  EXPECT_EQ(g_calls, 0);
  try {
    b->stream_sync(Stream::compute);
    FAIL() << "the failure was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("test_throws"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("refuses"), std::string::npos) << e.what();
  }
  b->stream_sync(Stream::compute);  // reported once, then cleared
  b->launch(Stream::compute, kCounts, a);
  EXPECT_EQ(g_calls, 1);

  b->launch(Stream::h2d, kRecords, a);
  try {
    b->stream_sync(Stream::h2d);
    FAIL() << "the launcher's recorded failure was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_EXECUTION_FAILED"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("h2d"), std::string::npos) << e.what();
  }

  // Host kernels: queued together, so the later one cannot be refused at
  // launch; it does not run after the one before it failed, and the code is
  // the failed kernel's.
  kern::KernelContext ctx;
  a.ctx = &ctx;
  g_calls = 0;
  b->launch_host(Stream::d2h, kThrows, a);
  b->launch_host(Stream::d2h, kCounts, a);
  try {
    b->stream_sync(Stream::d2h);
    FAIL() << "the host kernel's failure was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("test_throws"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g_calls, 0) << "a host kernel ran after the one before it failed";
  b->launch_host(Stream::d2h, kCounts, a);  // the stream is clear again
  b->stream_sync(Stream::d2h);
  EXPECT_EQ(g_calls, 1);
  b->sync_all();
}

// ---- supports() and the planned device ---------------------------------------

kern::TensorView operand(DType dt, std::vector<int64_t> shape) {
  kern::TensorView v;
  v.dtype = dt;
  v.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) v.shape[i] = shape[i];
  return v;
}

const kern::KernelVariant* cuda_kernel(const char* op, const char* variant = nullptr) {
  for (const kern::KernelVariant& k : kern::cuda_kernels())
    if (std::string(k.op) == op && (variant == nullptr || std::string(k.variant) == variant))
      return &k;
  return nullptr;
}

// Every CUDA kernel computes in f32; the limits of 32-bit library sizes are
// refused at plan time rather than reported at launch. No device needed.
TEST(CudaKernels, SupportsRefusesF64AndSizesBeyondTheLibraries) {
  kern::KernelArgs a;
  a.n_in = a.n_out = 1;
  a.in[0] = operand(DType::f64, {3, 5});
  a.out[0] = operand(DType::f64, {3, 5});
  const kern::KernelVariant* relu = cuda_kernel("relu");
  ASSERT_NE(relu, nullptr);
  ASSERT_NE(relu->supports, nullptr);
  EXPECT_FALSE(relu->supports(a));
  a.in[0].dtype = a.out[0].dtype = DType::f32;
  EXPECT_TRUE(relu->supports(a));

  // topk above 1024 winners sorts the whole [B, L] with int-sized counts.
  const kern::KernelVariant* topk = cuda_kernel("topk");
  ASSERT_NE(topk, nullptr);
  kern::KernelArgs t;
  t.n_in = 1;
  t.n_out = 2;
  t.in[0] = operand(DType::f32, {4096, 1 << 20});
  t.out[0] = operand(DType::f32, {4096, 2000});
  t.out[1] = operand(DType::i32, {4096, 2000});
  EXPECT_FALSE(topk->supports(t));
  t.out[0].shape[1] = t.out[1].shape[1] = 100;
  EXPECT_TRUE(topk->supports(t));

  // The deterministic FFI input gradient sorts the L·K slots in 32 bits.
  const kern::KernelVariant* det = cuda_kernel("ffi_grad_input", "deterministic");
  ASSERT_NE(det, nullptr);
  kern::KernelArgs f;
  f.n_in = 3;
  f.n_out = 1;
  f.in[0] = operand(DType::f32, {32, 670091});
  f.in[1] = operand(DType::u8, {670091, 32});
  f.in[2] = operand(DType::f32, {670091, 32});
  f.out[0] = operand(DType::f32, {32, 65536});
  EXPECT_FALSE(det->supports(f));  // a u8 index
  f.in[1].dtype = DType::u16;
  EXPECT_TRUE(det->supports(f));

  // Layout ops take any dtype.
  const kern::KernelVariant* tr = cuda_kernel("transpose");
  ASSERT_NE(tr, nullptr);
  EXPECT_EQ(tr->supports, nullptr);
}

// A backend names its device for plan-time queries; the workspace it asks
// for with it is exact, never above the bound given without one.
TEST(CudaBackend, KernelDeviceSizesWorkspacesExactly) {
  SKIP_WITHOUT_DEVICE();
  auto b = make_cuda_backend(CudaBackendParams{});
  ASSERT_NE(b->kernel_device(), nullptr);
  kern::KernelArgs a;
  a.n_in = 3;
  a.n_out = 1;
  a.in[0] = operand(DType::f32, {32, 670091});
  a.in[1] = operand(DType::u16, {670091, 32});
  a.in[2] = operand(DType::f32, {670091, 32});
  a.out[0] = operand(DType::f32, {32, 65536});
  const kern::KernelVariant* det = cuda_kernel("ffi_grad_input", "deterministic");
  ASSERT_NE(det, nullptr);
  const size_t bound = det->workspace(a);
  a.device = b->kernel_device();
  const size_t exact = det->workspace(a);
  EXPECT_GT(exact, 0u);
  EXPECT_LE(exact, bound);
}

// A recompute of a batch normalisation's output runs batchnorm_replay (the
// same statistics and normalisation kernels, its statistics written into
// its workspace): y must have the forward pass's bits, and the session's
// running averages must move once, in the forward pass.
TEST(CudaBackend, BatchnormReplayRemakesTheForwardOutputBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const int64_t N = 8, C = 32, H = 14, W = 14, n = N * C * H * W;
  // One layout in the arena and the host pool, each array 256-byte aligned.
  enum { X, GAMMA, BETA, RMEAN, RVAR, Y, MEAN, VAR, Y2, WS, COUNT };
  const int64_t elems[COUNT] = {n, C, C, C, C, n, C, C, n, 5 * C};
  size_t at[COUNT + 1] = {0};
  for (int i = 0; i < COUNT; ++i)
    at[i + 1] = (at[i] + static_cast<size_t>(elems[i]) * 4 + 255) / 256 * 256;
  auto b = backend_with(at[COUNT], at[COUNT]);
  std::byte* host = b->host_pool_base();
  auto hf = [&](int i) { return reinterpret_cast<float*>(host + at[i]); };
  for (int64_t i = 0; i < n; ++i) hf(X)[i] = 3.0f + std::sin(0.37f * static_cast<float>(i));
  for (int64_t c = 0; c < C; ++c) {
    hf(GAMMA)[c] = 0.5f + 0.1f * static_cast<float>(c);
    hf(BETA)[c] = -0.25f * static_cast<float>(c);
    hf(RMEAN)[c] = 0.1f;
    hf(RVAR)[c] = 2.0f;
  }
  b->copy_async(Stream::h2d, b->arena_base(), host, at[Y]);
  b->stream_sync(Stream::h2d);
  kern::KernelContext ctx;
  ctx.training = 1;
  kern::KernelArgs a;
  a.n_in = 5;
  a.n_out = 3;
  const int in[] = {X, GAMMA, BETA, RMEAN, RVAR}, out[] = {Y, MEAN, VAR};
  for (int i = 0; i < 5; ++i) {
    a.in[i] =
        operand(DType::f32, i == 0 ? std::vector<int64_t>{N, C, H, W} : std::vector<int64_t>{C});
    a.in[i].data = b->arena_base() + at[in[i]];
  }
  for (int i = 0; i < 3; ++i) {
    a.out[i] =
        operand(DType::f32, i == 0 ? std::vector<int64_t>{N, C, H, W} : std::vector<int64_t>{C});
    a.out[i].data = b->arena_base() + at[out[i]];
  }
  a.attrs.set("eps", 1e-5);
  a.attrs.set("momentum", 0.1);
  a.ctx = &ctx;
  a.device = b->kernel_device();
  const kern::KernelVariant* bn = b->find_kernel("batchnorm");
  const kern::KernelVariant* replay = b->find_kernel("batchnorm_replay");
  ASSERT_NE(bn, nullptr);
  ASSERT_NE(replay, nullptr);
  ASSERT_TRUE(bn->supports(a));
  // The forward's normalisation terms go to the same slot: the replay runs
  // after it on the same stream.
  a.workspace_bytes = bn->workspace(a);
  ASSERT_LE(a.workspace_bytes, at[WS + 1] - at[WS]);
  a.workspace = b->arena_base() + at[WS];
  b->launch(Stream::compute, *bn, a);
  kern::KernelArgs r = a;
  r.n_in = 3;
  r.n_out = 1;
  r.out[0].data = b->arena_base() + at[Y2];
  r.workspace_bytes = replay->workspace(r);
  ASSERT_LE(r.workspace_bytes, at[WS + 1] - at[WS]);
  r.workspace = b->arena_base() + at[WS];
  b->launch(Stream::compute, *replay, r);
  b->stream_sync(Stream::compute);
  b->copy_async(Stream::d2h, host + at[Y], b->arena_base() + at[Y], at[WS] - at[Y]);
  b->copy_async(Stream::d2h, host + at[RMEAN], b->arena_base() + at[RMEAN], at[Y] - at[RMEAN]);
  b->stream_sync(Stream::d2h);
  EXPECT_EQ(std::memcmp(hf(Y), hf(Y2), static_cast<size_t>(n) * 4), 0)
      << "the replay's bits differ from the forward pass's";
  // Moved once: (1 - 0.1)·0.1 + 0.1·mean, not twice.
  for (int64_t c = 0; c < C; ++c)
    EXPECT_FLOAT_EQ(hf(RMEAN)[c], 0.9f * 0.1f + 0.1f * hf(MEAN)[c]) << "channel " << c;
  b->sync_all();
}

// ffi_loss_grad sums the loss from the logits it forms for the gradient, on
// ffi_loss's grid and in its order: a train step's loss (ffi_loss_grad with
// with_loss) has the bits of the evaluate program's (ffi_loss), for every
// loss and both variants, and both are the loss a host sum in double gives.
TEST(CudaBackend, FfiLossGradGivesFfiLossBitsWithoutASecondPass) {
  SKIP_WITHOUT_DEVICE();
  // 3000 labels: twelve blocks of the loss grid, so the order across blocks counts.
  const int64_t B = 24, H = 50, L = 3000, K = 8;
  std::vector<int32_t> lptr{0}, lidx;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t j = 0; j <= r % 3; ++j)
      lidx.push_back(static_cast<int32_t>((r * 131 + j * 977) % L));
    lptr.push_back(static_cast<int32_t>(lidx.size()));
  }
  const int64_t n = static_cast<int64_t>(lidx.size());
  enum { Hin, INDEX, Wt, BIAS, LPTR, LIDX, LOSS1, DH, DW, DB, LOSS2, WS, COUNT };
  const size_t bytes[COUNT] = {size_t(B * H) * 4,
                               size_t(L * K) * 2,
                               size_t(L * K) * 4,
                               size_t(L) * 4,
                               size_t(B + 1) * 4,
                               size_t(n) * 4,
                               4,
                               size_t(B * H) * 4,
                               size_t(L * K) * 4,
                               size_t(L) * 4,
                               4,
                               16 * kMiB};
  size_t at[COUNT + 1] = {0};
  for (int i = 0; i < COUNT; ++i) at[i + 1] = (at[i] + bytes[i] + 255) / 256 * 256;
  auto b = backend_with(at[COUNT], at[COUNT]);
  std::byte* host = b->host_pool_base();
  auto hf = [&](int i) { return reinterpret_cast<float*>(host + at[i]); };
  auto* index = reinterpret_cast<uint16_t*>(host + at[INDEX]);
  for (int64_t i = 0; i < B * H; ++i) hf(Hin)[i] = std::sin(0.71f * static_cast<float>(i));
  for (int64_t i = 0; i < L * K; ++i) {
    index[i] = static_cast<uint16_t>((i * 37 + i / K) % H);
    hf(Wt)[i] = 0.3f * std::cos(0.13f * static_cast<float>(i));
  }
  for (int64_t l = 0; l < L; ++l) hf(BIAS)[l] = -0.5f + 0.001f * static_cast<float>(l % 97);
  std::memcpy(host + at[LPTR], lptr.data(), lptr.size() * 4);
  std::memcpy(host + at[LIDX], lidx.data(), lidx.size() * 4);
  b->copy_async(Stream::h2d, b->arena_base(), host, at[LOSS1]);
  b->stream_sync(Stream::h2d);

  // The host's loss, in double, from the same logits.
  auto host_loss = [&](int kind) {
    double sum = 0;
    for (int64_t r = 0; r < B; ++r) {
      std::vector<double> z(L);
      for (int64_t l = 0; l < L; ++l) {
        double x = hf(BIAS)[l];
        for (int64_t k = 0; k < K; ++k)
          x += double(hf(Wt)[l * K + k]) * hf(Hin)[r * H + index[l * K + k]];
        z[l] = x;
      }
      auto target = [&](int64_t l) {
        return std::find(lidx.begin() + lptr[r], lidx.begin() + lptr[r + 1], l) !=
               lidx.begin() + lptr[r + 1];
      };
      if (kind == 2) {
        double m = z[0], e = 0;
        for (double x : z) m = std::max(m, x);
        for (double x : z) e += std::exp(x - m);
        sum += double(lptr[r + 1] - lptr[r]) * (m + std::log(e));
        for (int32_t j = lptr[r]; j < lptr[r + 1]; ++j) sum -= z[lidx[j]];
      } else {
        for (int64_t l = 0; l < L; ++l) {
          const double t = target(l) ? 1 : 0, x = z[l];
          if (kind == 0) {
            sum += std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::fabs(x)));
          } else {
            const double mg = std::max(0.0, 1 - (2 * t - 1) * x);
            sum += mg * mg;
          }
        }
      }
    }
    return sum / double(B);
  };

  kern::KernelContext ctx;
  ctx.training = 1;
  kern::KernelArgs a;
  a.n_in = 6;
  const DType in_dt[] = {DType::f32, DType::u16, DType::f32, DType::f32, DType::i32, DType::i32};
  const std::vector<int64_t> in_shape[] = {{B, H}, {L, K}, {L, K}, {L}, {B + 1}, {n}};
  for (int i = 0; i < 6; ++i) {
    a.in[i] = operand(in_dt[i], in_shape[i]);
    a.in[i].data = b->arena_base() + at[i];
  }
  a.ctx = &ctx;
  a.device = b->kernel_device();
  a.workspace = b->arena_base() + at[WS];
  const kern::KernelVariant* loss_op = b->find_kernel("ffi_loss");
  ASSERT_NE(loss_op, nullptr);
  for (int kind = 0; kind < 3; ++kind) {
    for (const char* variant : {"label-group", "label-slices"}) {
      SCOPED_TRACE(std::string("loss ") + std::to_string(kind) + ", " + variant);
      const kern::KernelVariant* grad_op = cuda_kernel("ffi_loss_grad", variant);
      ASSERT_NE(grad_op, nullptr);
      kern::KernelArgs f = a;
      f.attrs.set("loss", kind);
      f.n_out = 1;
      f.out[0] = operand(DType::f32, {});
      f.out[0].data = b->arena_base() + at[LOSS1];
      f.workspace_bytes = loss_op->workspace(f);
      ASSERT_LE(f.workspace_bytes, bytes[WS]);
      b->launch(Stream::compute, *loss_op, f);
      kern::KernelArgs g = a;
      g.attrs.set("loss", kind);
      g.attrs.set("with_loss", 1.0);
      g.n_out = 4;
      const int outs[] = {DH, DW, DB, LOSS2};
      const std::vector<int64_t> out_shape[] = {{B, H}, {L, K}, {L}, {}};
      for (int i = 0; i < 4; ++i) {
        g.out[i] = operand(DType::f32, out_shape[i]);
        g.out[i].data = b->arena_base() + at[outs[i]];
      }
      ASSERT_TRUE(grad_op->supports(g));
      g.workspace_bytes = grad_op->workspace(g);
      ASSERT_LE(g.workspace_bytes, bytes[WS]);
      b->launch(Stream::compute, *grad_op, g);
      b->stream_sync(Stream::compute);
      float evaluated = 0, trained = 0;
      b->copy_async(Stream::d2h, &evaluated, b->arena_base() + at[LOSS1], 4);
      b->copy_async(Stream::d2h, &trained, b->arena_base() + at[LOSS2], 4);
      b->stream_sync(Stream::d2h);
      EXPECT_EQ(std::memcmp(&evaluated, &trained, 4), 0) << evaluated << " against " << trained;
      const double want = host_loss(kind);
      EXPECT_NEAR(trained, want, 1e-4 * std::fabs(want));
    }
  }
  b->sync_all();
}

}  // namespace
}  // namespace pooch
