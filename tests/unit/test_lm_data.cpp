// Language-model windows, the validation split and the batch rows they stage.
#include <gtest/gtest.h>

#include <numeric>

#include "runtime/core/error.h"
#include "runtime/train/lm_data.h"

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
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("small.bin: 20 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(split_tokens(t, 0, 0.1, "d"), Error);
  EXPECT_THROW(split_tokens(t, 16, 1.0, "d"), Error);
}
