// XMC data: the text formats (bag of words, split files, .npy), their error
// messages, the binary cache, and the synthetic generator.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/synth.h"
#include "formats/xmc_text.h"
#include "runtime/core/error.h"

using namespace pooch;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("pooch_xmc_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void put_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string get_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void expect_same(const XmcDataset& a, const XmcDataset& b) {
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.row_ptr, b.row_ptr);
  EXPECT_EQ(a.col, b.col);
  ASSERT_EQ(a.val.size(), b.val.size());
  // Bit-exact: the writer prints the shortest text that reads back the same float.
  if (!a.val.empty()) {
    EXPECT_EQ(0, std::memcmp(a.val.data(), b.val.data(), a.val.size() * sizeof(float)));
  }
  EXPECT_EQ(a.label_ptr, b.label_ptr);
  EXPECT_EQ(a.label, b.label);
  EXPECT_EQ(a.dense_dim, b.dense_dim);
  EXPECT_EQ(a.dense, b.dense);
}

XmcDataset small_set() {
  SynthShape s;
  s.features = 300;
  s.labels = 40;
  s.train_rows = 60;
  s.test_rows = 10;
  s.labels_per_point = 3;
  s.points_per_label = 5;
  s.features_per_point = 20;
  s.beta = 0.7;
  XmcDataset d = make_synth(s).train;
  // Exercise the awkward cases too: a point without labels and a point
  // without anything.
  const auto clear_labels = [&](int64_t r) {
    const int64_t n = d.label_ptr[r + 1] - d.label_ptr[r];
    d.label.erase(d.label.begin() + d.label_ptr[r], d.label.begin() + d.label_ptr[r + 1]);
    for (size_t i = static_cast<size_t>(r) + 1; i < d.label_ptr.size(); ++i) d.label_ptr[i] -= n;
  };
  const auto clear_features = [&](int64_t r) {
    const int64_t n = d.row_ptr[r + 1] - d.row_ptr[r];
    d.col.erase(d.col.begin() + d.row_ptr[r], d.col.begin() + d.row_ptr[r + 1]);
    d.val.erase(d.val.begin() + d.row_ptr[r], d.val.begin() + d.row_ptr[r + 1]);
    for (size_t i = static_cast<size_t>(r) + 1; i < d.row_ptr.size(); ++i) d.row_ptr[i] -= n;
  };
  clear_labels(3);
  clear_labels(7);
  clear_features(7);
  clear_features(12);
  EXPECT_EQ(xmc_check(d), "");
  return d;
}

// Parses `text` as bag of words, expecting POOCH_ERR_BAD_INPUT with a
// message that names line and column and contains `needle`.
void expect_bow_error(const std::string& text, int line, int column, const std::string& needle) {
  try {
    parse_xmc_bow(text, "t.txt");
    ADD_FAILURE() << "expected an error for:\n" << text;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << msg;
    const std::string where =
        "t.txt: line " + std::to_string(line) + ", column " + std::to_string(column) + ":";
    EXPECT_NE(msg.find(where), std::string::npos) << "wanted '" << where << "' in: " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
  }
}

void expect_split_error(const std::string& xf, const std::string& y, const std::string& file,
                        int line, int column, const std::string& needle) {
  try {
    parse_xmc_split(xf, "X_Xf.txt", y, "X_Y.txt");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << msg;
    const std::string where =
        file + ": line " + std::to_string(line) + ", column " + std::to_string(column) + ":";
    EXPECT_NE(msg.find(where), std::string::npos) << "wanted '" << where << "' in: " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
  }
}

std::string npy_bytes(const std::string& descr, const std::string& shape, const void* data,
                      size_t n, int major = 1, bool fortran = false) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                  ", 'shape': " + shape + ", }";
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (size_t i = 0; i < pre - 8; ++i)
    out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  out += h;
  out.append(static_cast<const char*>(data), n);
  return out;
}

void expect_npy_error(const std::string& npy, const std::string& labels,
                      const std::string& needle) {
  try {
    parse_xmc_npy(npy, "x.npy", labels, "y.txt");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << msg;
    EXPECT_NE(msg.find("line"), std::string::npos) << msg;
    EXPECT_NE(msg.find("column"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
  }
}

}  // namespace

// ---------------------------------------------------------------- round trips

TEST(XmcText, BagOfWordsRoundTripIsBitExact) {
  const XmcDataset d = small_set();
  const std::string text = format_xmc_bow(d);
  // Point 3 has no labels: its line starts with a space. Point 7 is empty.
  std::vector<std::string> lines;
  for (size_t p = 0, q; p < text.size(); p = q + 1) {
    q = text.find('\n', p);
    lines.push_back(text.substr(p, q - p));
  }
  ASSERT_GT(lines.size(), 8u);
  EXPECT_EQ(lines[0], "60 300 40");
  EXPECT_EQ(lines[4][0], ' ');
  EXPECT_EQ(lines[8], "");
  expect_same(parse_xmc_bow(text, "mem"), d);

  TempDir dir;
  write_xmc_bow(dir.file("train.txt"), d);
  EXPECT_EQ(get_file(dir.file("train.txt")), text);
  expect_same(read_xmc_bow(dir.file("train.txt")), d);
}

TEST(XmcText, SplitFilesRoundTrip) {
  const XmcDataset d = small_set();
  TempDir dir;
  write_xmc_split(dir.file("X_Xf.txt"), dir.file("X_Y.txt"), d);
  const std::string y = get_file(dir.file("X_Y.txt"));
  EXPECT_EQ(y.substr(0, y.find('\n')), "60 40");
  expect_same(read_xmc_split(dir.file("X_Xf.txt"), dir.file("X_Y.txt")), d);
}

TEST(XmcText, NpyRoundTripAndDtypes) {
  XmcDataset d;
  d.features = d.dense_dim = 3;
  d.labels = 5;
  d.row_ptr.assign(5, 0);
  d.dense = {1, 2, 3, -4, 0.5f, 6, 0, 0, 0, 1e-3f, 2e30f, -7};
  d.label_ptr = {0, 2, 2, 3, 5};
  d.label = {0, 4, 1, 2, 3};
  TempDir dir;
  write_npy(dir.file("x.npy"), d);
  write_xmc_split_labels(dir.file("y.txt"), d);
  const std::string npy = get_file(dir.file("x.npy"));
  EXPECT_EQ(npy.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_EQ(npy.size() % 64, (12 * 4) % 64);  // data starts 64-byte aligned
  expect_same(read_xmc_split(dir.file("x.npy"), dir.file("y.txt")), d);

  // '<f8' and a 2.0 header, as numpy writes for float64 and huge headers.
  std::vector<double> f8(d.dense.begin(), d.dense.end());
  const std::string labels = get_file(dir.file("y.txt"));
  expect_same(parse_xmc_npy(npy_bytes("<f8", "(4, 3)", f8.data(), f8.size() * 8, 2), "a.npy",
                            labels, "y.txt"),
              d);
  expect_same(
      parse_xmc_npy(npy_bytes("<f4", "(4, 3)", d.dense.data(), 48, 3), "a.npy", labels, "y.txt"),
      d);
  // No rows at all is a valid, empty set.
  const XmcDataset e =
      parse_xmc_npy(npy_bytes("<f4", "(0, 3)", nullptr, 0), "e.npy", "0 5\n", "e.txt");
  EXPECT_EQ(e.rows(), 0);
  EXPECT_EQ(e.dense_dim, 3);
}

TEST(XmcText, AcceptsCrlfTrailingBlanksBomAndLabelFreeLines) {
  const std::string lf = "4 10 5\n0,3 1:0.5 7:2\n 2:1\n4:0.25 9:1e-3\n\n";
  const XmcDataset want = parse_xmc_bow(lf, "lf");
  EXPECT_EQ(want.rows(), 4);
  EXPECT_EQ(want.label_ptr, (std::vector<int64_t>{0, 2, 2, 2, 2}));
  EXPECT_EQ(want.row_ptr, (std::vector<int64_t>{0, 2, 3, 5, 5}));
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  expect_same(parse_xmc_bow(crlf, "crlf"), want);
  expect_same(parse_xmc_bow("\xEF\xBB\xBF" + lf, "bom"), want);
  expect_same(parse_xmc_bow("4 10 5  \t\n0,3 1:0.5\t7:2  \n 2:1 \n4:0.25   9:1e-3\t\n\t\n", "ws"),
              want);
  // The last line needs no newline; blank lines after the last point are fine.
  expect_same(parse_xmc_bow("2 10 5\n0 1:1\n1 2:1", "unterminated"),
              parse_xmc_bow("2 10 5\n0 1:1\n1 2:1\n", "terminated"));
  expect_same(parse_xmc_bow(lf + "\n  \n", "tail"), want);
}

TEST(XmcText, SortsRowsMergesRepeatsAndReadsNumberForms) {
  const XmcDataset d =
      parse_xmc_bow("1 10 5\n3,1,3 7:1 2:+0.5 7:2 0:1e-50 5:.25 1:-0.0 4:1E+2\n", "t");
  EXPECT_EQ(d.label, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(d.col, (std::vector<int32_t>{0, 1, 2, 4, 5, 7}));
  EXPECT_EQ(d.val, (std::vector<float>{0.0f, -0.0f, 0.5f, 100.0f, 0.25f, 3.0f}));
}

// ---------------------------------------------------------------- errors

TEST(XmcRows, MostInRowsIsTheLargestRowsTotal) {
  const std::vector<int64_t> ptr{0, 3, 4, 9, 11};  // rows of 3, 1, 5 and 2 entries
  EXPECT_EQ(most_in_rows(ptr, 1), 5);
  EXPECT_EQ(most_in_rows(ptr, 2), 8);
  EXPECT_EQ(most_in_rows(ptr, 4), 11);
  EXPECT_EQ(most_in_rows(ptr, 100), 11);  // more rows than the set has
  EXPECT_EQ(most_in_rows(ptr, 0), 0);
  EXPECT_EQ(most_in_rows(ptr, -1), 0);
  EXPECT_EQ(most_in_rows({0}, 3), 0);  // no rows
}

TEST(XmcErrors, Headers) {
  expect_bow_error("", 1, 1, "the file is empty; expected a header line 'N F L'");
  expect_bow_error("\n0,1 2:1\n", 1, 1, "header line is blank");
  expect_bow_error("3 10\n", 1, 5, "the header has 2 numbers; expected 3 numbers 'N F L'");
  expect_bow_error("3 10 5 7\n", 1, 8, "expected the end of the header");
  expect_bow_error("3 ten 5\n", 1, 3, "expected the header 'N F L'");
  expect_bow_error("0,1 2:0.5\n", 1, 1, "is the header missing?");
  expect_bow_error("-3 10 5\n", 1, 1, "non-negative");
  expect_bow_error("99999999999999999999 10 5\n", 1, 1, "out of range");
  expect_bow_error("1 3000000000 5\n", 1, 1, "at most 2147483647 are supported");
}

TEST(XmcErrors, IndicesOutOfRangeOrNegative) {
  expect_bow_error("2 10 5\n0 1:1\n1 10:0.5\n", 3, 3, "feature index 10 is out of range");
  expect_bow_error("2 10 5\n0 1:1\n1 10:0.5\n", 3, 3, "indices run from 0 to 9");
  expect_bow_error("2 10 5\n0,5 1:1\n1 3:0.5\n", 2, 3, "label index 5 is out of range");
  expect_bow_error("1 10 5\n0 -2:1\n", 2, 3, "negative feature index -2");
  expect_bow_error("1 10 5\n0,-1 2:1\n", 2, 3, "negative label index -1");
  expect_bow_error("1 10 0\n0 2:1\n", 2, 1, "declares 0 labels, so no index is valid");
  expect_bow_error("1 10 5\n0 99999999999999999999:1\n", 2, 3, "out of range");
}

TEST(XmcErrors, CountsThatDisagreeWithTheHeader) {
  expect_bow_error("3 10 5\n0 1:1\n1 2:1\n", 4, 1, "declares 3 rows but the file ends after 2");
  expect_bow_error("1 10 5\n0 1:1\n1 2:1\n", 3, 1, "declares 1 row but the file has more lines");
  expect_bow_error("1 10 5\n0 1:1\n\n\n1 2:1\n", 5, 1, "the file has more lines");
  // A second header in the body: two files concatenated.
  expect_bow_error("2 10 5\n0 1:1\n2 10 5\n", 3, 1, "duplicate header");
  expect_bow_error("1 10 5\n0 1:1\n1 10 5\n0 2:1\n", 3, 1, "duplicate header");
}

TEST(XmcErrors, MalformedEntries) {
  expect_bow_error("1 10 5\n0 1:abc\n", 2, 5, "expected a number after ':' but found 'abc'");
  expect_bow_error("1 10 5\n0 1:\n", 2, 5, "expected a number after ':' but found end of line");
  expect_bow_error("1 10 5\n0 x:1\n", 2, 3, "expected a feature index");
  expect_bow_error("1 10 5\n0 1:0.5x\n", 2, 8, "expected a space or the end of the line");
  expect_bow_error("1 10 5\n0 1:1.2.3\n", 2, 8, "expected a space or the end of the line");
  expect_bow_error("1 10 5\n0 3 1:1\n", 2, 4, "expected ':' after feature index 3");
  expect_bow_error("1 10 5\n0, 1:1\n", 2, 3, "expected a label index");
  expect_bow_error("1 10 5\n0;1 1:1\n", 2, 2, "labels are separated by ','");
  expect_bow_error("1 10 5\n0 1:nan\n", 2, 5, "not a finite number");
  expect_bow_error("1 10 5\n0 1:-inf\n", 2, 5, "not a finite number");
  expect_bow_error("1 10 5\n0 1:1e39\n", 2, 5, "too large for a 32-bit float");
  expect_bow_error("1 10 5\n0 1:3e38 2:1 1:3e38\n", 2, 1, "sum beyond the 32-bit float range");
  expect_bow_error("1 10 5\n0 1:1\r2:1\n", 2, 6, "'\\r2:1'");
  expect_bow_error(std::string("1 10 5\n0 1:1 \x01\xff\n", 17), 2, 7, "'\\x01\\xff'");
}

TEST(XmcErrors, SplitFiles) {
  const std::string xf = "2 10\n1:0.5 3:1\n\n";
  const std::string y = "2 4\n0:1 3:1\n2:1\n";
  const XmcDataset d = parse_xmc_split(xf, "X_Xf.txt", y, "X_Y.txt");
  EXPECT_EQ(d.rows(), 2);
  EXPECT_EQ(d.label, (std::vector<int32_t>{0, 3, 2}));
  expect_split_error(xf, "3 4\n0:1\n1:1\n2:1\n", "X_Y.txt", 1, 1,
                     "declares 3 rows but the features file X_Xf.txt has 2");
  expect_split_error(xf, "2 4\n0:1 4:1\n1:1\n", "X_Y.txt", 2, 5, "label index 4 is out of range");
  expect_split_error(xf, "2 4\n0:1 1\n1:1\n", "X_Y.txt", 2, 6, "expected ':' after label index 1");
  expect_split_error(xf, "2 4\n0:one\n1:1\n", "X_Y.txt", 2, 3, "expected a number");
  expect_split_error("2 10\n1:0.5 12:1\n\n", y, "X_Xf.txt", 2, 7, "feature index 12");
  expect_split_error("2 10 4\n1:0.5\n\n", y, "X_Xf.txt", 1, 6, "expected the end of the header");
  expect_split_error("2 10\n1:0.5\n2 10\n", y, "X_Xf.txt", 3, 1, "duplicate header");
  expect_split_error("2 10\n1:0.5\n", y, "X_Xf.txt", 3, 1, "file ends after 1");
  expect_split_error("", y, "X_Xf.txt", 1, 1, "empty");
}

TEST(XmcErrors, Npy) {
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const std::string y = "2 3\n0:1\n1:1 2:1\n";
  const std::string good = npy_bytes("<f4", "(2, 3)", v, 24);
  EXPECT_EQ(parse_xmc_npy(good, "x.npy", y, "y.txt").dense.size(), 6u);
  expect_npy_error("PK\x03\x04 not numpy", y, "not a NumPy .npy file");
  expect_npy_error(good.substr(0, 9), y, "not a NumPy .npy file");
  expect_npy_error(npy_bytes(">f4", "(2, 3)", v, 24), y, "dtype '>f4' is not supported");
  expect_npy_error(npy_bytes("<i4", "(2, 3)", v, 24), y, "expected '<f4' or '<f8'");
  expect_npy_error(npy_bytes("<f4", "(2, 3)", v, 24, 1, true), y, "Fortran order");
  expect_npy_error(npy_bytes("<f4", "(6,)", v, 24), y, "1 dimensions; expected 2");
  expect_npy_error(npy_bytes("<f4", "(2, 3)", v, 20), y, "truncated");
  expect_npy_error(npy_bytes("<f4", "(2, 2)", v, 24), y, "needs 16");
  expect_npy_error(npy_bytes("<f4", "(2, 0)", v, 0), y, "no feature columns");
  expect_npy_error(npy_bytes("<f4", "(99999999999, 999999)", v, 24), y, "needs more");
  expect_npy_error(good.substr(0, 40), y, "runs past the end");
  std::string bad_version = good;
  bad_version[6] = 9;
  expect_npy_error(bad_version, y, "version 9.0");
  const float nan_at_1_2[6] = {1, 2, 3, 4, 5, std::numeric_limits<float>::quiet_NaN()};
  expect_npy_error(npy_bytes("<f4", "(2, 3)", nan_at_1_2, 24), y, "row 1, column 2 is NaN");
  const double big[6] = {1, 2, 1e300, 4, 5, 6};
  expect_npy_error(npy_bytes("<f8", "(2, 3)", big, 48), y, "row 0, column 2 does not fit");
  expect_npy_error(good, "3 3\n0:1\n1:1\n2:1\n", "features file x.npy has 2");
}

TEST(XmcErrors, FilesThatCannotBeOpened) {
  TempDir dir;
  try {
    read_xmc_bow(dir.file("missing.txt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  try {
    load_xmc(dir.file("missing.txt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
  }
  try {
    write_xmc_bow(dir.file("no/such/dir/x.txt"), small_set());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
  }
  XmcDataset broken = small_set();
  broken.col[0] = 100000;
  EXPECT_THROW(format_xmc_bow(broken), Error);
  EXPECT_NE(xmc_check(broken), "");
}

// ---------------------------------------------------------------- cache

TEST(XmcCache, SecondLoadUsesTheCacheAndChangesInvalidateIt) {
  TempDir dir;
  const std::string path = dir.file("train.txt");
  const XmcDataset d = small_set();
  write_xmc_bow(path, d);

  LoadInfo info;
  expect_same(load_xmc(path, {}, &info), d);
  EXPECT_FALSE(info.from_cache);
  EXPECT_TRUE(info.cache_written) << info.cache_note;
  EXPECT_EQ(info.cache_path, path + ".pcache");
  EXPECT_TRUE(fs::exists(path + ".pcache"));

  expect_same(load_xmc(path, {}, &info), d);
  EXPECT_TRUE(info.from_cache) << info.cache_note;
  EXPECT_FALSE(info.cache_written);

  // New text, different size: the cache is stale, the text is read, and a
  // new cache replaces the old one.
  XmcDataset d2 = d;
  d2.val[0] = 0.125f;
  write_xmc_bow(path, d2);
  expect_same(load_xmc(path, {}, &info), d2);
  EXPECT_FALSE(info.from_cache);
  EXPECT_TRUE(info.cache_written);
  EXPECT_NE(info.cache_note.find("changed"), std::string::npos) << info.cache_note;
  expect_same(load_xmc(path, {}, &info), d2);
  EXPECT_TRUE(info.from_cache);

  // Same size and, forced back, the same mtime: the hash of the file's ends
  // still tells the difference.
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  std::string text = get_file(path);
  const size_t at = text.rfind(':') + 1;  // a digit of the last value
  text[at] = text[at] == '1' ? '2' : '1';
  put_file(path, text);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const XmcDataset d3 = load_xmc(path, {}, &info);
  EXPECT_FALSE(info.from_cache);
  EXPECT_NE(d3.val, d2.val);
  expect_same(d3, parse_xmc_bow(text, "x"));
}

TEST(XmcCache, CorruptTruncatedOrForeignCachesAreIgnoredAndRewritten) {
  TempDir dir;
  const std::string path = dir.file("train.txt");
  const XmcDataset d = small_set();
  write_xmc_bow(path, d);
  LoadInfo info;
  load_xmc(path, {}, &info);
  ASSERT_TRUE(info.cache_written);
  const std::string cache = get_file(path + ".pcache");

  struct Case {
    const char* what;
    std::string bytes;
    const char* note;
  };
  std::string flipped = cache;
  flipped[flipped.size() - 5] ^= 0x40;  // a label or value in the payload
  std::string header_flip = cache;
  header_flip[60] ^= 1;  // inside the source keys
  std::string counts = cache;
  counts[110] ^= 1;  // a count: the hash of the header catches it
  const Case cases[] = {
      {"payload bit flip", flipped, "corrupt"},
      {"header bit flip", header_flip, "corrupt"},
      {"count change", counts, "corrupt"},
      {"truncated", cache.substr(0, cache.size() - 9), "length"},
      {"header only", cache.substr(0, 100), "truncated header"},
      {"empty", "", "truncated header"},
      {"foreign", std::string(4096, 'x'), "not a pooch cache"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    put_file(path + ".pcache", c.bytes);
    expect_same(load_xmc(path, {}, &info), d);
    EXPECT_FALSE(info.from_cache);
    EXPECT_NE(info.cache_note.find(c.note), std::string::npos) << info.cache_note;
    EXPECT_TRUE(info.cache_written);
    EXPECT_EQ(get_file(path + ".pcache"), cache);  // rewritten, byte for byte
    load_xmc(path, {}, &info);
    EXPECT_TRUE(info.from_cache);
  }
  // Nothing left behind by the atomic writes.
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST(XmcCache, OptionsAndUnwritableCache) {
  TempDir dir;
  const std::string path = dir.file("train.txt");
  const XmcDataset d = small_set();
  write_xmc_bow(path, d);
  LoadInfo info;
  LoadOptions no_write;
  no_write.write_cache = false;
  expect_same(load_xmc(path, no_write, &info), d);
  EXPECT_FALSE(fs::exists(path + ".pcache"));

  LoadOptions elsewhere;
  elsewhere.cache_path = dir.file("elsewhere.bin");
  load_xmc(path, elsewhere, &info);
  EXPECT_TRUE(fs::exists(dir.file("elsewhere.bin")));
  load_xmc(path, elsewhere, &info);
  EXPECT_TRUE(info.from_cache);

  LoadOptions no_read = elsewhere;
  no_read.use_cache = false;
  load_xmc(path, no_read, &info);
  EXPECT_FALSE(info.from_cache);

  // Never the data file itself.
  LoadOptions self;
  self.cache_path = path;
  EXPECT_THROW(load_xmc(path, self), Error);
  expect_same(read_xmc_bow(path), d);

  // A cache that cannot be written never fails the load.
  LoadOptions bad;
  bad.cache_path = dir.file("no/such/dir/c.pcache");
  expect_same(load_xmc(path, bad, &info), d);
  EXPECT_FALSE(info.cache_written);
  EXPECT_NE(info.cache_note.find("cache not written"), std::string::npos) << info.cache_note;
}

TEST(XmcCache, SplitAndNpySetsAreCachedAndKeyedByBothFiles) {
  TempDir dir;
  const XmcDataset d = small_set();
  const std::string xf = dir.file("X_Xf.txt"), y = dir.file("X_Y.txt");
  write_xmc_split(xf, y, d);
  LoadInfo info;
  expect_same(load_xmc_split(xf, y, {}, &info), d);
  EXPECT_TRUE(info.cache_written);
  EXPECT_EQ(info.cache_path, xf + ".pcache");
  expect_same(load_xmc_split(xf, y, {}, &info), d);
  EXPECT_TRUE(info.from_cache);
  // Changing only the labels file invalidates the cache too: row 0 gets a
  // label it did not have in place of its first one.
  XmcDataset d2 = d;
  ASSERT_GT(d2.label_ptr[1], 0);
  const auto b = d2.label.begin(), e = d2.label.begin() + d2.label_ptr[1];
  int32_t fresh = 0;
  while (std::find(b, e, fresh) != e) ++fresh;
  *b = fresh;
  std::sort(b, e);
  ASSERT_EQ(xmc_check(d2), "");
  write_xmc_split_labels(y, d2);
  expect_same(load_xmc_split(xf, y, {}, &info), d2);
  EXPECT_FALSE(info.from_cache);

  XmcDataset dense;
  dense.features = dense.dense_dim = 4;
  dense.labels = 3;
  dense.row_ptr.assign(3, 0);
  dense.dense = {1, 2, 3, 4, 5, 6, 7, 8};
  dense.label_ptr = {0, 1, 3};
  dense.label = {2, 0, 1};
  const std::string npy = dir.file("x.npy"), ny = dir.file("y.txt");
  write_npy(npy, dense);
  write_xmc_split_labels(ny, dense);
  expect_same(load_xmc_split(npy, ny, {}, &info), dense);
  EXPECT_TRUE(info.cache_written);
  expect_same(load_xmc_split(npy, ny, {}, &info), dense);
  EXPECT_TRUE(info.from_cache);
}

// ---------------------------------------------------------------- synth

namespace {

uint64_t hash_set(const XmcDataset& d) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, d.row_ptr.data(), d.row_ptr.size() * 8);
  XXH3_64bits_update(s, d.col.data(), d.col.size() * 4);
  XXH3_64bits_update(s, d.val.data(), d.val.size() * 4);
  XXH3_64bits_update(s, d.label_ptr.data(), d.label_ptr.size() * 8);
  XXH3_64bits_update(s, d.label.data(), d.label.size() * 4);
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

struct LabelStats {
  double labels_per_point, points_per_label, slope;
  int64_t present;
};

// Mean labels per point, mean points per occurring label, and the slope of
// log count against log rank over the labels with at least `min_count`
// points (where counts are not dominated by rounding).
LabelStats label_stats(const XmcDataset& d, int64_t min_count) {
  std::vector<int64_t> cnt(static_cast<size_t>(d.labels));
  for (int32_t l : d.label) ++cnt[static_cast<size_t>(l)];
  std::sort(cnt.rbegin(), cnt.rend());
  LabelStats s{};
  s.present = std::count_if(cnt.begin(), cnt.end(), [](int64_t c) { return c > 0; });
  s.labels_per_point = static_cast<double>(d.label.size()) / static_cast<double>(d.rows());
  s.points_per_label = static_cast<double>(d.label.size()) / static_cast<double>(s.present);
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0;
  for (size_t r = 0; r < cnt.size() && cnt[r] >= min_count; ++r) {
    const double x = std::log(static_cast<double>(r + 1)),
                 y = std::log(static_cast<double>(cnt[r]));
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
    n += 1;
  }
  s.slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  return s;
}

}  // namespace

TEST(Synth, DeterministicMathMatchesLibm) {
  for (double x : {1e-300, 1e-5, 0.3, 0.7071, 1.0, 1.5, 2.0, 10.0, 12345.678, 1e300}) {
    EXPECT_NEAR(synth_log(x), std::log(x), 1e-14 * std::max(1.0, std::fabs(std::log(x)))) << x;
  }
  for (double x : {-700.0, -20.0, -1.0, -0.3, 0.0, 0.5, 1.0, 7.5, 300.0, 700.0}) {
    EXPECT_NEAR(synth_exp(x) / std::exp(x), 1.0, 1e-14) << x;
  }
  EXPECT_TRUE(std::isnan(synth_log(-1)));
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherData) {
  SynthOptions o;
  o.seed = 7;
  const SynthData a = make_synth("EURLex-4K", 0.05, o);
  const SynthData b = make_synth("eurlex-4k", 0.05, o);
  expect_same(a.train, b.train);
  expect_same(a.test, b.test);
  o.seed = 8;
  const SynthData c = make_synth("EURLex-4K", 0.05, o);
  EXPECT_NE(a.train.col, c.train.col);
  EXPECT_NE(a.train.label, c.train.label);
  // The exact bytes are part of the contract: a run on any platform (or
  // after any refactoring) must reproduce them. Update deliberately.
  const SynthData g = make_synth("EURLex-4K", 0.01, SynthOptions{});
  EXPECT_EQ(hash_set(g.train), 0x068ddb78ead3041aull) << std::hex << hash_set(g.train);
  EXPECT_EQ(hash_set(g.test), 0x657575d3acfa66b6ull) << std::hex << hash_set(g.test);
}

TEST(Synth, PresetShapesLabelFrequenciesAndPowerLaw) {
  struct Want {
    const char* name;
    double scale;
  };
  for (const Want w : {Want{"EURLex-4K", 1.0}, Want{"Wiki10-31K", 0.2}, Want{"AmazonCat-13K", 0.02},
                       Want{"Wiki-500K", 0.005}, Want{"Amazon-670K", 0.02}}) {
    SCOPED_TRACE(w.name);
    const SynthPreset* p = find_synth_preset(w.name);
    ASSERT_NE(p, nullptr);
    const SynthData s = make_synth(w.name, w.scale);
    const SynthShape& sh = s.shape;
    EXPECT_EQ(s.train.rows(), sh.train_rows);
    EXPECT_EQ(s.test.rows(), sh.test_rows);
    EXPECT_EQ(s.train.labels, sh.labels);
    EXPECT_EQ(s.train.features, sh.features);
    EXPECT_NEAR(static_cast<double>(sh.train_rows), p->shape.train_rows * w.scale, 1);
    EXPECT_NEAR(static_cast<double>(sh.labels), p->shape.labels * w.scale, 1);
    EXPECT_EQ(xmc_check(s.train), "");
    EXPECT_EQ(xmc_check(s.test), "");
    const LabelStats st = label_stats(s.train, 10);
    EXPECT_NEAR(st.labels_per_point / p->shape.labels_per_point, 1.0, 0.04);
    EXPECT_NEAR(st.points_per_label / p->shape.points_per_label, 1.0, 0.05);
    EXPECT_NEAR(-st.slope, p->shape.beta, 0.12);
    const LabelStats te = label_stats(s.test, 10);
    EXPECT_NEAR(te.labels_per_point / p->shape.labels_per_point, 1.0, 0.06);
    const double fpp =
        static_cast<double>(s.train.col.size()) / static_cast<double>(s.train.rows());
    EXPECT_NEAR(fpp / sh.features_per_point, 1.0, 0.1);
    // Rows are unit length.
    for (int64_t r = 0; r < std::min<int64_t>(50, s.train.rows()); ++r) {
      double n = 0;
      for (int64_t j = s.train.row_ptr[r]; j < s.train.row_ptr[r + 1]; ++j)
        n += static_cast<double>(s.train.val[j]) * s.train.val[j];
      if (s.train.row_ptr[r + 1] > s.train.row_ptr[r]) {
        EXPECT_NEAR(n, 1.0, 1e-5);
      }
    }
  }
}

TEST(Synth, ScaledAmazon670KKeepsItsShape) {
  const SynthPreset* p = find_synth_preset("Amazon-670K");
  ASSERT_NE(p, nullptr);
  const SynthShape s = synth_shape(*p, 0.01);
  EXPECT_EQ(s.train_rows, 4904);
  EXPECT_EQ(s.labels, 6701);
  EXPECT_EQ(s.features, 13591);  // sqrt scaling of the vocabulary
  EXPECT_DOUBLE_EQ(s.labels_per_point, 5.45);
  EXPECT_DOUBLE_EQ(s.points_per_label, 3.99);
  const SynthData d = make_synth(s);
  const LabelStats st = label_stats(d.train, 1);
  EXPECT_NEAR(st.points_per_label, 3.99, 0.2);
  EXPECT_NEAR(st.labels_per_point, 5.45, 0.25);
  EXPECT_GT(st.present, s.labels * 95 / 100);  // nearly every label has training points
}

TEST(Synth, LabelsArePredictableFromFeatures) {
  // A nearest-centroid classifier (each label's centroid is the sum of its
  // training rows) must beat always predicting the most frequent label by a
  // wide margin on the test set.
  const SynthData s = make_synth("EURLex-4K", 0.1);
  const XmcDataset& tr = s.train;
  const XmcDataset& te = s.test;
  const size_t D = static_cast<size_t>(tr.features), L = static_cast<size_t>(tr.labels);
  std::vector<float> centroid(L * D, 0.0f);
  std::vector<int64_t> freq(L, 0);
  for (int64_t r = 0; r < tr.rows(); ++r)
    for (int64_t a = tr.label_ptr[r]; a < tr.label_ptr[r + 1]; ++a) {
      const size_t l = static_cast<size_t>(tr.label[a]);
      ++freq[l];
      for (int64_t j = tr.row_ptr[r]; j < tr.row_ptr[r + 1]; ++j)
        centroid[l * D + static_cast<size_t>(tr.col[j])] += tr.val[j];
    }
  for (size_t l = 0; l < L; ++l) {
    double n = 0;
    for (size_t f = 0; f < D; ++f) n += centroid[l * D + f] * centroid[l * D + f];
    if (n > 0)
      for (size_t f = 0; f < D; ++f) centroid[l * D + f] /= static_cast<float>(std::sqrt(n));
  }
  const int32_t popular =
      static_cast<int32_t>(std::max_element(freq.begin(), freq.end()) - freq.begin());
  int hits = 0, base = 0;
  for (int64_t r = 0; r < te.rows(); ++r) {
    size_t best = 0;
    float best_score = -1;
    for (size_t l = 0; l < L; ++l) {
      float sc = 0;
      for (int64_t j = te.row_ptr[r]; j < te.row_ptr[r + 1]; ++j)
        sc += te.val[j] * centroid[l * D + static_cast<size_t>(te.col[j])];
      if (sc > best_score) {
        best_score = sc;
        best = l;
      }
    }
    const auto* b = te.label.data() + te.label_ptr[r];
    const auto* e = te.label.data() + te.label_ptr[r + 1];
    hits += std::find(b, e, static_cast<int32_t>(best)) != e;
    base += std::find(b, e, popular) != e;
  }
  const double p1 = static_cast<double>(hits) / te.rows();
  const double p1_base = static_cast<double>(base) / te.rows();
  std::printf("nearest-centroid P@1 %.3f, most-frequent-label P@1 %.3f\n", p1, p1_base);
  EXPECT_GT(p1, 0.5) << "P@1 " << p1 << " vs popularity " << p1_base;
  EXPECT_GT(p1, 2 * p1_base) << "P@1 " << p1 << " vs popularity " << p1_base;
}

TEST(Synth, RejectsBadArguments) {
  try {
    make_synth("MNIST", 1.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    EXPECT_NE(std::string(e.what()).find("Amazon-670K"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_synth("EURLex-4K", 0.0), Error);
  EXPECT_THROW(make_synth("EURLex-4K", -1.0), Error);
  EXPECT_THROW(make_synth("EURLex-4K", std::numeric_limits<double>::quiet_NaN()), Error);
  SynthShape bad;
  EXPECT_THROW(make_synth(bad), Error);
  // Tiny scales stay well formed.
  const SynthData t = make_synth("Wiki-500K", 1e-6);
  EXPECT_EQ(xmc_check(t.train), "");
  EXPECT_GE(t.train.rows(), 1);
}

TEST(Synth, EurLexAtFullScaleIsFastAndRoundTripsThroughTheCache) {
  TempDir dir;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const SynthData s = make_synth("EURLex-4K", 1.0);
  const auto t1 = clock::now();
  const std::string path = dir.file("train.txt");
  write_xmc_bow(path, s.train);
  const auto t2 = clock::now();
  LoadInfo info;
  const XmcDataset a = load_xmc(path, {}, &info);
  const auto t3 = clock::now();
  ASSERT_TRUE(info.cache_written);
  const XmcDataset b = load_xmc(path, {}, &info);
  const auto t4 = clock::now();
  ASSERT_TRUE(info.from_cache);
  expect_same(a, s.train);
  expect_same(b, s.train);
  const auto sec = [](auto d) { return std::chrono::duration<double>(d).count(); };
  std::printf("EURLex-4K scale 1: generate %.3f s, write %.3f s, parse %.3f s, cached %.3f s\n",
              sec(t1 - t0), sec(t2 - t1), sec(t3 - t2), sec(t4 - t3));
  // Generous bounds for a loaded CI machine; typical figures are 5-10x lower.
  EXPECT_LT(sec(t1 - t0), 5.0);
  EXPECT_LT(sec(t4 - t3), sec(t3 - t2));
}

// ---------------------------------------------------------------- fuzz

namespace {

// Applies one random edit: flip, insert or delete bytes, duplicate or drop
// a line, or truncate; the inserted bytes favour the format's own alphabet.
void mutate(std::string& s, std::mt19937_64& rng) {
  static const char alphabet[] = "0123456789:,. \n\r\t-+eEnaifx\x93\xff";
  const auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  const auto ch = [&] { return alphabet[pick(sizeof alphabet - 1)]; };
  switch (rng() % 7) {
    case 0:
      if (!s.empty()) s[pick(s.size())] = ch();
      break;
    case 1:
      s.insert(pick(s.size() + 1), 1, ch());
      break;
    case 2:
      if (!s.empty()) {
        const size_t at = pick(s.size());
        s.erase(at, 1 + pick(8));
      }
      break;
    case 3: {  // duplicate a line
      const size_t a = s.rfind('\n', pick(s.size()));
      const size_t from = a == std::string::npos ? 0 : a + 1;
      const size_t to = s.find('\n', from);
      s.insert(from, s.substr(from, to == std::string::npos ? std::string::npos : to - from + 1));
      break;
    }
    case 4:
      s.resize(pick(s.size() + 1));
      break;
    case 5:
      if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
      break;
    default: {  // a digit string somewhere: big numbers, new indices
      s.insert(pick(s.size() + 1), std::to_string(rng() >> pick(64)));
      break;
    }
  }
}

template <class Parse>
void fuzz(const std::string& seed_text, int iterations, int min_ok, uint64_t seed, Parse&& parse) {
  std::mt19937_64 rng(seed);
  int ok = 0, rejected = 0;
  for (int it = 0; it < iterations; ++it) {
    std::string s = seed_text;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) mutate(s, rng);
    try {
      const XmcDataset d = parse(s);
      EXPECT_EQ(xmc_check(d), "") << "accepted an inconsistent set from:\n" << s;
      ++ok;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-pooch exception " << e.what() << " for:\n" << s;
    }
  }
  // Both outcomes must actually occur, or the mutations are not exercising anything.
  EXPECT_GE(ok, min_ok) << "accepted " << ok << ", rejected " << rejected;
  EXPECT_GT(rejected, iterations / 4) << "accepted " << ok << ", rejected " << rejected;
}

}  // namespace

TEST(XmcFuzz, BagOfWordsMutationsSucceedOrThrowPoochError) {
  XmcDataset d = small_set();
  // A short seed text keeps each mutation likely to hit something that matters.
  d.row_ptr.resize(9);
  d.label_ptr.resize(9);
  d.col.resize(static_cast<size_t>(d.row_ptr.back()));
  d.val.resize(d.col.size());
  d.label.resize(static_cast<size_t>(d.label_ptr.back()));
  const std::string text = format_xmc_bow(d);
  fuzz(text, 20000, 400, 1, [](const std::string& s) { return parse_xmc_bow(s, "fuzz.txt"); });
}

TEST(XmcFuzz, SplitAndNpyMutationsSucceedOrThrowPoochError) {
  const std::string xf = "3 20\n1:0.5 3:1 19:2\n\n0:1e-3 7:4\n";
  const std::string y = "3 6\n0:1 5:1\n2:1\n\n";
  fuzz(xf, 5000, 100, 2, [&](const std::string& s) { return parse_xmc_split(s, "xf", y, "y"); });
  fuzz(y, 5000, 100, 3, [&](const std::string& s) { return parse_xmc_split(xf, "xf", s, "y"); });
  const float v[6] = {1, 2, 3, 4, 5, 6};
  const std::string npy = npy_bytes("<f4", "(2, 3)", v, 24);
  const std::string ny = "2 3\n0:1\n1:1 2:1\n";
  fuzz(npy, 10000, 50, 4, [&](const std::string& s) { return parse_xmc_npy(s, "x.npy", ny, "y"); });
}

TEST(XmcFuzz, CacheMutationsNeverLeakIntoTheData) {
  TempDir dir;
  const std::string path = dir.file("train.txt");
  const XmcDataset d = small_set();
  write_xmc_bow(path, d);
  LoadInfo info;
  load_xmc(path, {}, &info);
  const std::string cache = get_file(path + ".pcache");
  std::mt19937_64 rng(5);
  for (int it = 0; it < 300; ++it) {
    std::string c = cache;
    const size_t at = static_cast<size_t>(rng() % c.size());
    c[at] = static_cast<char>(c[at] ^ (1 + rng() % 255));
    put_file(path + ".pcache", c);
    LoadOptions o;
    o.write_cache = false;
    expect_same(load_xmc(path, o, &info), d);
    EXPECT_FALSE(info.from_cache) << "byte " << at;
  }
}
