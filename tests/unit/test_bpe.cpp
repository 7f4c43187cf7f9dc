// GPT-2 byte-level BPE against transformers' GPT2Tokenizer: a tokenizer
// trained with Hugging Face `tokenizers` and the ids the reference gives
// 357 strings, non-ASCII included (tests/golden/make_bpe_golden.py); and the
// checks on vocab.json and merges.txt.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/bpe_tokenizer.h"
#include "runtime/core/error.h"

using namespace pooch;

namespace {

const std::string kDir = std::string(POOCH_GOLDEN_DIR) + "/bpe";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void expect_refused(const std::string& vocab, const std::string& merges, const std::string& want) {
  try {
    bpe::Tokenizer::parse(vocab, merges, "v.json", "m.txt");
    ADD_FAILURE() << "accepted; wanted " << want;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// A vocabulary of the 256 bytes plus `extra`, as JSON.
nlohmann::json byte_vocab() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[bpe::byte_to_unicode(static_cast<uint8_t>(b))] = b;
  return v;
}

}  // namespace

TEST(Bpe, MatchesTransformersOnGoldenStrings) {
  const bpe::Tokenizer tok = bpe::Tokenizer::load(kDir + "/vocab.json", kDir + "/merges.txt");
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.special_id("<|endoftext|>"), 0);
  const nlohmann::json g = nlohmann::json::parse(slurp(kDir + "/encodings.json"));
  int non_ascii = 0, checked = 0;
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(text);
    EXPECT_EQ(tok.encode(text), want);
    const std::string bytes = tok.decode(want);
    EXPECT_EQ(bytes, text);  // byte-level: decoding gives the text back exactly
    EXPECT_EQ(bpe::utf8_replace_invalid(bytes), c["decoded"].get<std::string>());
    for (unsigned char ch : text) non_ascii += ch >= 0x80;
    ++checked;
  }
  EXPECT_GE(checked, 300);
  EXPECT_GT(non_ascii, 500);
}

TEST(Bpe, StreamingPiecesAndInvalidText) {
  const bpe::Tokenizer tok = bpe::Tokenizer::load(kDir + "/vocab.json", kDir + "/merges.txt");
  // A character split across tokens: each token's bytes alone are partial.
  const std::vector<int32_t> ids = tok.encode("日本");
  std::string joined;
  for (int32_t id : ids) joined += tok.token_bytes(id);
  EXPECT_EQ(joined, "日本");
  EXPECT_GT(ids.size(), 2u);
  try {
    tok.encode("ok \xff bad");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok.token_bytes(1000), Error);
  EXPECT_THROW(tok.token_bytes(-1), Error);
  // Python's errors="replace": one U+FFFD per maximal invalid subpart.
  EXPECT_EQ(bpe::utf8_replace_invalid("a\xe6\x97"), "a\xEF\xBF\xBD");
  EXPECT_EQ(bpe::utf8_replace_invalid("\xff\xfe"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(bpe::utf8_replace_invalid("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Bpe, RefusesBrokenFiles) {
  nlohmann::json v = byte_vocab();
  v["ab"] = 256;
  const std::string ok_vocab = v.dump();
  EXPECT_EQ(bpe::Tokenizer::parse(ok_vocab, "#version: 0.2\na b\n").encode("abab"),
            (std::vector<int32_t>{256, 256}));
  expect_refused("[1,2]", "", "not a JSON object");
  expect_refused("{\"a\":", "", "does not parse");
  expect_refused(R"({"a":1,"a":2})", "", "'a' is listed twice");
  nlohmann::json w = byte_vocab();
  w["xy"] = 300;
  expect_refused(w.dump(), "", "no token has id 256");
  // One token with a huge id: refused before anything is sized by the id
  // (fuzz_bpe_tokenizer's timeout: it made 10.8 M empty tokens first).
  expect_refused(R"({"e":10813440})", "", "no token has id 0 (the 1 tokens' ids");
  w = byte_vocab();
  w["xy"] = 5;
  expect_refused(w.dump(), "", "id 5 is given to two tokens");
  w = byte_vocab();
  w["xy"] = -1;
  expect_refused(w.dump(), "", "has id -1");
  w = byte_vocab();
  w.erase(bpe::byte_to_unicode(' '));
  w["zz"] = 32;  // ids stay dense, but byte 32 has no token
  expect_refused(w.dump(), "", "byte 32");
  expect_refused(ok_vocab, "a b c\n", "line 1 is 'a b c'");
  expect_refused(ok_vocab, "#version: 0.2\nab\n", "line 2 is 'ab'");
  expect_refused(ok_vocab, "a  b\n", "line 1");
  expect_refused(ok_vocab, "a c\n", "'ac' is not in v.json");
}

TEST(Bpe, DamagedFilesNeverCrash) {
  const std::string vocab = [] {
    std::ifstream f(kDir + "/vocab.json", std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(f), {}};
  }();
  const std::string merges = [] {
    std::ifstream f(kDir + "/merges.txt", std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(f), {}};
  }();
  std::mt19937_64 rng(11);
  int refused = 0, parsed = 0;
  for (int i = 0; i < 400; ++i) {
    std::string v = vocab, m = merges;
    std::string& target = (i % 2) ? v : m;
    for (int k = 0; k < 3; ++k) {
      const size_t at = rng() % target.size();
      switch (rng() % 3) {
        case 0:
          target[at] = static_cast<char>(rng());
          break;
        case 1:
          target[at] = " \n\"{}:,0123456789"[rng() % 17];
          break;
        default:
          target.erase(at, 1 + rng() % 8);
          break;
      }
    }
    try {
      const bpe::Tokenizer t = bpe::Tokenizer::parse(v, m);
      // Whatever parses encodes and decodes text back exactly.
      const std::string s = "In the beginning, 日本 ok";
      EXPECT_EQ(t.decode(t.encode(s)), s);
      ++parsed;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(parsed + refused, 399);
}
