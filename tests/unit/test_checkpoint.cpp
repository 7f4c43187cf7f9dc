// Resuming from a checkpoint continues bit for bit: N steps straight equal
// N/2 steps, a checkpoint written on cancel, a fresh process-like reload, and
// the remaining steps. Exercised through the public API, as an embedding
// application would.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "pooch/pooch.h"

namespace {

struct Data {
  pooch_dataset* train = nullptr;
  pooch_dataset* test = nullptr;
  Data() {
    EXPECT_EQ(pooch_dataset_create_synth("EURLex-4K", 0.05, 7, &train, &test), POOCH_OK)
        << pooch_last_error();
  }
  ~Data() {
    pooch_dataset_free(&train);
    pooch_dataset_free(&test);
  }
};

std::string spec_json(const Data& d) {
  int64_t f = 0, l = 0;
  pooch_dataset_shape(d.train, nullptr, &f, &l);
  const int64_t nnz = pooch_dataset_max_batch_nnz(d.train, 32);
  const int64_t labels = pooch_dataset_max_batch_labels(d.train, 32);
  return "{\"input\": {\"kind\": \"sparse\", \"width\": " + std::to_string(f) +
         "}, \"labels\": " + std::to_string(l) +
         ", \"layers\": [{\"type\": \"linear\", \"width\": 32}, {\"type\": \"dropout\", \"p\": "
         "0.2},"
         " {\"type\": \"ffi\", \"fan_in\": 8}], \"batch\": 32, \"loss\": \"squared-hinge\", "
         "\"max_nnz\": " +
         std::to_string(nnz) + ", \"max_labels\": " + std::to_string(labels) + "}";
}

std::vector<char> read_tensor(pooch_session* s, const char* name) {
  size_t bytes = 0;
  EXPECT_EQ(pooch_session_read_tensor(s, name, nullptr, &bytes), POOCH_OK);
  std::vector<char> out(bytes);
  EXPECT_EQ(pooch_session_read_tensor(s, name, out.data(), &bytes), POOCH_OK);
  return out;
}

struct StopAt {
  int64_t at;
};
int stop_at(void* user, int64_t step, float, int, int64_t, int64_t) {
  return step < static_cast<StopAt*>(user)->at;
}

pooch_train_params train_params(const std::string& ckpt, StopAt* stop) {
  pooch_train_params p;
  pooch_train_default_params(&p);
  p.epochs = 3;
  p.warmup_steps = 5;
  p.plateau_patience = 1;  // exercise the schedule state too
  p.checkpoint_path = ckpt.c_str();
  if (stop) {
    p.on_step = stop_at;
    p.user = stop;
  }
  return p;
}

pooch_session* session(pooch_model* m) {
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 2;
  sp.learning_rate = 5e-3f;
  pooch_session* s = nullptr;
  EXPECT_EQ(pooch_session_create(m, &sp, &s), POOCH_OK) << pooch_last_error();
  return s;
}

}  // namespace

TEST(Checkpoint, ResumeIsBitwiseIdenticalToAStraightRun) {
  Data d;
  const std::string dir =
      std::filesystem::temp_directory_path() / ("pooch_ckpt_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string straight_ckpt = dir + "/straight.ckpt", split_ckpt = dir + "/split.ckpt";
  const std::string spec = spec_json(d);

  pooch_model* m = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(spec.c_str(), "test", &m), POOCH_OK) << pooch_last_error();
  pooch_session* a = session(m);
  auto p = train_params(straight_ckpt, nullptr);
  ASSERT_EQ(pooch_train(a, d.train, d.test, &p), POOCH_OK) << pooch_last_error();

  // The same run, stopped in the middle of the second epoch.
  pooch_session* b = session(m);
  int64_t rows = 0;
  pooch_dataset_shape(d.train, &rows, nullptr, nullptr);
  StopAt stop{(rows + 31) / 32 + 3};
  auto p2 = train_params(split_ckpt, &stop);
  ASSERT_EQ(pooch_train(b, d.train, d.test, &p2), POOCH_ERR_CANCELLED);
  pooch_session_free(&b);

  pooch_model* resumed_model = nullptr;
  ASSERT_EQ(pooch_model_load(split_ckpt.c_str(), &resumed_model), POOCH_OK) << pooch_last_error();
  EXPECT_EQ(pooch_model_is_checkpoint(resumed_model), 1);
  pooch_session* c = session(resumed_model);
  auto p3 = train_params(split_ckpt, nullptr);
  ASSERT_EQ(pooch_train(c, d.train, d.test, &p3), POOCH_OK) << pooch_last_error();

  for (const char* t : {"fc0.weight", "fc0.bias", "head.weight", "head.bias", "head.index",
                        "head.weight.m", "head.weight.v", "fc0.weight.m"})
    EXPECT_EQ(read_tensor(a, t), read_tensor(c, t)) << t;

  pooch_session_free(&a);
  pooch_session_free(&c);
  pooch_model_free(&m);
  pooch_model_free(&resumed_model);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, ModelFileRoundTripPredictsTheSame) {
  Data d;
  const std::string path = std::filesystem::temp_directory_path() /
                           ("pooch_model_" + std::to_string(getpid()) + ".pooch");
  const std::string spec = spec_json(d);
  pooch_model* m = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(spec.c_str(), "test", &m), POOCH_OK);
  pooch_session* s = session(m);
  auto p = train_params("", nullptr);
  p.checkpoint_path = nullptr;
  p.epochs = 1;
  ASSERT_EQ(pooch_train(s, d.train, nullptr, &p), POOCH_OK) << pooch_last_error();
  ASSERT_EQ(pooch_session_save(s, path.c_str()), POOCH_OK) << pooch_last_error();
  pooch_model* loaded = nullptr;
  ASSERT_EQ(pooch_model_load(path.c_str(), &loaded), POOCH_OK) << pooch_last_error();
  EXPECT_EQ(pooch_model_is_checkpoint(loaded), 0);
  pooch_session* s2 = session(loaded);
  pooch_metrics before, after;
  ASSERT_EQ(pooch_evaluate(s, d.test, d.train, 0.55f, 1.5f, &before), POOCH_OK);
  ASSERT_EQ(pooch_evaluate(s2, d.test, d.train, 0.55f, 1.5f, &after), POOCH_OK);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(before.precision[k], after.precision[k]);
    EXPECT_EQ(before.psp[k], after.psp[k]);
  }
  EXPECT_EQ(before.has_psp, 1);
  // A damaged file is refused with the file named, and nothing is half-loaded.
  {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 200, SEEK_SET);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  pooch_model* bad = nullptr;
  EXPECT_EQ(pooch_model_load(path.c_str(), &bad), POOCH_ERR_BAD_INPUT);
  EXPECT_EQ(bad, nullptr);
  EXPECT_NE(std::string(pooch_last_error()).find(path), std::string::npos) << pooch_last_error();
  pooch_session_free(&s);
  pooch_session_free(&s2);
  pooch_model_free(&m);
  pooch_model_free(&loaded);
  std::remove(path.c_str());
}
