// Two sessions in two threads of one process, through the C API alone: each
// trains as if it were alone. Same model spec, same data, same seeds; the
// weights and optimizer state after training must equal, bit for bit, those
// of one session trained alone. A shared mutable state anywhere below the
// API (an RNG, a scratch buffer, a kernel table, OpenMP or OpenBLAS state)
// shows up here as different bits or a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "pooch/pooch.h"

namespace {

struct Weights {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> bytes;
};

struct Run {
  pooch_status status = POOCH_ERR_INTERNAL;
  std::string error;
  Weights weights;
  int64_t steps = 0;
};

int count_steps(void* user, int64_t, float, int, int64_t, int64_t) {
  ++*static_cast<int64_t*>(user);
  return 1;
}

// The names of the persistent tensors (weights, and the optimizer state
// pooch_session_read_tensor reads by "<weight>.m" and "<weight>.v" for Adam),
// from the description of a model file the session writes.
std::vector<std::string> persistent_names(pooch_session* s, const std::string& path) {
  std::vector<std::string> names;
  if (pooch_session_save(s, path.c_str()) != POOCH_OK) return names;
  char* text = nullptr;
  if (pooch_file_describe(path.c_str(), &text) != POOCH_OK) return names;
  const nlohmann::json doc = nlohmann::json::parse(text);
  pooch_string_free(&text);
  std::remove(path.c_str());
  for (const auto& t : doc.at("tensors"))
    if (t.at("role") == "weight") {
      const std::string w = t.at("name");
      names.push_back(w);
      for (const char* suffix : {".m", ".v"}) {
        size_t n = 0;
        if (pooch_session_read_tensor(s, (w + suffix).c_str(), nullptr, &n) == POOCH_OK)
          names.push_back(w + suffix);
      }
    }
  return names;
}

// One whole training run: its own data set, model and session, as a thread
// of a host program would make them.
Run train_one(int threads, const std::string& scratch) {
  Run r;
  pooch_planted_params dp;
  pooch_planted_default_params(&dp);
  dp.rows = 4096;
  dp.features = 500;
  dp.labels = 100;
  dp.seed = 5;
  pooch_dataset* ds = nullptr;
  pooch_model* model = nullptr;
  pooch_session* s = nullptr;
  auto fail = [&](pooch_status st) {
    r.status = st;
    r.error = pooch_last_error();
    pooch_session_free(&s);
    pooch_model_free(&model);
    pooch_dataset_free(&ds);
    return r;
  };
  if (pooch_status st = pooch_dataset_create_planted(&dp, &ds)) return fail(st);
  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = dp.features;
  mp.labels = dp.labels;
  mp.hidden = 64;
  mp.fan_in = 16;
  mp.batch_size = 32;
  mp.dropout = 0.2f;  // the dropout RNG too must be the session's own
  mp.seed = 11;
  if (pooch_status st = pooch_model_create_xmc(&mp, &model)) return fail(st);
  if (pooch_status st =
          pooch_model_set_run_shape(model, 0, pooch_dataset_max_batch_nnz(ds, mp.batch_size), 0))
    return fail(st);
  if (pooch_status st =
          pooch_model_set_max_labels(model, pooch_dataset_max_batch_labels(ds, mp.batch_size)))
    return fail(st);
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = threads;
  sp.optimizer = POOCH_OPT_ADAMW;
  sp.weight_decay = 0.01f;
  if (pooch_status st = pooch_session_create(model, &sp, &s)) return fail(st);
  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = 3;
  tp.data_seed = 9;
  tp.on_step = count_steps;
  tp.user = &r.steps;
  if (pooch_status st = pooch_train(s, ds, nullptr, &tp)) return fail(st);
  r.weights.names = persistent_names(s, scratch);
  for (const std::string& name : r.weights.names) {
    size_t n = 0;
    if (pooch_status st = pooch_session_read_tensor(s, name.c_str(), nullptr, &n)) return fail(st);
    std::vector<uint8_t> v(n);
    if (pooch_status st = pooch_session_read_tensor(s, name.c_str(), v.data(), &n)) return fail(st);
    r.weights.bytes.push_back(std::move(v));
  }
  pooch_session_free(&s);
  pooch_model_free(&model);
  pooch_dataset_free(&ds);
  r.status = POOCH_OK;
  return r;
}

std::string scratch_path(const char* tag) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/pooch-threads-" + std::to_string(getpid()) +
         "-" + tag + ".pooch";
}

void expect_same_bits(const Run& alone, const Run& other, const char* who) {
  ASSERT_EQ(other.status, POOCH_OK) << who << ": " << other.error;
  EXPECT_EQ(other.steps, alone.steps) << who;
  ASSERT_EQ(other.weights.names, alone.weights.names) << who;
  for (size_t i = 0; i < alone.weights.names.size(); ++i)
    EXPECT_TRUE(other.weights.bytes[i] == alone.weights.bytes[i])
        << who << ": tensor '" << alone.weights.names[i] << "' differs from the run alone";
}

void two_sessions_in_two_threads(int threads) {
  const Run alone = train_one(threads, scratch_path("alone"));
  ASSERT_EQ(alone.status, POOCH_OK) << alone.error;
  ASSERT_GT(alone.steps, 0);
  // hidden and head weights and biases, each with Adam's two moments.
  ASSERT_GE(alone.weights.names.size(), 6u);

  Run a, b;
  std::thread ta([&] { a = train_one(threads, scratch_path("a")); });
  std::thread tb([&] { b = train_one(threads, scratch_path("b")); });
  ta.join();
  tb.join();
  expect_same_bits(alone, a, "thread a");
  expect_same_bits(alone, b, "thread b");
}

}  // namespace

TEST(Threads, TwoSessionsOneThreadEachGiveTheBitsOfOneAlone) {
  two_sessions_in_two_threads(1);
}

// Each session's kernels run in OpenMP teams and OpenBLAS calls of two threads.
TEST(Threads, TwoSessionsTwoThreadsEachGiveTheBitsOfOneAlone) {
  two_sessions_in_two_threads(2);
}
