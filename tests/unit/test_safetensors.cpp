// safetensors: files written by the Python package read exactly, files
// pooch writes byte-identical to the committed golden (which the Python
// package reads: tests/golden/make_safetensors_golden.py --check), and every
// hostile header refused with a message naming the file, the tensor and the
// field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "formats/safetensors.h"
#include "runtime/core/error.h"

using namespace pooch;
namespace st = pooch::safetensors;
namespace fs = std::filesystem;

namespace {

const std::string kGoldenDir = POOCH_GOLDEN_DIR;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The golden formula (make_safetensors_golden.py).
double float_value(int64_t i) {
  return static_cast<double>(i % 97) * 0.25 - 12;
}
int64_t int_value(int64_t i, bool u8) {
  return u8 ? i * 7 + 1 : i * 7 - 30;
}

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  st::DType dtype;
};
const std::vector<Spec> kSpecs = {
    {"a.f32", {3, 5}, st::DType::F32}, {"b.f16", {4, 2, 3}, st::DType::F16},
    {"c.bf16", {7}, st::DType::BF16},  {"d.f64", {2, 2}, st::DType::F64},
    {"e.i64", {5}, st::DType::I64},    {"f.i32", {2, 3}, st::DType::I32},
    {"g.u8", {6}, st::DType::U8},      {"h.empty", {0, 4}, st::DType::F32},
    {"i.scalar", {}, st::DType::F32},
};

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The bytes the formula gives for one tensor (f16/bf16: these values are exact in both).
std::vector<unsigned char> golden_bytes(const Spec& s) {
  const int64_t n = count(s.shape);
  std::vector<unsigned char> b(static_cast<size_t>(n) * st::dtype_size(s.dtype));
  for (int64_t i = 0; i < n; ++i) {
    unsigned char* p = b.data() + i * st::dtype_size(s.dtype);
    const double f = float_value(i);
    switch (s.dtype) {
      case st::DType::F32: {
        const float v = static_cast<float>(f);
        std::memcpy(p, &v, 4);
        break;
      }
      case st::DType::F64:
        std::memcpy(p, &f, 8);
        break;
      case st::DType::BF16: {
        const float v = static_cast<float>(f);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);  // exact: few mantissa bits
        std::memcpy(p, &h, 2);
        break;
      }
      case st::DType::F16: {
        // Values k/4 - 12 with |v| < 13: sign, exponent, 10-bit mantissa exactly.
        const float v = static_cast<float>(f);
        uint16_t h = 0;
        if (v != 0) {
          int e;
          const float m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
          const auto man = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
          h = static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | man);
        }
        std::memcpy(p, &h, 2);
        break;
      }
      case st::DType::I64: {
        const int64_t v = int_value(i, false);
        std::memcpy(p, &v, 8);
        break;
      }
      case st::DType::I32: {
        const auto v = static_cast<int32_t>(int_value(i, false));
        std::memcpy(p, &v, 4);
        break;
      }
      case st::DType::U8:
        *p = static_cast<unsigned char>(int_value(i, true));
        break;
      default:
        ADD_FAILURE();
    }
  }
  return b;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("pooch_st_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A file with the given header text and `data` bytes of zeros.
std::string make_file(const std::string& header, size_t data) {
  std::string b(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  return b + header + std::string(data, '\0');
}

// Parses `bytes` from memory and through a Reader on disk; both must refuse
// with POOCH_ERR_BAD_INPUT and a message holding every one of `want`.
void expect_refused(const std::string& bytes, const std::vector<std::string>& want) {
  SCOPED_TRACE(bytes.size() > 8 ? bytes.substr(8, 200) : "(short)");
  try {
    st::parse_buffer(bytes.data(), bytes.size(), "mem.safetensors");
    ADD_FAILURE() << "parse_buffer accepted it";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    EXPECT_NE(std::string(e.what()).find("mem.safetensors"), std::string::npos) << e.what();
    for (const std::string& w : want)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
  }
  const std::string path = temp_path("hostile.safetensors");
  spit(path, bytes);
  try {
    st::Reader r(path);
    ADD_FAILURE() << "Reader accepted it";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove(path);
}

}  // namespace

TEST(Safetensors, ReadsWhatThePythonPackageWrote) {
  st::Reader r(kGoldenDir + "/python_written.safetensors");
  EXPECT_EQ(r.header().metadata.at("format"), "pt");
  EXPECT_EQ(r.header().metadata.at("source"), "safetensors-python");
  ASSERT_EQ(r.header().tensors.size(), kSpecs.size());
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(s.name);
    const st::TensorInfo& t = r.at(s.name);
    EXPECT_EQ(t.dtype, s.dtype);
    EXPECT_EQ(t.shape, s.shape);
    std::vector<unsigned char> got(t.bytes());
    r.read(t, got.data());
    EXPECT_EQ(got, golden_bytes(s));
    if (s.dtype == st::DType::F32 || s.dtype == st::DType::F16 || s.dtype == st::DType::BF16 ||
        s.dtype == st::DType::F64) {
      const std::vector<float> f = r.read_f32(t);
      ASSERT_EQ(static_cast<int64_t>(f.size()), count(s.shape));
      for (size_t i = 0; i < f.size(); ++i)
        EXPECT_EQ(f[i], static_cast<float>(float_value(static_cast<int64_t>(i))));
    } else {
      EXPECT_THROW(r.read_f32(t), Error);
    }
  }
  EXPECT_THROW(r.at("missing"), Error);
}

TEST(Safetensors, WritesTheCommittedGoldenByteForByte) {
  std::vector<std::vector<unsigned char>> data;
  std::vector<st::TensorOut> out;
  for (const Spec& s : kSpecs) data.push_back(golden_bytes(s));
  for (size_t i = 0; i < kSpecs.size(); ++i)
    out.push_back({kSpecs[i].name, kSpecs[i].dtype, kSpecs[i].shape, data[i].data()});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"source", "pooch"}};
  const std::string path = temp_path("written.safetensors");
  st::write_file(path, out, meta);
  // Read back through our reader.
  {
    st::Reader r(path);
    EXPECT_EQ(r.header().metadata, meta);
    EXPECT_EQ(r.header().data_start % 8, 0u);
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      std::vector<unsigned char> got(r.at(kSpecs[i].name).bytes());
      r.read(r.at(kSpecs[i].name), got.data());
      EXPECT_EQ(got, data[i]) << kSpecs[i].name;
    }
  }
  // The committed copy is the file the Python package was shown to read
  // (make_safetensors_golden.py --check); a writer change that alters the
  // bytes must be checked against Python again.
  if (std::getenv("POOCH_WRITE_GOLDEN"))
    spit(kGoldenDir + "/pooch_written.safetensors", slurp(path));
  EXPECT_EQ(slurp(path), slurp(kGoldenDir + "/pooch_written.safetensors"));
  fs::remove(path);
}

TEST(Safetensors, WriterRefusesBadTensors) {
  const float x = 1;
  const std::string path = temp_path("bad.safetensors");
  EXPECT_THROW(st::write_file(path, {{"", st::DType::F32, {1}, &x}}), Error);
  EXPECT_THROW(st::write_file(path, {{"__metadata__", st::DType::F32, {1}, &x}}), Error);
  EXPECT_THROW(
      st::write_file(path, {{"a", st::DType::F32, {1}, &x}, {"a", st::DType::F32, {1}, &x}}),
      Error);
  EXPECT_THROW(st::write_file(path, {{"a", st::DType::F32, {-1}, &x}}), Error);
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, HostileHeaders) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  // The valid file parses.
  {
    const std::string b = make_file(ok, 24);
    const st::Header h = st::parse_buffer(b.data(), b.size(), "mem");
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.data_start, 8 + ok.size());
  }
  // Length prefix.
  expect_refused(std::string(5, '\0'), {"fewer than the 8-byte"});
  {
    std::string b = make_file(ok, 24);
    const uint64_t huge = st::kMaxHeaderBytes + 1;
    std::memcpy(b.data(), &huge, 8);
    expect_refused(b, {"header length", "more than"});
    const uint64_t past = b.size();
    std::memcpy(b.data(), &past, 8);
    expect_refused(b, {"header length", "only"});
  }
  expect_refused(make_file(" " + ok, 24), {"does not start with '{'"});
  expect_refused(make_file(R"({"w":{"dtype":"F32",)", 0), {"does not parse"});
  expect_refused(make_file(ok + "x", 24), {"does not parse"});
  expect_refused(make_file(std::string("{\"w\xff\":1}"), 0), {"does not parse"});  // bad UTF-8
  // Duplicates.
  expect_refused(
      make_file(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          4),
      {"'w' twice"});
  expect_refused(
      make_file(R"({"w":{"dtype":"F32","dtype":"F16","shape":[2,3],"data_offsets":[0,24]}})", 24),
      {"'dtype' twice"});
  // Fields.
  expect_refused(make_file(R"({"w":{"dtype":"F33","shape":[2,3],"data_offsets":[0,24]}})", 24),
                 {"tensor 'w'", "'dtype'", "F33"});
  expect_refused(make_file(R"({"w":{"dtype":4,"shape":[2,3],"data_offsets":[0,24]}})", 24),
                 {"tensor 'w'", "'dtype'", "not a string"});
  expect_refused(make_file(R"({"w":{"shape":[2,3],"data_offsets":[0,24]}})", 24),
                 {"tensor 'w'", "'dtype' is missing"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,24]}})", 24),
                 {"'shape' is missing"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3]}})", 24),
                 {"'data_offsets' is missing"});
  expect_refused(
      make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"x":1}})", 24),
      {"unknown field 'x'"});
  expect_refused(make_file(R"({"w":[1,2]})", 0), {"tensor 'w'", "not an object"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]}})", 24),
                 {"'shape' dimension 0"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2.5,3],"data_offsets":[0,24]}})", 24),
                 {"'shape' dimension 0"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":6,"data_offsets":[0,24]}})", 24),
                 {"'shape'", "not an array"});
  expect_refused(
      make_file(
          R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
          4),
      {"17 dimensions"});
  expect_refused(
      make_file(
          R"({"w":{"dtype":"F64","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
          8),
      {"more elements than 64 bits"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0]}})", 24),
                 {"'data_offsets'", "two offsets"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[-1,24]}})", 24),
                 {"'data_offsets' [0]"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]}})", 24),
                 {"end comes before the start"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 20),
                 {"tensor 'w'", "past the data section's 20 bytes"});
  expect_refused(make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20),
                 {"spans 20 bytes", "takes 24"});
  // Coverage of the data section: a gap, an overlap, bytes at the end.
  expect_refused(
      make_file(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          12),
      {"tensor 'b'", "starts at 8", "gap"});
  expect_refused(
      make_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8),
      {"tensor 'b'", "overlap"});
  expect_refused(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                 {"tensor 'a'", "starts at 4"});
  expect_refused(make_file(ok, 28), {"4 bytes at the end belong to no tensor"});
  // Metadata.
  expect_refused(make_file(R"({"__metadata__":{"format":1}})", 0), {"'__metadata__'", "'format'"});
  expect_refused(make_file(R"({"__metadata__":[]})", 0), {"'__metadata__'", "not an object"});
  expect_refused(make_file(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0),
                 {"empty"});
  // Offsets of file bytes are named where a range is wrong.
  expect_refused(make_file(ok, 20), {"file byte"});
}

TEST(Safetensors, EmptyFileOfTensorsAndZeroSizeTensors) {
  const std::string b = make_file(
      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
      2);
  const st::Header h = st::parse_buffer(b.data(), b.size(), "mem");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "z");  // data order: the empty one first
  const std::string e = make_file("{}", 0);
  EXPECT_TRUE(st::parse_buffer(e.data(), e.size(), "mem").tensors.empty());
}

TEST(Safetensors, FuzzedHeadersNeverCrash) {
  const std::string good = slurp(kGoldenDir + "/python_written.safetensors");
  std::mt19937_64 rng(7);
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string b = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t at = rng() % std::min<size_t>(b.size(), 600);
      switch (rng() % 3) {
        case 0:
          b[at] = static_cast<char>(rng());
          break;
        case 1:
          b[at] = "0123456789[]{},:\"-"[rng() % 18];
          break;
        default:
          b.resize(rng() % b.size());
          break;
      }
      if (b.empty()) break;
    }
    try {
      const st::Header h = st::parse_buffer(b.data(), b.size(), "fuzz");
      // Whatever parses lies within the buffer.
      for (const st::TensorInfo& t : h.tensors) ASSERT_LE(h.data_start + t.end, b.size());
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);
}
