// Language-model windows, the validation split and the batch rows they
// stage; train_lm's schedule, step cap, validation and vocabulary check.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/models/gpt.h"
#include "runtime/train/lm_data.h"
#include "runtime/train/lr_schedule.h"

using namespace pooch;

TEST(LmData, WindowsShiftTargetsByOne) {
  std::vector<int32_t> t(23);
  std::iota(t.begin(), t.end(), 100);
  const LmWindows w{t.data(), 23, 5};
  EXPECT_EQ(w.rows(), 4);  // (23 - 1) / 5: the last window ends at token 20
  int32_t in[5], tgt[5], whole[6];
  w.fill(3, in, tgt);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(in[i], 115 + i);
    EXPECT_EQ(tgt[i], 116 + i);
  }
  w.fill(1, whole, nullptr);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(whole[i], 105 + i);
  EXPECT_EQ((LmWindows{t.data(), 5, 5}.rows()), 0);  // 5 tokens hold no window of 5 + 1
  EXPECT_EQ((LmWindows{t.data(), 6, 5}.rows()), 1);
}

TEST(LmData, SplitTakesTheTail) {
  std::vector<int32_t> t(1000);
  std::iota(t.begin(), t.end(), 0);
  const LmSplit s = split_tokens(t, 16, 0.1, "d");
  EXPECT_EQ(s.train.count, 900);
  EXPECT_EQ(s.val.count, 100);
  EXPECT_EQ(s.val.tokens[0], 900);
  EXPECT_EQ(s.train.rows(), 899 / 16);
  EXPECT_EQ(s.val.rows(), 99 / 16);
  // No overlap: the last training window ends before the validation part.
  EXPECT_LE((s.train.rows() - 1) * 16 + 17, s.train.count);
  // A tiny fraction still gets one window.
  const LmSplit tiny = split_tokens(t, 16, 0.001, "d");
  EXPECT_EQ(tiny.val.count, 17);
  EXPECT_EQ(tiny.val.rows(), 1);
  const LmSplit none = split_tokens(t, 16, 0, "d");
  EXPECT_EQ(none.train.count, 1000);
  EXPECT_EQ(none.val.rows(), 0);
  try {
    split_tokens(std::vector<int32_t>(20), 16, 0.5, "small.bin");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("small.bin: 20 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(split_tokens(t, 0, 0.1, "d"), Error);
  EXPECT_THROW(split_tokens(t, 16, 1.0, "d"), Error);
}

namespace {

// A gpt small enough to train in a blink: one layer, width 16, context 8,
// 16 tokens, 4 rows per step.
std::unique_ptr<Session> tiny_session() {
  GptSpec g;
  g.n_layer = 1;
  g.n_head = 2;
  g.n_embd = 16;
  g.n_ctx = 8;
  g.vocab_size = 16;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  cfg.optimizer.kind = OptimizerConfig::Kind::adamw;
  cfg.optimizer.lr = 1e-2;
  return std::make_unique<Session>(std::shared_ptr<Model>(build_gpt_model(gpt_spec(g, 4, 8))), cfg);
}

// 0, 1, ..., 15, 0, 1, ...: each token says the next.
std::vector<int32_t> cycle(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(i % 16);
  return t;
}

LmTrainConfig cosine_config() {
  LmTrainConfig c;
  c.train.epochs = 100;
  c.train.max_steps = 25;
  c.train.cosine = true;
  c.train.warmup_steps = 5;
  c.train.min_lr_ratio = 0.1;
  c.train.plateau_patience = 0;
  c.train.early_stop_patience = 0;
  c.val_fraction = 0.1;
  c.eval_every = 10;
  c.inputs = {"batch.tokens", "batch.targets"};
  return c;
}

}  // namespace

// train_lm with the cosine schedule and a step cap: every step's learning
// rate factor is cosine_lr_scale's, training ends at the cap in the middle
// of an epoch (56 batches), validation runs every 10 steps and at the end,
// and the loss on held-out windows falls.
TEST(TrainLm, CosineScheduleStepCapAndValidation) {
  auto s = tiny_session();
  const std::vector<int32_t> tokens = cycle(2000);
  const LmTrainConfig c = cosine_config();
  TrainerState st;
  std::vector<double> scales;
  TrainCallbacks cb;
  cb.on_step = [&](uint64_t, float, int64_t, int64_t, int64_t) {
    scales.push_back(s->lr_scale());
    return true;
  };
  std::vector<LmEvalReport> evals;
  train_lm(
      *s, tokens, 16, c, st, cb, [&](const LmEvalReport& r) { evals.push_back(r); }, "cycle");
  EXPECT_EQ(s->optimizer_step(), 25u);
  EXPECT_TRUE(st.finished);
  ASSERT_EQ(scales.size(), 25u);
  for (size_t i = 0; i < scales.size(); ++i)
    EXPECT_DOUBLE_EQ(scales[i], cosine_lr_scale(i + 1, 5, 25, 0.1)) << "step " << i + 1;
  EXPECT_DOUBLE_EQ(scales.back(), 0.1);  // the floor at the last step
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0].step, 10u);
  EXPECT_EQ(evals[1].step, 20u);
  EXPECT_EQ(evals[2].step, 25u);
  EXPECT_LT(evals[2].eval.loss, evals[0].eval.loss);
  EXPECT_LT(evals[2].eval.loss, std::log(16.0));  // better than uniform
  EXPECT_DOUBLE_EQ(evals[2].eval.perplexity, std::exp(evals[2].eval.loss));
  // Called again with the finished state: nothing more happens.
  train_lm(*s, tokens, 16, c, st, cb, nullptr, "cycle");
  EXPECT_EQ(s->optimizer_step(), 25u);
}

TEST(TrainLm, RefusesTokensOutsideTheVocabulary) {
  auto s = tiny_session();
  std::vector<int32_t> tokens = cycle(2000);
  tokens[1234] = 16;
  TrainerState st;
  try {
    train_lm(*s, tokens, 16, cosine_config(), st, {}, nullptr, "ids.bin");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("ids.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1234"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->optimizer_step(), 0u);
}

TEST(TrainLm, FingerprintsDifferPerToken) {
  const std::vector<int32_t> a = cycle(100);
  std::vector<int32_t> b = a;
  b[50] = 3;
  EXPECT_EQ(token_fingerprint(a.data(), 100), token_fingerprint(a.data(), 100));
  EXPECT_NE(token_fingerprint(a.data(), 100), token_fingerprint(b.data(), 100));
  EXPECT_NE(token_fingerprint(a.data(), 100), token_fingerprint(a.data(), 99));
  EXPECT_NE(token_fingerprint(a.data(), 100).find("(100 tokens)"), std::string::npos);
}
