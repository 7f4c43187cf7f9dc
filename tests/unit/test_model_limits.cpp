// Model builders at their limits: the fan-in wiring initialiser stays
// linear in the fan-in (and bit-identical to the quadratic original), and
// spec values outside what the runtime can run are refused up front, naming
// the field and the largest value allowed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/philox.h"
#include "runtime/core/error.h"
#include "runtime/models/model.h"
#include "runtime/models/model_spec.h"

namespace pooch {
namespace {

// The original wiring: Floyd's sampling with a linear search of the row's
// picks (O(K^2) per row). The values every existing model was built with.
std::vector<int32_t> floyd_reference(int64_t rows, int64_t K, int64_t H, uint64_t seed,
                                     uint32_t key) {
  std::vector<int32_t> out;
  std::vector<int32_t> pick(static_cast<size_t>(K));
  uint64_t counter = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t n = 0;
    for (int64_t j = H - K; j < H; ++j) {
      const float u = kern::philox_uniform(seed, 0, key, counter++);
      auto t = static_cast<int32_t>(std::min<int64_t>(j, static_cast<int64_t>(u * double(j + 1))));
      if (std::find(pick.begin(), pick.begin() + n, t) != pick.begin() + n)
        t = static_cast<int32_t>(j);
      pick[static_cast<size_t>(n++)] = t;
    }
    std::sort(pick.begin(), pick.end());
    out.insert(out.end(), pick.begin(), pick.end());
  }
  return out;
}

std::vector<int32_t> wiring(int64_t rows, int64_t K, int64_t H, uint64_t seed, uint32_t key) {
  TensorDesc d;
  d.name = "head.index";
  d.dtype = H <= 65536 ? DType::u16 : DType::i32;
  d.shape = {rows, K};
  WeightInit w;
  w.kind = WeightInit::Kind::fan_in_index;
  w.a = static_cast<double>(H);
  w.stream = key;
  const std::vector<std::byte> bytes = initial_value(d, w, seed);
  std::vector<int32_t> v(static_cast<size_t>(rows * K));
  for (size_t i = 0; i < v.size(); ++i) {
    if (d.dtype == DType::u16) {
      uint16_t x;
      std::memcpy(&x, bytes.data() + i * 2, 2);
      v[i] = x;
    } else {
      std::memcpy(&v[i], bytes.data() + i * 4, 4);
    }
  }
  return v;
}

TEST(FanInWiring, SameValuesAsTheOriginalSampler) {
  struct Case {
    int64_t rows, K, H;
    uint64_t seed;
    uint32_t key;
  };
  // Small and demo-sized heads, K = H, K = 1, an i32 index, and an input far
  // wider than the fan-in (the hash-set path).
  for (const Case& c : std::vector<Case>{{7, 3, 10, 1, 5},
                                         {3993, 32, 256, 1, 9},
                                         {50, 64, 64, 3, 2},
                                         {20, 1, 1, 4, 1},
                                         {9, 100, 70000, 2, 7},
                                         {4, 8, 100000000, 5, 3}})
    EXPECT_EQ(wiring(c.rows, c.K, c.H, c.seed, c.key),
              floyd_reference(c.rows, c.K, c.H, c.seed, c.key))
        << c.rows << "x" << c.K << " over " << c.H;
}

TEST(FanInWiring, FanInEqualToTheWidthIsFast) {
  // O(K^2) per row took minutes here; O(K log K) takes milliseconds. The
  // bound is generous: this is a functional check, not a benchmark.
  const int64_t H = 65536, K = 65536, L = 16;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> v = wiring(L, K, H, 1, 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0);
  // Every row is then a permutation of [0, H): sorted, it is 0, 1, ..., H-1.
  for (int64_t r = 0; r < L; ++r)
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(v[static_cast<size_t>(r * K + k)], k);
}

// The message of the error spec_from_json throws for `text` ("" if none).
std::string spec_error(const std::string& text) {
  try {
    spec_from_json(text, "m.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    return e.what();
  }
  return "";
}

std::string with(const std::string& fields, const std::string& layers = "") {
  return R"({"input": {"width": 100}, "labels": 50, "layers": [)" +
         (layers.empty() ? std::string(R"({"type": "linear", "width": 8}, {"type": "dense"})")
                         : layers) +
         "]" + fields + "}";
}

TEST(SpecLimits, FieldsOutOfRangeNameTheFieldAndTheLargestValue) {
  EXPECT_EQ(spec_error(with("")), "");
  EXPECT_NE(spec_error(with(R"(, "batch": 4294967297)"))
                .find("m.json: batch is 4294967297; it must be from 1 to 33554431"),
            std::string::npos);
  // With explicit budgets the batch may be as large as an i32 count.
  EXPECT_EQ(spec_error(with(R"(, "batch": 100000000, "max_nnz": 1000, "max_labels": 1000)")), "");
  EXPECT_NE(spec_error(with(R"(, "topk": 4294967297)")).find("topk is 4294967297"),
            std::string::npos);
  EXPECT_NE(spec_error(with(R"(, "seed": -1)")).find("seed is -1"), std::string::npos);
  EXPECT_NE(spec_error(with(R"(, "max_nnz": 2147483648)")).find("max_nnz is 2147483648"),
            std::string::npos);
  EXPECT_NE(spec_error(with("", R"({"type": "linear", "width": 1099511627776}, {"type": "dense"})"))
                .find("layers[0].width is 1099511627776; it must be from 1 to 2147483647"),
            std::string::npos);
  const std::string wide =
      R"({"input": {"width": 100}, "labels": 2147483647, "layers": [{"type": "linear", "width": 70000}, {"type": "ffi", "fan_in": 65536}]})";
  EXPECT_NE(spec_error(wide).find("fan_in can be at most 1"), std::string::npos);
}

TEST(SpecLimits, ARepeatedKeyIsAnError) {
  EXPECT_NE(spec_error(with(R"(, "loss": "bce", "loss": "softmax")"))
                .find("the key \"loss\" appears twice"),
            std::string::npos);
  EXPECT_NE(spec_error(with("", R"({"type": "linear", "width": 8, "width": 9}, {"type": "dense"})"))
                .find("the key \"width\" appears twice"),
            std::string::npos);
  // The same key in two different objects is fine.
  EXPECT_EQ(
      spec_error(with(
          "",
          R"({"type": "linear", "width": 8}, {"type": "linear", "width": 9}, {"type": "dense"})")),
      "");
}

}  // namespace
}  // namespace pooch
