// The C API as an embedding application sees it: only pooch.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pooch/pooch.h"

namespace {

struct Fixture {
  pooch_dataset* ds = nullptr;
  pooch_model* model = nullptr;
  pooch_session* sess = nullptr;
  Fixture(size_t device_memory = 0, pooch_device device = POOCH_DEVICE_CPU) {
    pooch_planted_params dp;
    pooch_planted_default_params(&dp);
    dp.rows = 256;
    dp.features = 200;
    dp.labels = 40;
    EXPECT_EQ(pooch_dataset_create_planted(&dp, &ds), POOCH_OK);
    pooch_xmc_params mp;
    pooch_xmc_default_params(&mp);
    mp.features = 200;
    mp.labels = 40;
    mp.hidden = 32;
    mp.fan_in = 8;
    mp.batch_size = 16;
    EXPECT_EQ(pooch_model_create_xmc(&mp, &model), POOCH_OK);
    pooch_session_params sp;
    pooch_session_default_params(&sp);
    sp.device = device;
    sp.device_memory = device_memory;
    sp.threads = 1;
    status = pooch_session_create(model, &sp, &sess);
  }
  ~Fixture() {
    pooch_session_free(&sess);
    pooch_model_free(&model);
    pooch_dataset_free(&ds);
  }
  pooch_status status;
};

}  // namespace

TEST(Api, VersionAndStatusStrings) {
  // meson.build's project() version is the one place the version is written.
  EXPECT_STREQ(pooch_version_str(), POOCH_MESON_PROJECT_VERSION);
  EXPECT_STREQ(POOCH_VERSION_STRING, POOCH_MESON_PROJECT_VERSION);
  EXPECT_EQ(pooch_version(), (static_cast<unsigned>(POOCH_VERSION_MAJOR) << 16) |
                                 (POOCH_VERSION_MINOR << 8) | POOCH_VERSION_PATCH);
  EXPECT_EQ(std::to_string(POOCH_VERSION_MAJOR) + "." + std::to_string(POOCH_VERSION_MINOR) + "." +
                std::to_string(POOCH_VERSION_PATCH),
            POOCH_MESON_PROJECT_VERSION);
  EXPECT_STREQ(pooch_status_str(POOCH_OK), "ok");
  for (int s = -1; s >= -9; --s)
    EXPECT_STRNE(pooch_status_str(static_cast<pooch_status>(s)), "unknown status") << s;
}

// Every struct the caller allocates ends in reserved bytes that the
// defaults (or the library, for results) leave zero.
template <typename T>
bool reserved_zero(const T& s) {
  for (const uint8_t b : s.reserved)
    if (b != 0) return false;
  return sizeof(s.reserved) >= 8;
}

// New fields take the place of reserved bytes: the structs keep the size
// they had in 0.1.0 (x86-64), so programs built then still work.
static_assert(sizeof(void*) != 8 || sizeof(pooch_session_params) == 136,
              "pooch_session_params changed size");
static_assert(sizeof(void*) != 8 || sizeof(pooch_memory_report) == 128,
              "pooch_memory_report changed size");

TEST(Api, StructsEndInZeroedReservedBytes) {
  pooch_xmc_params x;
  std::memset(&x, 0xAB, sizeof x);
  pooch_xmc_default_params(&x);
  EXPECT_TRUE(reserved_zero(x));
  pooch_session_params s;
  std::memset(&s, 0xAB, sizeof s);
  pooch_session_default_params(&s);
  EXPECT_TRUE(reserved_zero(s));
  pooch_planted_params p;
  std::memset(&p, 0xAB, sizeof p);
  pooch_planted_default_params(&p);
  EXPECT_TRUE(reserved_zero(p));
  pooch_train_params t;
  std::memset(&t, 0xAB, sizeof t);
  pooch_train_default_params(&t);
  EXPECT_TRUE(reserved_zero(t));

  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK);
  pooch_memory_report m;
  std::memset(&m, 0xAB, sizeof m);
  ASSERT_EQ(pooch_session_memory(f.sess, &m), POOCH_OK);
  EXPECT_TRUE(reserved_zero(m));
  pooch_metrics e;
  std::memset(&e, 0xAB, sizeof e);
  ASSERT_EQ(pooch_evaluate(f.sess, f.ds, nullptr, 0.55f, 1.5f, &e), POOCH_OK);
  EXPECT_TRUE(reserved_zero(e));
}

TEST(Api, NullArgumentsAreErrorsWithMessages) {
  pooch_model* m = nullptr;
  EXPECT_EQ(pooch_model_create_xmc(nullptr, &m), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("pooch_model_create_xmc"), std::string::npos);
  EXPECT_EQ(pooch_session_step(nullptr, nullptr, nullptr), POOCH_ERR_INVALID_ARG);
  pooch_model_free(nullptr);
  pooch_session_free(nullptr);
}

TEST(Api, BadModelParametersNameTheField) {
  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = 100;
  mp.labels = 0;
  pooch_model* m = nullptr;
  EXPECT_EQ(pooch_model_create_xmc(&mp, &m), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(pooch_last_error()).find("labels"), std::string::npos)
      << pooch_last_error();
}

TEST(Api, TrainPredictAndReadBack) {
  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK) << pooch_last_error();
  pooch_batch b;
  ASSERT_EQ(pooch_dataset_batch(f.ds, 0, 16, &b), POOCH_OK);
  float first = 0, loss = 0;
  ASSERT_EQ(pooch_session_step(f.sess, &b, &first), POOCH_OK) << pooch_last_error();
  for (int i = 0; i < 30; ++i) ASSERT_EQ(pooch_session_step(f.sess, &b, &loss), POOCH_OK);
  EXPECT_LT(loss, first);
  std::vector<int32_t> labels(16 * 3);
  std::vector<float> scores(16 * 3);
  ASSERT_EQ(pooch_session_predict(f.sess, &b, 3, labels.data(), scores.data()), POOCH_OK);
  for (int r = 0; r < 16; ++r) {
    EXPECT_GE(scores[r * 3], scores[r * 3 + 1]);
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(labels[r * 3 + j] >= 0 && labels[r * 3 + j] < 40);
  }
  EXPECT_EQ(pooch_session_predict(f.sess, &b, 6, labels.data(), scores.data()),
            POOCH_ERR_INVALID_ARG);
  size_t bytes = 0;
  ASSERT_EQ(pooch_session_read_tensor(f.sess, "head.bias", nullptr, &bytes), POOCH_OK);
  EXPECT_EQ(bytes, 40u * 4u);
  std::vector<float> bias(40);
  ASSERT_EQ(pooch_session_read_tensor(f.sess, "head.bias", bias.data(), &bytes), POOCH_OK);
  EXPECT_EQ(pooch_session_read_tensor(f.sess, "nope", bias.data(), &bytes), POOCH_ERR_INVALID_ARG);
  pooch_memory_report mem;
  ASSERT_EQ(pooch_session_memory(f.sess, &mem), POOCH_OK);
  EXPECT_GT(mem.arena_bytes, 0u);
  EXPECT_STREQ(mem.backend, "cpu");
}

TEST(Api, BadBatchSaysWhereAndLosesNothing) {
  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK);
  const int64_t ptr[3] = {0, 2, 3};
  const int32_t col[3] = {1, 5, 999};  // 999 >= 200 features
  const float val[3] = {1, 1, 1};
  const int64_t lptr[3] = {0, 1, 1};
  const int32_t lab[1] = {3};
  pooch_batch b{2, ptr, col, val, lptr, lab, nullptr};
  EXPECT_EQ(pooch_session_step(f.sess, &b, nullptr), POOCH_ERR_BAD_INPUT);
  const std::string msg = pooch_last_error();
  EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("999"), std::string::npos) << msg;
  // The session is still usable.
  pooch_batch good;
  pooch_dataset_batch(f.ds, 0, 16, &good);
  EXPECT_EQ(pooch_session_step(f.sess, &good, nullptr), POOCH_OK);
}

TEST(Api, LabelBudgetAndDuplicateLabels) {
  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK);
  const int64_t ptr[2] = {0, 1};
  const int32_t col[1] = {3};
  const float val[1] = {1};
  // A repeated label counts once: the same loss as the row with it once.
  const int64_t lptr_dup[2] = {0, 3}, lptr_one[2] = {0, 1};
  const int32_t lab[3] = {7, 7, 7};
  pooch_batch dup{1, ptr, col, val, lptr_dup, lab, nullptr};
  pooch_batch one{1, ptr, col, val, lptr_one, lab, nullptr};
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  pooch_session* a = nullptr;
  pooch_session* b = nullptr;
  ASSERT_EQ(pooch_session_create(f.model, &sp, &a), POOCH_OK);
  ASSERT_EQ(pooch_session_create(f.model, &sp, &b), POOCH_OK);
  float la = 0, lb = 0;
  ASSERT_EQ(pooch_session_step(a, &dup, &la), POOCH_OK) << pooch_last_error();
  ASSERT_EQ(pooch_session_step(b, &one, &lb), POOCH_OK) << pooch_last_error();
  EXPECT_EQ(la, lb);
  pooch_session_free(&a);
  pooch_session_free(&b);

  // More labels than the model reserved: a clear error naming the fix.
  pooch_model* small = nullptr;
  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = 200;
  mp.labels = 40;
  mp.hidden = 8;
  mp.fan_in = 4;
  mp.batch_size = 1;
  ASSERT_EQ(pooch_model_create_xmc(&mp, &small), POOCH_OK);
  ASSERT_EQ(pooch_model_set_max_labels(small, 2), POOCH_OK);
  pooch_session* s = nullptr;
  ASSERT_EQ(pooch_session_create(small, &sp, &s), POOCH_OK);
  const int64_t lptr3[2] = {0, 3};
  const int32_t three[3] = {1, 2, 3};
  pooch_batch many{1, ptr, col, val, lptr3, three, nullptr};
  EXPECT_EQ(pooch_session_step(s, &many, nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("max_labels"), std::string::npos)
      << pooch_last_error();
  EXPECT_EQ(pooch_dataset_max_batch_labels(f.ds, 16) >= 16, true);
  pooch_session_free(&s);
  pooch_model_free(&small);
}

TEST(Api, CancelFromAnotherThread) {
  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK);
  std::thread t([&] { pooch_session_cancel(f.sess); });
  t.join();
  pooch_batch b;
  pooch_dataset_batch(f.ds, 0, 16, &b);
  EXPECT_EQ(pooch_session_step(f.sess, &b, nullptr), POOCH_ERR_CANCELLED);
  EXPECT_EQ(pooch_session_step(f.sess, &b, nullptr), POOCH_OK);
}

TEST(Api, TooSmallABudgetNamesTheMinimum) {
  Fixture f(4096);
  EXPECT_EQ(f.status, POOCH_ERR_OUT_OF_BUDGET);
  EXPECT_EQ(f.sess, nullptr);
  EXPECT_NE(std::string(pooch_last_error()).find("at least"), std::string::npos)
      << pooch_last_error();
  // The same figure in bytes: a session at that budget is made, at a byte
  // less it is not, and a call that succeeds clears it.
  const size_t needed = pooch_last_error_budget();
  ASSERT_GT(needed, 4096u);
  Fixture under(needed - 1);
  EXPECT_EQ(under.status, POOCH_ERR_OUT_OF_BUDGET) << pooch_last_error();
  EXPECT_EQ(pooch_last_error_budget(), needed);
  // Another failure names no budget.
  EXPECT_EQ(pooch_session_create(nullptr, nullptr, nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_last_error_budget(), 0u);
  Fixture at(needed);
  EXPECT_EQ(at.status, POOCH_OK) << pooch_last_error();
  EXPECT_EQ(pooch_last_error_budget(), 0u);
}

TEST(Api, CudaWithoutAGpuIsAClearError) {
  Fixture f(0, POOCH_DEVICE_CUDA);
  EXPECT_EQ(f.status, POOCH_ERR_NO_DEVICE);
  std::string msg = pooch_last_error();
  for (char& c : msg) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_NE(msg.find("cuda"), std::string::npos) << pooch_last_error();
  Fixture a(0, POOCH_DEVICE_AUTO);
  EXPECT_EQ(a.status, POOCH_OK);
}

static int stop_after_two(void* user, int64_t step, float) {
  *static_cast<int64_t*>(user) = step;
  return step < 2;
}

TEST(Api, ProgressCallbackCanCancel) {
  pooch_planted_params dp;
  pooch_planted_default_params(&dp);
  pooch_dataset* ds = nullptr;
  ASSERT_EQ(pooch_dataset_create_planted(&dp, &ds), POOCH_OK);
  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = dp.features;
  mp.labels = dp.labels;
  mp.hidden = 16;
  mp.fan_in = 4;
  pooch_model* m = nullptr;
  ASSERT_EQ(pooch_model_create_xmc(&mp, &m), POOCH_OK);
  int64_t seen = 0;
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.progress = stop_after_two;
  sp.progress_user = &seen;
  pooch_session* s = nullptr;
  ASSERT_EQ(pooch_session_create(m, &sp, &s), POOCH_OK);
  pooch_batch b;
  pooch_dataset_batch(ds, 0, 64, &b);
  EXPECT_EQ(pooch_session_step(s, &b, nullptr), POOCH_OK);
  EXPECT_EQ(pooch_session_step(s, &b, nullptr), POOCH_ERR_CANCELLED);
  EXPECT_EQ(seen, 2);
  pooch_session_free(&s);
  EXPECT_EQ(s, nullptr);
  pooch_model_free(&m);
  pooch_dataset_free(&ds);
}

TEST(Api, DatasetSplitHoldsOutSeededRowsInOrder) {
  Fixture f;
  pooch_dataset *rest = nullptr, *held = nullptr;
  ASSERT_EQ(pooch_dataset_split(f.ds, 40, 7, &rest, &held), POOCH_OK) << pooch_last_error();
  int64_t rr = 0, hr = 0, feat = 0, lab = 0;
  ASSERT_EQ(pooch_dataset_shape(rest, &rr, &feat, &lab), POOCH_OK);
  ASSERT_EQ(pooch_dataset_shape(held, &hr, nullptr, nullptr), POOCH_OK);
  EXPECT_EQ(rr, 216);
  EXPECT_EQ(hr, 40);
  EXPECT_EQ(feat, 200);
  EXPECT_EQ(lab, 40);
  // Every row of the set lands in exactly one part, each part in the set's order.
  const auto row_of = [](const pooch_dataset* d, int64_t r) {
    pooch_batch b{};
    EXPECT_EQ(pooch_dataset_batch(d, r, 1, &b), POOCH_OK);
    std::vector<float> v;
    for (int64_t i = b.row_ptr[0]; i < b.row_ptr[1]; ++i) {
      v.push_back(static_cast<float>(b.col[i]));
      v.push_back(b.val[i]);
    }
    for (int64_t i = b.label_ptr[0]; i < b.label_ptr[1]; ++i)
      v.push_back(static_cast<float>(-1 - b.label[i]));
    return v;
  };
  int64_t a = 0, h = 0;
  for (int64_t r = 0; r < 256; ++r) {
    const auto v = row_of(f.ds, r);
    if (a < rr && row_of(rest, a) == v)
      ++a;
    else if (h < hr && row_of(held, h) == v)
      ++h;
    else
      ADD_FAILURE() << "row " << r << " is in neither part, or out of order";
  }
  EXPECT_EQ(a, rr);
  EXPECT_EQ(h, hr);
  // The same seed holds out the same rows; another seed other rows.
  pooch_dataset *rest2 = nullptr, *held2 = nullptr, *rest3 = nullptr, *held3 = nullptr;
  ASSERT_EQ(pooch_dataset_split(f.ds, 40, 7, &rest2, &held2), POOCH_OK);
  ASSERT_EQ(pooch_dataset_split(f.ds, 40, 8, &rest3, &held3), POOCH_OK);
  bool same7 = true, same8 = true;
  for (int64_t r = 0; r < 40; ++r) {
    same7 = same7 && row_of(held, r) == row_of(held2, r);
    same8 = same8 && row_of(held, r) == row_of(held3, r);
  }
  EXPECT_TRUE(same7);
  EXPECT_FALSE(same8);
  pooch_dataset *x = nullptr, *y = nullptr;
  EXPECT_EQ(pooch_dataset_split(f.ds, 257, 7, &x, &y), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("held_out"), std::string::npos);
  EXPECT_EQ(x, nullptr);
  for (pooch_dataset** d : {&rest, &held, &rest2, &held2, &rest3, &held3}) pooch_dataset_free(d);
}

TEST(Api, WriteTensorReplacesAWeight) {
  Fixture f;
  ASSERT_EQ(f.status, POOCH_OK) << pooch_last_error();
  std::vector<float> bias(40);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i);
  ASSERT_EQ(pooch_session_write_tensor(f.sess, "head.bias", bias.data(), bias.size() * 4), POOCH_OK)
      << pooch_last_error();
  std::vector<float> back(40);
  size_t bytes = back.size() * 4;
  ASSERT_EQ(pooch_session_read_tensor(f.sess, "head.bias", back.data(), &bytes), POOCH_OK);
  EXPECT_EQ(back, bias);
  EXPECT_EQ(pooch_session_write_tensor(f.sess, "head.bias", bias.data(), 4), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("160 bytes"), std::string::npos)
      << pooch_last_error();
  EXPECT_EQ(pooch_session_write_tensor(f.sess, "nope", bias.data(), 4), POOCH_ERR_INVALID_ARG);
}

namespace {
std::vector<double> g_epoch_lr;
void record_lr(void*, const pooch_epoch_report* r) {
  g_epoch_lr.push_back(r->learning_rate);
}
}  // namespace

TEST(Api, CosineScheduleDecaysTheRateOverTheRun) {
  Fixture f;  // 256 rows, batch 16: 16 steps an epoch
  ASSERT_EQ(f.status, POOCH_OK) << pooch_last_error();
  pooch_train_params tp;
  pooch_train_default_params(&tp);
  EXPECT_EQ(tp.lr_schedule, POOCH_LR_PLATEAU);
  tp.epochs = 4;
  tp.plateau_patience = 0;
  tp.early_stop_patience = 0;
  tp.lr_schedule = POOCH_LR_COSINE;
  tp.min_lr_ratio = 0.1f;
  tp.on_epoch = record_lr;
  g_epoch_lr.clear();
  ASSERT_EQ(pooch_train(f.sess, f.ds, nullptr, &tp), POOCH_OK) << pooch_last_error();
  ASSERT_EQ(g_epoch_lr.size(), 4u);
  // The rate the next step would use: step 16e + 1 of 64 on half a cosine
  // from 1e-3 (the default rate) down to 1e-4.
  for (int e = 1; e <= 4; ++e) {
    const double t = (16.0 * e) / 63.0;
    const double want =
        1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(3.14159265358979323846 * std::min(t, 1.0))));
    EXPECT_NEAR(g_epoch_lr[e - 1], want, 1e-9) << "epoch " << e;
  }
  tp.min_lr_ratio = 2;
  EXPECT_EQ(pooch_train(f.sess, f.ds, nullptr, &tp), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("min_lr_ratio"), std::string::npos);
}
