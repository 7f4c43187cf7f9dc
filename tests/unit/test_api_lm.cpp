// The language-model file calls of the C API as an embedding application
// sees them (pooch.h alone): the BPE tokenizer, token files, and every call
// refusing NULL arguments with POOCH_ERR_INVALID_ARG.
#include <gtest/gtest.h>
#include <unistd.h>

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
