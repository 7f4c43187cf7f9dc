// llm.c token files: round trip, every header field refused when wrong (the
// message names the file, the field and its bytes), text read as bytes, and
// tokens checked against a vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "formats/token_file.h"
#include "runtime/core/error.h"

using namespace pooch;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("pooch_tok_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void put32(std::string& b, size_t at, int32_t v) {
  std::memcpy(b.data() + at, &v, 4);
}

void expect_refused(const std::string& bytes, const std::vector<std::string>& want) {
  try {
    tokens::parse_llmc(bytes.data(), bytes.size(), "tok.bin");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    const std::string m = e.what();
    EXPECT_NE(m.find("tok.bin"), std::string::npos) << m;
    for (const std::string& w : want)
      EXPECT_NE(m.find(w), std::string::npos) << m << " lacks " << w;
  }
}

}  // namespace

TEST(TokenFile, RoundTripAndLayout) {
  const std::vector<int32_t> toks = {0, 1, 50256, 65535, 7, 300};
  const std::string path = temp_path("rt.bin");
  tokens::write_llmc(path, toks);
  EXPECT_EQ(tokens::read_llmc(path), toks);
  EXPECT_TRUE(tokens::looks_like_llmc(path));
  // The layout llm.c's dev/data scripts write: 256 int32, then uint16.
  const std::string b = slurp(path);
  ASSERT_EQ(b.size(), 1024 + 2 * toks.size());
  int32_t h[3];
  std::memcpy(h, b.data(), 12);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 6);
  for (size_t i = 12; i < 1024; ++i) EXPECT_EQ(b[i], 0);
  uint16_t t2;
  std::memcpy(&t2, b.data() + 1024 + 4, 2);
  EXPECT_EQ(t2, 50256);
  fs::remove(path);
  EXPECT_THROW(tokens::write_llmc(path, {1, 65536}), Error);
  EXPECT_THROW(tokens::write_llmc(path, {-1}), Error);
  EXPECT_FALSE(fs::exists(path));
}

TEST(TokenFile, HostileHeaders) {
  std::string good(1024 + 6, '\0');
  put32(good, 0, 20240520);
  put32(good, 4, 1);
  put32(good, 8, 3);
  EXPECT_EQ(tokens::parse_llmc(good.data(), good.size(), "x").size(), 3u);
  expect_refused(good.substr(0, 1000), {"fewer than the 1024-byte header"});
  std::string b = good;
  put32(b, 0, 20240326);  // llm.c's model-file magic, not a token file
  expect_refused(b, {"'magic' (bytes 0-3)", "20240326"});
  b = good;
  put32(b, 4, 2);
  expect_refused(b, {"'version' (bytes 4-7)", "is 2"});
  b = good;
  put32(b, 8, -5);
  expect_refused(b, {"'count' (bytes 8-11)", "negative"});
  b = good;
  put32(b, 8, 4);
  expect_refused(b, {"'count' (bytes 8-11) says 4", "cut short"});
  b = good + "xx";
  expect_refused(b, {"bytes follow the last token"});
  // Random damage never crashes.
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    std::string d = good;
    d[rng() % 16] = static_cast<char>(rng());
    if (rng() % 3 == 0) d.resize(rng() % d.size());
    try {
      tokens::parse_llmc(d.data(), d.size(), "f");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    }
  }
}

TEST(TokenFile, FilesOnDisk) {
  const std::string path = temp_path("text.txt");
  {
    std::ofstream f(path, std::ios::binary);
    f << "h\xc3\xa9!";  // "hé!" in UTF-8
  }
  EXPECT_EQ(tokens::read_bytes(path), (std::vector<int32_t>{'h', 0xc3, 0xa9, '!'}));
  EXPECT_FALSE(tokens::looks_like_llmc(path));
  try {
    tokens::read_llmc(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  fs::remove(path);
  EXPECT_THROW(tokens::read_llmc(path), Error);  // missing
  EXPECT_THROW(tokens::read_llmc("/"), Error);   // a directory
}

TEST(TokenFile, VocabularyCheck) {
  tokens::check_vocab({0, 5, 255}, 256, "t");
  try {
    tokens::check_vocab({0, 5, 256, 9}, 256, "data.bin");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("data.bin: token 2 is 256"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tokens::check_vocab({-1}, 256, "t"), Error);
}
