// The language-model file calls of the C API as an embedding application
// sees them (pooch.h alone): the BPE tokenizer, token files, training on a
// token stream (pooch_train_tokens), and every call refusing NULL arguments
// with POOCH_ERR_INVALID_ARG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "pooch/pooch.h"

namespace {
const std::string kBpe = std::string(POOCH_GOLDEN_DIR) + "/bpe";
}

TEST(ApiLm, TokenizerEncodesAndStreamsBytes) {
  pooch_tokenizer* t = nullptr;
  ASSERT_EQ(
      pooch_tokenizer_load((kBpe + "/vocab.json").c_str(), (kBpe + "/merges.txt").c_str(), &t),
      POOCH_OK)
      << pooch_last_error();
  EXPECT_EQ(pooch_tokenizer_vocab_size(t), 1000);
  const std::string text = "In the beginning God created the heaven and the earth. 日本";
  int64_t n = -1;
  // Ask for the count first, then fill a buffer of that size.
  ASSERT_EQ(pooch_tokenizer_encode(t, text.data(), text.size(), nullptr, 0, &n), POOCH_OK);
  ASSERT_GT(n, 5);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  int64_t n2 = 0;
  ASSERT_EQ(pooch_tokenizer_encode(t, text.data(), text.size(), ids.data(), n, &n2), POOCH_OK);
  EXPECT_EQ(n2, n);
  // A short buffer gets the first ids and the full count.
  std::vector<int32_t> head(2);
  ASSERT_EQ(pooch_tokenizer_encode(t, text.data(), text.size(), head.data(), 2, &n2), POOCH_OK);
  EXPECT_EQ(n2, n);
  EXPECT_EQ(head[0], ids[0]);
  EXPECT_EQ(head[1], ids[1]);
  std::string back;
  for (int32_t id : ids) {
    const char* b = nullptr;
    size_t len = 0;
    ASSERT_EQ(pooch_tokenizer_token(t, id, &b, &len), POOCH_OK);
    back.append(b, len);
  }
  EXPECT_EQ(back, text);
  const char* b = nullptr;
  size_t len = 0;
  EXPECT_EQ(pooch_tokenizer_token(t, 1000, &b, &len), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("1000"), std::string::npos);
  EXPECT_EQ(pooch_tokenizer_encode(t, "\xff", 1, nullptr, 0, &n), POOCH_ERR_BAD_INPUT);
  pooch_tokenizer_free(&t);
  EXPECT_EQ(t, nullptr);
  pooch_tokenizer_free(&t);
  pooch_tokenizer_free(nullptr);
}

TEST(ApiLm, TokenFilesRoundTrip) {
  const std::string path = "/tmp/pooch_api_lm_" + std::to_string(::getpid()) + ".bin";
  const std::vector<int32_t> ids = {5, 0, 65535, 300};
  ASSERT_EQ(pooch_tokens_save(path.c_str(), ids.data(), 4), POOCH_OK);
  int32_t* got = nullptr;
  int64_t n = 0;
  ASSERT_EQ(pooch_tokens_load(path.c_str(), 0, &got, &n), POOCH_OK);
  ASSERT_EQ(n, 4);
  EXPECT_EQ(std::vector<int32_t>(got, got + n), ids);
  pooch_tokens_free(&got);
  EXPECT_EQ(got, nullptr);
  // The same file as bytes: its 1024 + 8 bytes.
  ASSERT_EQ(pooch_tokens_load(path.c_str(), 1, &got, &n), POOCH_OK);
  EXPECT_EQ(n, 1032);
  EXPECT_EQ(got[1024], 5);
  pooch_tokens_free(&got);
  const int32_t big = 70000;
  EXPECT_EQ(pooch_tokens_save(path.c_str(), &big, 1), POOCH_ERR_INVALID_ARG);
  std::remove(path.c_str());
  EXPECT_EQ(pooch_tokens_load(path.c_str(), 0, &got, &n), POOCH_ERR_IO);
  EXPECT_EQ(got, nullptr);
}

TEST(ApiLm, NullArgumentsAreRefused) {
  pooch_tokenizer* t = nullptr;
  int64_t n = 0;
  int32_t* p = nullptr;
  const char* b = nullptr;
  size_t len = 0;
  EXPECT_EQ(pooch_tokenizer_load(nullptr, "m", &t), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_load("v", "m", nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_vocab_size(nullptr), -1);
  EXPECT_EQ(pooch_tokenizer_encode(nullptr, "a", 1, nullptr, 0, &n), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_token(nullptr, 0, &b, &len), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokens_load(nullptr, 0, &p, &n), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokens_load("x", 0, nullptr, &n), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokens_save(nullptr, nullptr, 0), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokens_save("x", nullptr, 3), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_gpt_import(nullptr, "x"), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_gpt_export("x", nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_model_add_lora(nullptr, 4, 0, "attn"), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_lora_merge(nullptr, "x"), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_lora_merge("x", nullptr), POOCH_ERR_INVALID_ARG);
  pooch_tokenizer* loaded = nullptr;
  ASSERT_EQ(
      pooch_tokenizer_load((kBpe + "/vocab.json").c_str(), (kBpe + "/merges.txt").c_str(), &loaded),
      POOCH_OK);
  EXPECT_EQ(pooch_tokenizer_encode(loaded, nullptr, 3, nullptr, 0, &n), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_encode(loaded, "abc", 3, nullptr, 2, &n), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_encode(loaded, "abc", 3, nullptr, 0, nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_tokenizer_encode(loaded, nullptr, 0, nullptr, 0, &n), POOCH_OK);  // empty text
  EXPECT_EQ(n, 0);
  pooch_tokenizer_free(&loaded);
}

namespace {

// A byte-level gpt small enough to train in a blink, 4 rows of 16 tokens a step.
const char* kTinyGpt =
    R"({"family": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_ctx": 32,
        "vocab_size": 256, "batch": 4})";

std::vector<int32_t> text_tokens() {
  std::string t;
  while (t.size() < 6000) t += "In the beginning God created the heaven and the earth. ";
  return std::vector<int32_t>(t.begin(), t.end());
}

struct TrainRun {
  int64_t steps = 0, stop_at = 0;
  std::vector<int64_t> eval_steps;
  double last_loss = 0;
};

int count_step(void* user, int64_t, float, int, int64_t, int64_t) {
  auto* r = static_cast<TrainRun*>(user);
  return ++r->steps == r->stop_at ? 0 : 1;
}

void record_eval(void* user, int64_t step, double loss, double perplexity) {
  auto* r = static_cast<TrainRun*>(user);
  r->eval_steps.push_back(step);
  r->last_loss = loss;
  EXPECT_DOUBLE_EQ(perplexity, std::exp(loss));
}

// Trains from `model_path` (a spec when empty) for `steps` in all, stopping
// after `stop_at` steps of this call (0: never); returns the status and
// fills `weights` with wte.weight.
pooch_status train(const std::string& from, const std::string& ckpt, int64_t stop_at, TrainRun* run,
                   std::vector<float>* weights) {
  pooch_model* m = nullptr;
  pooch_status st = from.empty() ? pooch_model_create_from_spec(kTinyGpt, "tiny", &m)
                                 : pooch_model_load(from.c_str(), &m);
  EXPECT_EQ(st, POOCH_OK) << pooch_last_error();
  if (from.empty()) {
    EXPECT_EQ(pooch_model_set_sequence_length(m, 16), POOCH_OK);
  }
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  sp.optimizer = POOCH_OPT_ADAMW;
  sp.learning_rate = 3e-3f;
  sp.weight_decay = 0.1f;
  pooch_session* s = nullptr;
  EXPECT_EQ(pooch_session_create(m, &sp, &s), POOCH_OK) << pooch_last_error();
  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = 1000;
  tp.max_steps = 30;
  tp.lr_schedule = POOCH_LR_COSINE;
  tp.warmup_steps = 5;
  tp.plateau_patience = 0;
  tp.early_stop_patience = 0;
  tp.checkpoint_path = ckpt.c_str();
  tp.on_step = count_step;
  tp.user = run;
  run->stop_at = stop_at;
  pooch_lm_params lp;
  pooch_lm_default_params(&lp);
  lp.eval_every = 10;
  lp.on_eval = record_eval;
  const std::vector<int32_t> tokens = text_tokens();
  st = pooch_train_tokens(s, tokens.data(), static_cast<int64_t>(tokens.size()), &tp, &lp);
  size_t bytes = 0;
  EXPECT_EQ(pooch_session_read_tensor(s, "wte.weight", nullptr, &bytes), POOCH_OK);
  weights->resize(bytes / 4);
  EXPECT_EQ(pooch_session_read_tensor(s, "wte.weight", weights->data(), &bytes), POOCH_OK);
  pooch_session_free(&s);
  pooch_model_free(&m);
  return st;
}

}  // namespace

// pooch_train_tokens: a step cap over epochs, validation every 10 steps, and
// a run cancelled at step 12 and resumed from its checkpoint ending with the
// same weights as one that went through.
TEST(ApiLm, TrainTokensResumesBitForBit) {
  const std::string dir = "/tmp/pooch_api_lm_train_" + std::to_string(::getpid());
  const std::string a = dir + "_a.ckpt", b = dir + "_b.ckpt";
  TrainRun full, part, rest;
  std::vector<float> w_full, w_part, w_rest;
  ASSERT_EQ(train("", a, 0, &full, &w_full), POOCH_OK) << pooch_last_error();
  EXPECT_EQ(full.steps, 30);
  EXPECT_EQ(full.eval_steps, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_LT(full.last_loss, std::log(256.0));
  ASSERT_EQ(train("", b, 12, &part, &w_part), POOCH_ERR_CANCELLED);
  EXPECT_EQ(part.steps, 12);
  ASSERT_EQ(train(b, b, 0, &rest, &w_rest), POOCH_OK) << pooch_last_error();
  EXPECT_EQ(rest.steps, 18);
  EXPECT_EQ(rest.eval_steps, (std::vector<int64_t>{20, 30}));
  ASSERT_EQ(w_rest.size(), w_full.size());
  EXPECT_EQ(std::memcmp(w_rest.data(), w_full.data(), w_full.size() * 4), 0);
  EXPECT_NE(std::memcmp(w_part.data(), w_full.data(), w_full.size() * 4), 0);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(ApiLm, TrainTokensRefusesBadInput) {
  pooch_model* m = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(kTinyGpt, "tiny", &m), POOCH_OK);
  EXPECT_EQ(pooch_model_set_sequence_length(m, 33), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("n_ctx) is 32"), std::string::npos)
      << pooch_last_error();
  EXPECT_EQ(pooch_model_set_sequence_length(nullptr, 8), POOCH_ERR_INVALID_ARG);
  ASSERT_EQ(pooch_model_set_sequence_length(m, 8), POOCH_OK);
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  pooch_session* s = nullptr;
  ASSERT_EQ(pooch_session_create(m, &sp, &s), POOCH_OK) << pooch_last_error();
  pooch_train_params tp;
  pooch_train_default_params(&tp);
  pooch_lm_params lp;
  pooch_lm_default_params(&lp);
  EXPECT_EQ(lp.val_fraction, 0.1);
  EXPECT_EQ(tp.lr_schedule, POOCH_LR_PLATEAU);
  std::vector<int32_t> tokens = text_tokens();
  tokens[77] = 256;
  EXPECT_EQ(pooch_train_tokens(s, tokens.data(), static_cast<int64_t>(tokens.size()), &tp, &lp),
            POOCH_ERR_BAD_INPUT);
  EXPECT_NE(std::string(pooch_last_error()).find("token 77 is 256"), std::string::npos)
      << pooch_last_error();
  EXPECT_EQ(pooch_train_tokens(s, tokens.data(), 12, &tp, &lp), POOCH_ERR_BAD_INPUT);
  EXPECT_NE(std::string(pooch_last_error()).find("12 tokens"), std::string::npos)
      << pooch_last_error();
  tp.lr_schedule = 7;
  EXPECT_EQ(pooch_train_tokens(s, tokens.data(), 100, &tp, &lp), POOCH_ERR_INVALID_ARG);
  pooch_train_default_params(&tp);
  EXPECT_EQ(pooch_train_tokens(nullptr, tokens.data(), 100, &tp, &lp), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_train_tokens(s, nullptr, 100, &tp, &lp), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_train_tokens(s, tokens.data(), 100, &tp, nullptr), POOCH_ERR_INVALID_ARG);
  pooch_session_free(&s);
  pooch_model_free(&m);
}

// pooch_model_add_lora: adapters on a gpt model, the rest frozen; its
// refusals name what is wrong.
TEST(ApiLm, AddLoraFreezesTheBaseAndRefusesWhatItCannotAdapt) {
  pooch_model* m = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(kTinyGpt, "tiny", &m), POOCH_OK);
  EXPECT_EQ(pooch_model_add_lora(m, 0, 0, "attn"), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_model_add_lora(m, 17, 0, "attn"), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("lora.rank is 17"), std::string::npos)
      << pooch_last_error();
  EXPECT_EQ(pooch_model_add_lora(m, 2, 0, "attn,ffn"), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("'ffn'"), std::string::npos) << pooch_last_error();
  EXPECT_EQ(pooch_model_add_lora(m, 2, -1, "attn"), POOCH_ERR_INVALID_ARG);
  // A refused call leaves the model as it was.
  EXPECT_EQ(std::string(pooch_model_spec_json(m)).find("lora"), std::string::npos);
  ASSERT_EQ(pooch_model_add_lora(m, 2, 4, nullptr), POOCH_OK) << pooch_last_error();
  const std::string spec = pooch_model_spec_json(m);
  EXPECT_NE(spec.find("\"lora\""), std::string::npos) << spec;
  EXPECT_NE(spec.find("\"attn\""), std::string::npos) << spec;
  EXPECT_EQ(spec.find("\"mlp\""), std::string::npos) << spec;
  EXPECT_EQ(pooch_model_add_lora(m, 2, 4, "mlp"), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("already has rank-2 adapters"), std::string::npos)
      << pooch_last_error();
  // Optimizer state for the adapters alone (192 values, two Adam moments),
  // against the whole model's without them.
  auto optimizer_bytes = [](pooch_model* model) {
    pooch_session_params sp;
    pooch_session_default_params(&sp);
    sp.device = POOCH_DEVICE_CPU;
    sp.threads = 1;
    pooch_session* s = nullptr;
    EXPECT_EQ(pooch_session_create(model, &sp, &s), POOCH_OK) << pooch_last_error();
    pooch_memory_report r;
    EXPECT_EQ(pooch_session_memory(s, &r), POOCH_OK);
    pooch_session_free(&s);
    return r.by_role[4];
  };
  pooch_model* plain = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(kTinyGpt, "tiny", &plain), POOCH_OK);
  const size_t adapted = optimizer_bytes(m), all = optimizer_bytes(plain);
  EXPECT_GE(adapted, size_t{2 * 4 * 192});
  EXPECT_LT(adapted * 10, all) << "adapters: " << adapted << " bytes, every weight: " << all;
  pooch_model_free(&plain);
  pooch_model_free(&m);

  pooch_model* mlp = nullptr;
  ASSERT_EQ(pooch_model_create_from_spec(
                R"({"family": "mlp", "input": {"kind": "dense", "width": 6}, "outputs": 3,
                    "layers": [{"type": "linear", "width": 4}, {"type": "dense"}], "loss": "mse"})",
                "x", &mlp),
            POOCH_OK)
      << pooch_last_error();
  EXPECT_EQ(pooch_model_add_lora(mlp, 2, 0, "attn"), POOCH_ERR_INVALID_ARG);
  EXPECT_NE(std::string(pooch_last_error()).find("for gpt models"), std::string::npos)
      << pooch_last_error();
  pooch_model_free(&mlp);
}
