// A good guest: a host process with a pooch session burns no CPU while the
// session is idle. After training steps that ran parallel kernels (OpenMP
// teams, OpenBLAS threads), the process sleeps; the CPU time it uses
// meanwhile (getrusage RUSAGE_SELF, user + system: every thread) must stay
// near zero. A thread that busy-waits for work (OpenMP's and OpenBLAS's
// spinning) shows up here as CPU seconds.
//
// meson runs it with the settings pooch-run gives itself
// (OMP_WAIT_POLICY=passive, OPENBLAS_THREAD_TIMEOUT=4): libgomp and OpenBLAS
// read them when loaded, so the library cannot set them for its host
// (docs/RELIABILITY.md). Without them the idle spin is bounded but grows
// with the thread count, and this test may fail on a machine with many cores.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "pooch/pooch.h"

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

TEST(Idle, NoCpuWhileASessionWaits) {
  pooch_planted_params dp;
  pooch_planted_default_params(&dp);
  dp.rows = 1024;
  dp.features = 2000;
  dp.labels = 2000;
  pooch_dataset* ds = nullptr;
  ASSERT_EQ(pooch_dataset_create_planted(&dp, &ds), POOCH_OK) << pooch_last_error();
  // A dense head over 2000 labels: GEMMs for OpenBLAS and element-wise and
  // loss kernels large enough for OpenMP teams.
  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = dp.features;
  mp.labels = dp.labels;
  mp.hidden = 256;
  mp.fan_in = 0;
  mp.batch_size = 64;
  pooch_model* model = nullptr;
  ASSERT_EQ(pooch_model_create_xmc(&mp, &model), POOCH_OK) << pooch_last_error();
  ASSERT_EQ(pooch_model_set_run_shape(model, 0, pooch_dataset_max_batch_nnz(ds, 64), 0), POOCH_OK);
  ASSERT_EQ(pooch_model_set_max_labels(model, pooch_dataset_max_batch_labels(ds, 64)), POOCH_OK);
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  // At least two threads, whatever the machine: teams and a BLAS pool exist.
  sp.threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  pooch_session* s = nullptr;
  ASSERT_EQ(pooch_session_create(model, &sp, &s), POOCH_OK) << pooch_last_error();

  const double before_steps = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 16; ++i) {
    pooch_batch b;
    ASSERT_EQ(pooch_dataset_batch(ds, (i * 64) % dp.rows, 64, &b), POOCH_OK);
    float loss = 0;
    ASSERT_EQ(pooch_session_step(s, &b, &loss), POOCH_OK) << pooch_last_error();
  }
  const double step_wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double step_cpu = cpu_seconds() - before_steps;

  // POOCH_IDLE_SECONDS: a longer sleep for bench/reliability (2 s in CI).
  const char* env = std::getenv("POOCH_IDLE_SECONDS");
  const int idle_s = env && std::atoi(env) > 0 ? std::atoi(env) : 2;
  const double before_idle = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(idle_s));
  const double idle_cpu = cpu_seconds() - before_idle;
  std::printf("threads %d: 16 steps %.3f s wall, %.3f s CPU; idle %d s: %.3f s CPU\n", sp.threads,
              step_wall, step_cpu, idle_s, idle_cpu);
  RecordProperty("idle_cpu_ms", static_cast<int>(idle_cpu * 1000));
  EXPECT_LT(idle_cpu, 0.2) << "threads spin while the session is idle";

  // The session still works after its threads went to sleep.
  pooch_batch b;
  ASSERT_EQ(pooch_dataset_batch(ds, 0, 64, &b), POOCH_OK);
  float loss = 0;
  EXPECT_EQ(pooch_session_step(s, &b, &loss), POOCH_OK) << pooch_last_error();
  pooch_session_free(&s);
  pooch_model_free(&model);
  pooch_dataset_free(&ds);
}
