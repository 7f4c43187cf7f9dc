// Random inputs for the kernel checker's cases. Everything draws from the
// caller's seeded Rng so a case is the same on every run with the same seed.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "opcheck.h"

namespace pooch::opcheck {

namespace {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw std::invalid_argument("opcheck: negative dimension in a case shape");
    n *= d;
  }
  return n;
}

}  // namespace

HostTensor randn(Rng& rng, Shape shape, std::string name, double scale) {
  HostTensor t{DType::f32, std::move(shape), {}, std::move(name)};
  std::normal_distribution<double> dist(0.0, 1.0);
  const int64_t n = numel_of(t.shape);
  t.values.resize(static_cast<size_t>(n));
  // Rounded to f32 here so that the values the reference and the finite
  // differences see are exactly the ones the f32 kernels get.
  for (double& v : t.values) v = static_cast<float>(scale * dist(rng));
  return t;
}

// Half-open [lo, hi), as numpy and PyTorch do: randint(rng, s, 0, n, ...) gives
// valid indices into a dimension of size n.
HostTensor randint(Rng& rng, Shape shape, int64_t lo, int64_t hi, DType dt, std::string name) {
  if (hi <= lo)
    throw std::invalid_argument("opcheck: randint needs lo < hi (the range is [lo, hi))");
  HostTensor t{dt, std::move(shape), {}, std::move(name)};
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  t.values.resize(static_cast<size_t>(numel_of(t.shape)));
  for (double& v : t.values) v = static_cast<double>(dist(rng));
  return t;
}

std::vector<HostTensor> random_csr(Rng& rng, int64_t rows, int64_t features, double density,
                                   int64_t cap_extra) {
  if (rows < 0 || features < 0 || cap_extra < 0)
    throw std::invalid_argument("opcheck: random_csr needs rows, features, cap_extra >= 0");
  std::bernoulli_distribution take(std::clamp(density, 0.0, 1.0));
  std::normal_distribution<double> val(0.0, 1.0);

  // Each row holds distinct features in ascending order, as a bag-of-words
  // batch does; the same feature may appear in many rows.
  std::vector<double> ptr{0.0}, idx, vals;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t f = 0; f < features; ++f)
      if (take(rng)) {
        idx.push_back(static_cast<double>(f));
        vals.push_back(static_cast<float>(val(rng)));
      }
    ptr.push_back(static_cast<double>(idx.size()));
  }

  // The tail past ptr[rows] is junk that no kernel may read: indices outside
  // [0, features) (one past the end, negative, and a valid one so that a
  // kernel which does not crash on it still picks up the NaN beside it) and
  // NaN values. A kernel that runs past ptr[rows] produces NaN or garbage.
  const double junk_idx[] = {static_cast<double>(features), -1.0, 0.0,
                             static_cast<double>(features) + 1000.0};
  for (int64_t j = 0; j < cap_extra; ++j) {
    idx.push_back(junk_idx[j % 4]);
    vals.push_back(std::numeric_limits<double>::quiet_NaN());
  }

  const auto cap = static_cast<int64_t>(idx.size());
  return {
      HostTensor{DType::i32, {rows + 1}, std::move(ptr), "ptr"},
      HostTensor{DType::i32, {cap}, std::move(idx), "idx"},
      HostTensor{DType::f32, {cap}, std::move(vals), "val"},
  };
}

}  // namespace pooch::opcheck
