#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/optim_params.h"
#include "runtime/backend/backend.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/core/error.h"

// Counts heap allocations made by the calling thread while `g_counting` is
// set, to check that queueing work allocates nothing.
namespace {
thread_local bool g_counting = false;
std::atomic<long> g_allocations{0};
}  // namespace

// The replacements pair malloc with free; GCC only sees operator new on one
// side and free on the other and would warn about a mismatch that is not one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (g_counting) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
// The nothrow forms too (std::stable_sort's buffer takes one): left to the
// runtime, their memory would come from another allocator than the free
// above returns it to (AddressSanitizer: alloc-dealloc-mismatch).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (g_counting) g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

namespace pooch {
namespace {

using namespace std::chrono_literals;

constexpr size_t kMiB = size_t{1} << 20;

kern::KernelArgs one_output(void* data, int64_t n, uint8_t pattern = 0) {
  kern::KernelArgs a;
  a.n_out = 1;
  a.out[0].data = data;
  a.out[0].dtype = DType::u8;
  a.out[0].ndim = 1;
  a.out[0].shape[0] = n;
  a.attrs.set("pattern", pattern);
  return a;
}

// Slow enough that a copy not ordered after it would almost surely read the
// old bytes: the ordering, not luck, makes the tests below pass.
void slow_fill(const kern::KernelArgs& a) {
  std::this_thread::sleep_for(50ms);
  std::memset(a.out[0].data, static_cast<int>(a.attrs.geti("pattern", 0)),
              static_cast<size_t>(a.out[0].numel()));
}

// out[0][i] = in[0][i] + 1
void add_one(const kern::KernelArgs& a) {
  const auto* x = a.in[0].as<const uint8_t>();
  auto* y = a.out[0].as<uint8_t>();
  for (int64_t i = 0; i < a.out[0].numel(); ++i) y[i] = static_cast<uint8_t>(x[i] + 1);
}

void throws_error(const kern::KernelArgs&) {
  throw Error(POOCH_ERR_INVALID_ARG, "test kernel refuses its inputs");
}

void throws_other(const kern::KernelArgs&) {
  throw std::runtime_error("plain runtime_error");
}

// Checks that calls arrive in queue order: out[0] holds the next index
// expected; a kernel that sees another value records the mismatch in out[1].
void check_order(const kern::KernelArgs& a) {
  auto* next = a.out[0].as<int64_t>();
  auto* bad = a.out[1].as<int64_t>();
  if (*next != a.attrs.geti("i", -1)) ++*bad;
  ++*next;
}

void sleep_100us(const kern::KernelArgs&) {
  std::this_thread::sleep_for(100us);
}

// out[0][t] = in[0][t] * 0.5 on OpenMP team thread t (two of them): with
// in[0] the smallest normal float the exact result is denormal.
void halve_in_team(const kern::KernelArgs& a) {
  const volatile float* x = a.in[0].as<const float>();
  volatile float* y = a.out[0].as<float>();
#pragma omp parallel for num_threads(2) schedule(static, 1)
  for (int t = 0; t < 2; ++t) y[t] = x[t] * 0.5f;
}

const kern::KernelVariant kSlowFill{"test_slow_fill", "test", slow_fill, nullptr, true};
const kern::KernelVariant kAddOne{"test_add_one", "test", add_one, nullptr, true};
const kern::KernelVariant kThrows{"test_throws", "test", throws_error, nullptr, true};
const kern::KernelVariant kThrowsOther{"test_throws_other", "test", throws_other, nullptr, true};
const kern::KernelVariant kCheckOrder{"test_check_order", "test", check_order, nullptr, true};
const kern::KernelVariant kSleep100us{"test_sleep_100us", "test", sleep_100us, nullptr, true};
const kern::KernelVariant kHalveInTeam{"test_halve_in_team", "test", halve_in_team, nullptr, true};

std::unique_ptr<Backend> backend_with_arena(size_t arena = kMiB, size_t pool = kMiB) {
  CpuBackendParams p;
  p.threads = 2;
  auto b = make_cpu_backend(p);
  b->arena_reserve(arena);
  b->host_pool_reserve(pool);
  return b;
}

bool all_equal(const std::byte* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i)
    if (static_cast<uint8_t>(p[i]) != v) return false;
  return true;
}

TEST(CpuBackend, CopyWaitingOnAnEventSeesTheKernelsOutput) {
  auto b = backend_with_arena();
  constexpr size_t n = 64 * 1024;
  std::byte* src = b->arena_base();
  std::byte* dst = b->host_pool_base();
  std::memset(src, 0x11, n);
  std::memset(dst, 0x00, n);
  const EventId done = b->event_create();
  const kern::KernelArgs args = one_output(src, n, 0xAB);

  b->launch(Stream::compute, kSlowFill, args);
  b->event_record(Stream::compute, done);
  b->stream_wait(Stream::d2h, done);
  b->copy_async(Stream::d2h, dst, src, n);
  b->stream_sync(Stream::d2h);
  EXPECT_TRUE(all_equal(dst, n, 0xAB));
  b->sync_all();
}

// Timed events measure the work between them on the stream's own clock: a
// kernel that sleeps 50 ms measures at least that, however late the host
// asks; an event whose latest record has not completed is an error, not a
// wrong time.
// Kernels, on the compute stream and in the OpenMP teams it starts, flush
// denormals to zero (a denormal operation costs an x86 core about a hundred
// cycles); the host thread's floating-point mode is left as it was, also by
// the backend's construction (which starts OpenBLAS's threads under the flush).
TEST(CpuBackend, KernelsFlushDenormalsAndTheHostThreadKeepsItsMode) {
  const volatile float tiny = std::numeric_limits<float>::min();
  ASSERT_GT(tiny * 0.5f, 0.0f) << "the test thread itself flushes denormals";
  auto b = backend_with_arena();
  EXPECT_GT(tiny * 0.5f, 0.0f) << "making a backend changed the caller's mode";
  auto* x = reinterpret_cast<float*>(b->arena_base());
  float* y = x + 2;
  x[0] = x[1] = std::numeric_limits<float>::min();
  y[0] = y[1] = -1.0f;
  kern::KernelArgs a;
  a.n_in = 1;
  a.n_out = 1;
  a.in[0] = {x, DType::f32, 1, {2}};
  a.out[0] = {y, DType::f32, 1, {2}};
  b->launch(Stream::compute, kHalveInTeam, a);
  b->sync_all();
  EXPECT_EQ(y[0], 0.0f) << "the compute stream computed a denormal";
  EXPECT_EQ(y[1], 0.0f) << "the kernel's OpenMP team computed a denormal";
  EXPECT_GT(tiny * 0.5f, 0.0f);
}

TEST(CpuBackend, TimedEventsMeasureTheWorkBetweenThem) {
  auto b = backend_with_arena();
  const EventId start = b->event_create_timed(), end = b->event_create_timed();
  const kern::KernelArgs args = one_output(b->arena_base(), 16, 0x5A);
  b->event_record(Stream::compute, start);
  b->launch(Stream::compute, kSlowFill, args);
  b->event_record(Stream::compute, end);
  EXPECT_THROW((void)b->event_elapsed(start, end), Error);  // still queued or running
  b->stream_sync(Stream::compute);
  std::this_thread::sleep_for(300ms);  // the host's delay is not the stream's time
  const double sec = b->event_elapsed(start, end);
  EXPECT_GE(sec, 0.050);
  EXPECT_LT(sec, 0.300);
  // Nothing between two records: next to no time.
  b->event_record(Stream::d2h, start);
  b->event_record(Stream::d2h, end);
  b->stream_sync(Stream::d2h);
  EXPECT_GE(b->event_elapsed(start, end), 0.0);
  EXPECT_LT(b->event_elapsed(start, end), 0.050);
}

TEST(CpuBackend, CopyWithoutAWaitRunsAndCompletes) {
  // Unordered against the kernel, the copy may see either value; only its
  // completion and the kernel's result are checked.
#if defined(__SANITIZE_THREAD__)
  // The race between the two streams is this test's subject: ThreadSanitizer
  // rightly reports it.
  GTEST_SKIP() << "a deliberate race between streams";
#endif
  auto b = backend_with_arena();
  constexpr size_t n = 4096;
  std::byte* src = b->arena_base();
  std::byte* dst = b->host_pool_base();
  std::memset(src, 0x11, n);
  const kern::KernelArgs args = one_output(src, n, 0xCD);
  b->launch(Stream::compute, kSlowFill, args);
  b->copy_async(Stream::d2h, dst, src, n);
  b->sync_all();
  EXPECT_TRUE(all_equal(src, n, 0xCD));
  for (size_t i = 0; i < n; ++i) {
    const auto v = static_cast<uint8_t>(dst[i]);
    ASSERT_TRUE(v == 0x11 || v == 0xCD) << "byte " << i << " is " << int{v};
  }
}

// A host syncing a stream sleeps until the stream has run what was queued,
// and is woken then, not after each task: 200 short kernels cost it a few
// context switches, not two each (the host's voluntary switches, counted by
// the kernel for its thread).
TEST(CpuBackend, SyncWakesTheHostOnceNotAfterEveryTask) {
  auto b = backend_with_arena();
  const kern::KernelArgs none;
  for (int i = 0; i < 200; ++i) b->launch(Stream::compute, kSleep100us, none);
  rusage before{}, after{};
  ASSERT_EQ(getrusage(RUSAGE_THREAD, &before), 0);
  b->stream_sync(Stream::compute);
  ASSERT_EQ(getrusage(RUSAGE_THREAD, &after), 0);
  const long switches = after.ru_nvcsw - before.ru_nvcsw;
  std::printf("the host's voluntary context switches in one sync of 200 kernels: %ld\n", switches);
  EXPECT_LE(switches, 20);
}

TEST(CpuBackend, EventsChainAllThreeStreams) {
  auto b = backend_with_arena();
  constexpr size_t n = 8192;
  std::byte* a = b->arena_base();
  std::byte* c = b->arena_base() + n;
  std::byte* d = b->arena_base() + 2 * n;
  std::byte* host = b->host_pool_base();
  std::memset(b->arena_base(), 0, 3 * n);
  std::memset(host, 0, n);
  const EventId filled = b->event_create(), swapped = b->event_create(),
                prefetched = b->event_create(), finished = b->event_create();

  const kern::KernelArgs fill = one_output(a, n, 41);
  kern::KernelArgs inc = one_output(d, n);
  inc.n_in = 1;
  inc.in[0] = inc.out[0];
  inc.in[0].data = c;

  // compute writes a -> d2h swaps a out to the host -> h2d brings it back to
  // c -> compute reads c. Every hop is ordered only by an event.
  b->launch(Stream::compute, kSlowFill, fill);
  b->event_record(Stream::compute, filled);
  b->stream_wait(Stream::d2h, filled);
  b->copy_async(Stream::d2h, host, a, n);
  b->event_record(Stream::d2h, swapped);
  b->stream_wait(Stream::h2d, swapped);
  b->copy_async(Stream::h2d, c, host, n);
  b->event_record(Stream::h2d, prefetched);
  b->stream_wait(Stream::compute, prefetched);
  b->launch(Stream::compute, kAddOne, inc);
  b->event_record(Stream::compute, finished);
  b->event_sync(finished);
  EXPECT_TRUE(all_equal(host, n, 41));
  EXPECT_TRUE(all_equal(c, n, 41));
  EXPECT_TRUE(all_equal(d, n, 42));
  b->sync_all();
}

TEST(CpuBackend, ReRecordedEventOrdersAgainstTheLatestRecord) {
  auto b = backend_with_arena();
  constexpr size_t n = 4096;
  std::byte* x = b->arena_base();
  std::byte* host = b->host_pool_base();
  const EventId e = b->event_create();
  const kern::KernelArgs first = one_output(x, n, 1);
  const kern::KernelArgs second = one_output(x, n, 2);

  b->launch(Stream::compute, kSlowFill, first);
  b->event_record(Stream::compute, e);
  b->event_sync(e);
  EXPECT_TRUE(all_equal(x, n, 1));
  b->launch(Stream::compute, kSlowFill, second);
  b->event_record(Stream::compute, e);
  b->stream_wait(Stream::h2d, e);
  b->copy_async(Stream::h2d, host, x, n);
  b->stream_sync(Stream::h2d);
  EXPECT_TRUE(all_equal(host, n, 2));
  b->sync_all();
}

TEST(CpuBackend, WaitingOnAnUnrecordedEventDoesNotBlock) {
  auto b = backend_with_arena();
  const EventId e = b->event_create();
  b->event_sync(e);
  b->stream_wait(Stream::d2h, e);
  b->copy_async(Stream::d2h, b->host_pool_base(), b->arena_base(), 16);
  b->sync_all();
}

TEST(CpuBackend, BudgetIsEnforced) {
  CpuBackendParams p;
  p.device_budget = kMiB;
  auto b = make_cpu_backend(p);
  EXPECT_EQ(b->memory_info().budget, kMiB);
  try {
    b->arena_reserve(3 * kMiB);
    FAIL() << "an arena over the budget was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(3 * kMiB)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(kMiB)), std::string::npos) << msg;
    EXPECT_NE(msg.find("a budget of at least 3 MiB"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--"), std::string::npos) << msg;  // flag advice is pooch-run's
  }
  EXPECT_EQ(b->arena_base(), nullptr);
  // The refusal took nothing, so an arena within the budget still fits.
  b->arena_reserve(kMiB);
  EXPECT_NE(b->arena_base(), nullptr);
  EXPECT_EQ(b->memory_info().arena_bytes, kMiB);
}

TEST(CpuBackend, ArenaAndPoolAreTakenOnce) {
  auto b = backend_with_arena(4096, 4096);
  try {
    b->arena_reserve(4096);
    FAIL() << "a second arena_reserve succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b->host_pool_reserve(4096), Error);
  EXPECT_EQ(b->memory_info().arena_bytes, 4096u);
}

TEST(CpuBackend, ArenaIsAlignedAndUsable) {
  auto b = backend_with_arena(3 * kMiB + 5, 100);
  const size_t align = b->caps().alignment;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->arena_base()) % align, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->host_pool_base()) % align, 0u);
  std::memset(b->arena_base(), 0x5A, 3 * kMiB + 5);
  std::memset(b->host_pool_base(), 0x5A, 100);

  CpuBackendParams p;
  auto empty = make_cpu_backend(p);
  empty->arena_reserve(0);
  EXPECT_NE(empty->arena_base(), nullptr);
}

TEST(CpuBackend, KernelErrorSurfacesFromStreamSync) {
  auto b = backend_with_arena();
  constexpr size_t n = 1024;
  std::byte* x = b->arena_base();
  std::memset(x, 0, n);
  const EventId after = b->event_create();
  const kern::KernelArgs none{};
  const kern::KernelArgs fill = one_output(x, n, 7);

  b->launch(Stream::compute, kThrows, none);
  b->launch(Stream::compute, kThrowsOther, none);  // a second error does not replace the first
  b->event_record(Stream::compute, after);
  // Events behind the failure still complete, so nobody waits forever.
  b->event_sync(after);
  try {
    b->stream_sync(Stream::compute);
    FAIL() << "the kernel's error was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_throws"), std::string::npos) << msg;
    EXPECT_NE(msg.find("refuses its inputs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("compute"), std::string::npos) << msg;
  }
  // The error is reported once; the stream then runs new work normally.
  EXPECT_NO_THROW(b->stream_sync(Stream::compute));
  b->launch(Stream::compute, kSlowFill, fill);
  b->stream_sync(Stream::compute);
  EXPECT_TRUE(all_equal(x, n, 7));

  b->launch(Stream::h2d, kThrowsOther, none);
  try {
    b->stream_sync(Stream::h2d);
    FAIL() << "the kernel's error was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("plain runtime_error"), std::string::npos) << e.what();
  }
  b->sync_all();
}

TEST(CpuBackend, SyncAllFinishesEveryStreamBeforeRethrowing) {
  auto b = backend_with_arena();
  constexpr size_t n = 4096;
  std::byte* src = b->arena_base();
  std::byte* dst = b->host_pool_base();
  std::memset(src, 0x11, n);
  std::memset(dst, 0x00, n);
  const EventId filled = b->event_create();
  const kern::KernelArgs fill = one_output(src, n, 0xCD);
  const kern::KernelArgs none{};

  b->launch(Stream::h2d, kSlowFill, fill);
  b->event_record(Stream::h2d, filled);
  b->stream_wait(Stream::d2h, filled);
  b->copy_async(Stream::d2h, dst, src, n);
  b->launch(Stream::compute, kThrows, none);
  // The compute stream fails at once; the copy behind the slow kernel must
  // still be done when the error reaches the caller.
  EXPECT_THROW(b->sync_all(), Error);
  EXPECT_TRUE(all_equal(dst, n, 0xCD));
  EXPECT_NO_THROW(b->sync_all());
}

TEST(CpuBackend, ThousandsOfTasksRunInOrderWithoutAllocating) {
  auto b = backend_with_arena();
  constexpr int kTasks = static_cast<int>(cpu::kStreamQueueCapacity) * 8;
  auto* counters = reinterpret_cast<int64_t*>(b->arena_base());
  counters[0] = 0;  // next expected index
  counters[1] = 0;  // out-of-order calls
  std::vector<kern::KernelArgs> args(static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) {
    kern::KernelArgs& a = args[static_cast<size_t>(i)];
    a.n_out = 2;
    a.out[0].data = &counters[0];
    a.out[1].data = &counters[1];
    a.attrs.set("i", i);
  }
  // Copies on the d2h stream run alongside and move a growing byte pattern.
  std::byte* host = b->host_pool_base();
  std::byte* src = b->arena_base() + 4096;
  for (int i = 0; i < 256; ++i) src[i] = static_cast<std::byte>(i);
  const EventId e = b->event_create();

  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < kTasks; ++i) {
    b->launch(Stream::compute, kCheckOrder, args[static_cast<size_t>(i)]);
    if (i % 4 == 0) b->copy_async(Stream::d2h, host + (i / 4) % 256, src + (i / 4) % 256, 1);
    if (i % 1000 == 999) {
      b->event_record(Stream::compute, e);
      b->stream_wait(Stream::h2d, e);
    }
  }
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << "queueing work allocated";

  b->sync_all();
  EXPECT_EQ(counters[0], kTasks);
  EXPECT_EQ(counters[1], 0);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(host[i], static_cast<std::byte>(i));
}

TEST(CpuBackend, DestructionDrainsQueuedWork) {
  std::vector<uint8_t> out(256, 0);
  const kern::KernelArgs fill = one_output(out.data(), 256, 9);
  {
    auto b = backend_with_arena();
    b->launch(Stream::compute, kSlowFill, fill);
    b->copy_async(Stream::h2d, b->arena_base(), b->host_pool_base(), 1024);
  }
  for (uint8_t v : out) EXPECT_EQ(v, 9);
}

TEST(CpuBackend, BadCallsAreInvalidArguments) {
  auto b = backend_with_arena();
  const auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return POOCH_OK;
  };
  EXPECT_EQ(code_of([&] { b->event_record(Stream::compute, 5); }), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of([&] { b->event_sync(-1); }), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of([&] { b->copy_async(Stream::d2h, nullptr, b->arena_base(), 8); }),
            POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of([&] { b->copy_async(Stream::d2h, b->arena_base() + 4, b->arena_base(), 8); }),
            POOCH_ERR_INVALID_ARG);
  const kern::KernelVariant no_fn{"x", "y", nullptr, nullptr, true};
  const kern::KernelArgs none{};
  EXPECT_EQ(code_of([&] { b->launch(Stream::compute, no_fn, none); }), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of([&] { b->stream_sync(static_cast<Stream>(7)); }), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of([] {
              CpuBackendParams p;
              p.threads = -2;
              make_cpu_backend(p);
            }),
            POOCH_ERR_INVALID_ARG);
  b->sync_all();
}

TEST(CpuBackend, MemoryInfoAndCapsAreSane) {
  CpuBackendParams p;
  p.device_budget = 8 * kMiB;
  auto b = make_cpu_backend(p);
  b->arena_reserve(2 * kMiB);
  b->host_pool_reserve(3 * kMiB);
  const MemoryInfo m = b->memory_info();
  EXPECT_GT(m.total, 64 * kMiB);
  EXPECT_GT(m.free, 0u);
  EXPECT_LE(m.free, m.total);
  EXPECT_EQ(m.budget, 8 * kMiB);
  EXPECT_EQ(m.arena_bytes, 2 * kMiB);
  EXPECT_EQ(m.host_pool_bytes, 3 * kMiB);
  EXPECT_FALSE(m.host_pool_pinned);

  const BackendCaps c = b->caps();
  EXPECT_TRUE(c.async_copies);
  EXPECT_TRUE(c.host_is_device);
  EXPECT_EQ(c.alignment, 256u);
  EXPECT_STREQ(b->name(), "cpu");

  auto unlimited = make_cpu_backend(CpuBackendParams{});
  EXPECT_EQ(unlimited->memory_info().budget, unlimited->memory_info().total);
  EXPECT_GE(static_cast<cpu::CpuBackend*>(unlimited.get())->threads(), 1);
}

TEST(CpuBackend, FindKernelFollowsTheTableOrder) {
  auto b = make_cpu_backend(CpuBackendParams{});
  EXPECT_EQ(b->find_kernel("no_such_op"), nullptr);
  for (const kern::KernelVariant& k : b->kernels()) {
    const kern::KernelVariant* found = b->find_kernel(k.op);
    ASSERT_NE(found, nullptr) << k.op;
    EXPECT_STREQ(found->op, k.op);
    const kern::KernelVariant* exact = b->find_kernel(k.op, k.variant);
    ASSERT_NE(exact, nullptr);
    EXPECT_STREQ(exact->variant, k.variant);
    const kern::KernelVariant* det = b->find_kernel(k.op, {}, true);
    if (det != nullptr) {
      EXPECT_TRUE(det->deterministic);
    }
  }
}

// ---- what the kernels say they take (KernelVariant::supports) ---------------

kern::TensorView operand(DType dt, std::initializer_list<int64_t> shape) {
  kern::TensorView v;
  v.dtype = dt;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) v.shape[i++] = d;
  return v;
}

kern::KernelArgs args_of(std::initializer_list<kern::TensorView> in,
                         std::initializer_list<kern::TensorView> out) {
  kern::KernelArgs a;
  for (const kern::TensorView& v : in) a.in[a.n_in++] = v;
  for (const kern::TensorView& v : out) a.out[a.n_out++] = v;
  return a;
}

bool supports(const kern::KernelVariant* k, const kern::KernelArgs& a) {
  return k != nullptr && (!k->supports || k->supports(a));
}

TEST(CpuKernels, SupportsRefusesWhatAKernelCannotCompute) {
  auto b = make_cpu_backend(CpuBackendParams{0, 3});
  // What a CPU kernel takes from its device at plan time: the thread count.
  ASSERT_NE(b->kernel_device(), nullptr);
  EXPECT_EQ(static_cast<const kern::CpuDevice*>(b->kernel_device())->threads, 3);
  const kern::KernelVariant* relu = b->find_kernel("relu");
  ASSERT_NE(relu, nullptr);
  EXPECT_TRUE(
      supports(relu, args_of({operand(DType::f32, {3, 5})}, {operand(DType::f32, {3, 5})})));
  EXPECT_FALSE(
      supports(relu, args_of({operand(DType::f64, {3, 5})}, {operand(DType::f64, {3, 5})})));

  // f32 rank 3 linear is taken; f64 is not (the reference's alone).
  const kern::KernelVariant* lin = b->find_kernel("linear");
  ASSERT_NE(lin, nullptr);
  EXPECT_TRUE(supports(lin, args_of({operand(DType::f32, {2, 3, 4}), operand(DType::f32, {5, 4})},
                                    {operand(DType::f32, {2, 3, 5})})));
  EXPECT_FALSE(supports(lin, args_of({operand(DType::f64, {2, 3, 4}), operand(DType::f64, {5, 4})},
                                     {operand(DType::f64, {2, 3, 5})})));

  // The FFI kernels read u16 or i32 indices, nothing else.
  for (const kern::KernelVariant& k : b->kernels()) {
    if (std::string(k.op) != "ffi_linear") continue;
    auto ffi = [](DType index) {
      return args_of({operand(DType::f32, {2, 8}), operand(index, {3, 2}),
                      operand(DType::f32, {3, 2}), operand(DType::f32, {3})},
                     {operand(DType::f32, {2, 3})});
    };
    EXPECT_TRUE(supports(&k, ffi(DType::u16))) << k.variant;
    EXPECT_TRUE(supports(&k, ffi(DType::i32))) << k.variant;
    EXPECT_FALSE(supports(&k, ffi(DType::u8))) << k.variant;
  }

  // Layout ops move elements of any dtype.
  const kern::KernelVariant* tr = b->find_kernel("transpose");
  ASSERT_NE(tr, nullptr);
  EXPECT_TRUE(supports(tr, args_of({operand(DType::u16, {3, 5})}, {operand(DType::u16, {5, 3})})));
}

// The optimizer updates' bits are optim_params.h's element functions' on
// every CPU (the kernel's vector clone for this machine against the
// functions compiled here for the baseline, with fma in software), as the
// CUDA kernels' are: an update that runs on the host in one plan and on the
// device in another changes nothing.
TEST(CpuKernels, OptimizerUpdatesGiveTheElementFunctionsBits) {
  auto b = make_cpu_backend(CpuBackendParams{0, 2});
  constexpr int64_t n = 70001;  // several threads' chunks and a ragged tail
  std::vector<float> w0(n), g(n), m0(n), v0(n);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // xorshift: values over several decades, both signs
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
    return (u - 0.5f) * std::ldexp(1.0f, static_cast<int>(x % 13) - 6);
  };
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = next();
    g[i] = next();
    m0[i] = next();
    v0[i] = std::fabs(next());
  }
  kern::KernelContext ctx;
  ctx.step = 7;
  ctx.lr_scale = 0.8;
  const float sumsq = 1.7e4f;  // a norm above max_norm: the gradient is clipped
  for (const char* op : {"sgd_update", "adam_update"})
    for (int variant = 0; variant < 4; ++variant) {
      const bool adam = std::string(op) == "adam_update";
      const bool clip = variant & 1, second = variant & 2;  // AdamW, or SGD without momentum
      std::vector<float> w = w0, m = m0, v = v0;
      kern::KernelArgs a;
      auto f32 = [&](float* p) {
        kern::TensorView t;
        t.data = p;
        t.ndim = 1;
        t.shape[0] = n;
        return t;
      };
      a.in[a.n_in++] = f32(w.data());
      a.in[a.n_in++] = f32(g.data());
      a.in[a.n_in++] = f32(m.data());
      if (adam) a.in[a.n_in++] = f32(v.data());
      float s = sumsq;
      if (clip) {
        a.in[a.n_in] = f32(&s);
        a.in[a.n_in].shape[0] = 1;
        ++a.n_in;
      }
      ASSERT_TRUE(a.attrs.set("lr", adam ? 0.003 : 0.15));
      ASSERT_TRUE(a.attrs.set("weight_decay", 0.01));
      ASSERT_TRUE(a.attrs.set("max_norm", 1.0));
      if (adam) {
        ASSERT_TRUE(a.attrs.set("decoupled", second ? 1.0 : 0.0));
        ASSERT_TRUE(a.attrs.set("eps", 1e-4));
      } else {
        ASSERT_TRUE(a.attrs.set("momentum", second ? 0.0 : 0.9));
      }
      a.ctx = &ctx;
      a.device = b->kernel_device();
      const kern::KernelVariant* k = b->find_kernel(op, "omp");
      ASSERT_NE(k, nullptr) << op;
      k->fn(a);
      const float c = clip ? kern::clip_coef(sumsq, 1.0) : 1.0f;
      const kern::SgdParams sp = kern::sgd_params(a.attrs, &ctx);
      const kern::AdamParams ap = kern::adam_params(a.attrs, &ctx);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        float wi = w0[i], mi = m0[i], vi = v0[i];
        if (adam)
          kern::adam_element(ap, c, wi, g[i], mi, vi);
        else
          kern::sgd_element(sp, c, wi, g[i], sp.momentum == 0.0f ? nullptr : &mi);
        differ += std::memcmp(&wi, &w[i], 4) != 0 || std::memcmp(&mi, &m[i], 4) != 0 ||
                  (adam && std::memcmp(&vi, &v[i], 4) != 0);
      }
      EXPECT_EQ(differ, 0) << op << " variant " << variant;
    }
}

// A oneDNN kernel's workspace holds its scratchpad and the operands it
// reorders to blocked layouts; given less than it asked for at plan time,
// it refuses (an error from the stream) instead of writing past it.
TEST(CpuKernels, AOneDnnKernelRefusesAWorkspaceSmallerThanItAskedFor) {
  auto b = backend_with_arena(8 * kMiB);
  const kern::KernelVariant* conv = b->find_kernel("conv2d");
  ASSERT_NE(conv, nullptr);
  ASSERT_NE(conv->workspace, nullptr);
  // x[2,16,8,8] * w[16,16,3,3], same padding: oneDNN reorders all three.
  kern::KernelArgs a =
      args_of({operand(DType::f32, {2, 16, 8, 8}), operand(DType::f32, {16, 16, 3, 3})},
              {operand(DType::f32, {2, 16, 8, 8})});
  for (const char* k : {"stride_h", "stride_w", "dil_h", "dil_w", "groups"}) a.attrs.set(k, 1);
  for (const char* k : {"pad_h", "pad_w"}) a.attrs.set(k, 1);
  a.device = b->kernel_device();
  const size_t ws = conv->workspace(a);
  ASSERT_GT(ws, 0u);
  std::byte* at = b->arena_base();
  std::memset(at, 0, 8 * kMiB);
  size_t off = 0;
  for (int i = 0; i < 2; ++i) {
    a.in[i].data = at + off;
    off += static_cast<size_t>(a.in[i].numel()) * 4;
  }
  a.out[0].data = at + off;
  off += static_cast<size_t>(a.out[0].numel()) * 4;
  off = (off + 63) / 64 * 64;
  a.workspace = at + off;
  a.workspace_bytes = ws;
  b->launch(Stream::compute, *conv, a);
  EXPECT_NO_THROW(b->stream_sync(Stream::compute));
  for (const size_t given : {ws - 1, size_t{0}}) {
    a.workspace_bytes = given;
    if (given == 0) a.workspace = nullptr;
    b->launch(Stream::compute, *conv, a);
    try {
      b->stream_sync(Stream::compute);
      ADD_FAILURE() << "a workspace of " << given << " bytes of " << ws << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs a workspace of " + std::to_string(ws)),
                std::string::npos)
          << e.what();
    }
  }
}

// A recompute of a batch normalisation's output runs batchnorm_replay: it
// must give the forward pass's bits (at the thread count the step runs at,
// over enough channels and values to spread over the threads, with a mean
// far from 0) and write nothing but y.
TEST(CpuKernels, BatchnormReplayRemakesTheForwardOutputBitForBit) {
  auto b = backend_with_arena(8 * kMiB);
  const kern::KernelVariant* bn = b->find_kernel("batchnorm");
  const kern::KernelVariant* replay = b->find_kernel("batchnorm_replay");
  ASSERT_NE(bn, nullptr);
  ASSERT_NE(replay, nullptr);
  const int64_t N = 4, C = 24, H = 13, W = 11, n = N * C * H * W;
  float* at = reinterpret_cast<float*>(b->arena_base());
  float *x = at, *gamma = x + n, *beta = gamma + C, *rmean = beta + C, *rvar = rmean + C,
        *y = rvar + C, *mean = y + n, *var = mean + C, *y2 = var + C;
  for (int64_t i = 0; i < n; ++i) x[i] = 3.0f + std::sin(0.37f * static_cast<float>(i));
  for (int64_t c = 0; c < C; ++c) {
    gamma[c] = 0.5f + 0.1f * static_cast<float>(c);
    beta[c] = -0.25f * static_cast<float>(c);
    rmean[c] = 0.1f;
    rvar[c] = 2.0f;
  }
  kern::KernelArgs a = args_of(
      {operand(DType::f32, {N, C, H, W}), operand(DType::f32, {C}), operand(DType::f32, {C}),
       operand(DType::f32, {C}), operand(DType::f32, {C})},
      {operand(DType::f32, {N, C, H, W}), operand(DType::f32, {C}), operand(DType::f32, {C})});
  a.attrs.set("eps", 1e-5);
  a.attrs.set("momentum", 0.1);
  a.device = b->kernel_device();
  float* in[] = {x, gamma, beta, rmean, rvar};
  float* out[] = {y, mean, var};
  for (int i = 0; i < 5; ++i) a.in[i].data = in[i];
  for (int i = 0; i < 3; ++i) a.out[i].data = out[i];
  b->launch(Stream::compute, *bn, a);
  b->stream_sync(Stream::compute);
  const std::vector<float> moved(rmean, rvar + C);  // the running averages after one step
  kern::KernelArgs r = args_of({a.in[0], a.in[1], a.in[2]}, {a.out[0]});
  r.out[0].data = y2;
  r.attrs = a.attrs;
  r.device = a.device;
  b->launch(Stream::compute, *replay, r);
  b->stream_sync(Stream::compute);
  EXPECT_EQ(std::memcmp(y, y2, static_cast<size_t>(n) * 4), 0) << "the replay's bits differ";
  EXPECT_EQ(std::vector<float>(rmean, rvar + C), moved) << "the replay moved the running averages";
  EXPECT_NE(moved[0], 0.1f);  // the forward pass did move them
}

}  // namespace
}  // namespace pooch
