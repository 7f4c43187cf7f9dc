// Dense data for pooch-run: X/Y from .npy files (checked) and the synthetic
// regression and classification sets of `synth --kind`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "dense.h"
#include "npy.h"

namespace cli {

namespace {

std::string where(int64_t row, int64_t col, int64_t width) {
  return width > 1 ? "row " + std::to_string(row) + ", column " + std::to_string(col)
                   : "row " + std::to_string(row);
}

// The first non-finite value of a rows × width array, as "row R, column C is nan".
std::string first_non_finite(const std::vector<float>& v, int64_t width) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) {
      const auto w = static_cast<size_t>(width);
      return where(static_cast<int64_t>(i / w), static_cast<int64_t>(i % w), width) + " is " +
             (std::isnan(v[i]) ? "nan" : "inf");
    }
  return {};
}

// splitmix64: a small deterministic generator for the synthetic sets.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double normal() {  // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }

 private:
  uint64_t s_;
};

}  // namespace

int load_dense(const std::string& x_path, const char* x_flag, const std::string& y_path,
               const char* y_flag, bool quiet, DenseData& d, Output& out) {
  const std::string xf = x_flag;
  NpyArray a;
  std::string err;
  if (!read_npy(x_path, &a, &err)) return out.fail(kBadInput, xf + ": " + err);
  if (a.shape.size() != 4 && (!a.is_float() || a.shape.size() != 2))
    return out.fail(kBadInput, xf + ": " + x_path + ": the features must be a 2-D float array " +
                                   "[rows, features] or images (uint8 N×H×W×C, float32 " +
                                   "N×C×H×W); it holds " + npy_type_name(a.type) + " " +
                                   npy_shape_str(a.shape));
  if (a.rows() == 0 || a.row_width() == 0)
    return out.fail(kBadInput,
                    xf + ": " + x_path + ": the array " + npy_shape_str(a.shape) + " is empty");
  d.x_path = x_path;
  d.rows = a.rows();
  d.width = a.row_width();
  if (a.shape.size() == 4) {
    if (!images_from_npy(a, &d.x, &d.image, &err))
      return out.fail(kBadInput, xf + ": " + x_path + ": " + err);
  } else {
    d.x = npy_as_f32(a);
  }
  if (const std::string bad = first_non_finite(d.x, d.width); !bad.empty())
    return out.fail(kBadInput, xf + ": " + x_path + ": " + bad);
  if (!quiet && d.image.c)
    std::printf("data: %s: %lld images of %lldx%lldx%lld (%s)\n", x_path.c_str(),
                static_cast<long long>(d.rows), static_cast<long long>(d.image.c),
                static_cast<long long>(d.image.h), static_cast<long long>(d.image.w),
                npy_type_name(a.type));
  else if (!quiet)
    std::printf("data: %s: %lld rows, %lld features (%s)\n", x_path.c_str(),
                static_cast<long long>(d.rows), static_cast<long long>(d.width),
                npy_type_name(a.type));
  if (y_path.empty()) return kOk;

  const std::string yf = y_flag;
  NpyArray b;
  if (!read_npy(y_path, &b, &err)) return out.fail(kBadInput, yf + ": " + err);
  if (b.rows() != d.rows)
    return out.fail(kBadInput, yf + ": " + y_path + " has " + std::to_string(b.rows()) +
                                   " rows, but " + x_path + " has " + std::to_string(d.rows));
  d.y_path = y_path;
  d.has_y = true;
  if (b.is_float()) {
    if (b.shape.size() > 2)
      return out.fail(kBadInput, yf + ": " + y_path + ": float targets must be [rows] or " +
                                     "[rows, outputs]; it holds " + npy_shape_str(b.shape));
    d.classes = false;
    d.outputs = b.row_width();
    if (d.outputs == 0)
      return out.fail(kBadInput, yf + ": " + y_path + ": the array " + npy_shape_str(b.shape) +
                                     " has no targets");
    d.y = npy_as_f32(b);
    if (const std::string bad = first_non_finite(d.y, d.outputs); !bad.empty())
      return out.fail(kBadInput, yf + ": " + y_path + ": " + bad);
    if (!quiet)
      std::printf("targets: %s: %lld rows, %lld outputs (%s)\n", y_path.c_str(),
                  static_cast<long long>(d.rows), static_cast<long long>(d.outputs),
                  npy_type_name(b.type));
    return kOk;
  }
  if (b.shape.size() > 2 || b.row_width() != 1)
    return out.fail(kBadInput, yf + ": " + y_path + ": class ids must be [rows] (one id per " +
                                   "row); it holds " + npy_type_name(b.type) + " " +
                                   npy_shape_str(b.shape));
  const std::vector<int64_t> ids = npy_as_i64(b);
  d.classes = true;
  d.cls.resize(ids.size());
  int64_t most = -1;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] < 0 || ids[r] > std::numeric_limits<int32_t>::max() - 1)
      return out.fail(kBadInput, yf + ": " + y_path + ": row " + std::to_string(r) +
                                     " holds the class id " + std::to_string(ids[r]) +
                                     "; class ids are 0, 1, 2, ... (below 2^31 - 1)");
    d.cls[r] = static_cast<int32_t>(ids[r]);
    most = std::max(most, ids[r]);
  }
  d.outputs = most + 1;
  if (!quiet)
    std::printf("targets: %s: %lld class ids in [0, %lld) (%s)\n", y_path.c_str(),
                static_cast<long long>(d.rows), static_cast<long long>(d.outputs),
                npy_type_name(b.type));
  return kOk;
}

int run_dense_synth(const DenseSynthFlags& f, uint64_t seed, const std::string& dir, Output& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool regression = f.kind == "regression";
  const int64_t outputs = f.outputs > 0 ? f.outputs : (regression ? 2 : 4);
  if (!regression && outputs < 2)
    return out.fail(kUsage, "--outputs: a classification set needs at least 2 classes");
  const int64_t rows = f.rows, width = f.features;
  if (rows * width > (int64_t{1} << 31))
    return out.fail(kUsage, "--rows × --features: " + std::to_string(rows * width) +
                                " values is more than synth writes (2^31)");

  Rng rng(seed * 0x2545f4914f6cdd1dull + 17);
  // Directions of the targets: a[j], b[j] in R^width with |a| about 2.
  const auto W = static_cast<size_t>(width), N = static_cast<size_t>(outputs);
  std::vector<double> a(N * W), b(N * W);
  const double scale = 2.0 / std::sqrt(static_cast<double>(width));
  for (double& v : a) v = rng.normal() * scale;
  for (double& v : b) v = rng.normal() * scale;

  std::vector<float> x(static_cast<size_t>(rows) * W);
  std::vector<float> y(regression ? static_cast<size_t>(rows) * N : 0);
  std::vector<int32_t> cls(regression ? 0 : static_cast<size_t>(rows));
  std::vector<int64_t> counts(N, 0);
  for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
    float* xr = x.data() + r * W;
    for (size_t i = 0; i < W; ++i) xr[i] = static_cast<float>(2 * rng.uniform() - 1);
    int64_t best = 0;
    double best_v = -1e300;
    for (size_t j = 0; j < N; ++j) {
      double u = 0, v = 0;
      for (size_t i = 0; i < W; ++i) {
        u += a[j * W + i] * xr[i];
        v += b[j * W + i] * xr[i];
      }
      // Regression: a smooth function of two projections plus noise;
      // classification: the class with the largest (nonlinear) score.
      const double t = std::sin(u) + 0.5 * v * v + f.noise * rng.normal();
      if (regression) {
        y[r * N + j] = static_cast<float>(t);
      } else if (const double s = u + 0.5 * std::sin(3 * v) + f.noise * rng.normal(); s > best_v) {
        best_v = s;
        best = static_cast<int64_t>(j);
      }
    }
    if (!regression) {
      cls[r] = static_cast<int32_t>(best);
      ++counts[static_cast<size_t>(best)];
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return out.fail(kBadInput, "synth: cannot create '" + dir + "': " + ec.message());
  const std::string xp = (std::filesystem::path(dir) / "X.npy").string();
  const std::string yp = (std::filesystem::path(dir) / "Y.npy").string();
  std::string err;
  if (!write_npy(xp, NpyType::f32, {rows, width}, x.data(), &err) ||
      (regression ? !write_npy(yp, NpyType::f32, {rows, outputs}, y.data(), &err)
                  : !write_npy(yp, NpyType::i32, {rows}, cls.data(), &err)))
    return out.fail(kBadInput, "synth: " + err);

  std::printf("features: %s: %lld rows, %lld features (float32)\n", xp.c_str(),
              static_cast<long long>(rows), static_cast<long long>(width));
  if (regression) {
    std::printf("targets: %s: %lld rows, %lld outputs (float32)\n", yp.c_str(),
                static_cast<long long>(rows), static_cast<long long>(outputs));
  } else {
    std::string c;
    for (int64_t n : counts) c += (c.empty() ? "" : " ") + std::to_string(n);
    std::printf("targets: %s: %lld class ids in [0, %lld) (int32; rows per class: %s)\n",
                yp.c_str(), static_cast<long long>(rows), static_cast<long long>(outputs),
                c.c_str());
  }
  const double secs = seconds_since(t0);
  std::printf("synth %s (seed %llu) in %.2f s\n", f.kind.c_str(),
              static_cast<unsigned long long>(seed), secs);
  Json& res = out.result();
  res["kind"] = f.kind;
  res["x"] = {{"path", xp}, {"rows", rows}, {"features", width}};
  res["y"] = {{"path", yp}, {"rows", rows}, {regression ? "outputs" : "classes", outputs}};
  if (!regression) res["y"]["rows_per_class"] = counts;
  res["seed"] = seed;
  res["seconds"] = secs;
  return kOk;
}

}  // namespace cli
