// Kernel checker cases for the optimizer updates (docs/OPS.md, "Optimizer
// updates"). The ops write into w and their states; the runner compares those
// inputs after the call. States are drawn as a run would leave them (v = m² +
// a little), so m/√v stays moderate and a wrong formula shows as a large error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

HostTensor second_moment(Rng& rng, const HostTensor& m, std::string name) {
  HostTensor v = randn(rng, m.shape, std::move(name), 0.1);
  for (size_t i = 0; i < v.values.size(); ++i)
    v.values[i] = static_cast<float>(m.values[i] * m.values[i] + std::fabs(v.values[i]));
  return v;
}

std::string shape_label(const Shape& s) {
  std::string label = "w";  // (appending: GCC 12 warns falsely on "w" + string)
  label += shape_str(s);
  return label;
}

// rows[0] = n, then n distinct ascending ids drawn from [0, f), then junk in
// the R - n unused slots: ids of unlisted rows (a kernel reading past n would
// update them) and out-of-range ids (it would write out of bounds).
HostTensor row_list(Rng& rng, int64_t f, int64_t r, int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(f));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::sort(ids.begin(), ids.begin() + n);
  HostTensor rows{DType::i32, {1 + r}, {}, "rows"};
  rows.values.push_back(static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i)
    rows.values.push_back(static_cast<double>(ids[static_cast<size_t>(i)]));
  for (int64_t i = n; i < r; ++i) {
    const bool unlisted = i < f && i % 2 == 0;
    rows.values.push_back(unlisted ? static_cast<double>(ids[static_cast<size_t>(i)])
                                   : static_cast<double>(i % 3 ? f + 1000 : -1));
  }
  return rows;
}

struct SgdAttrs {
  double momentum, wd;
};
struct AdamAttrs {
  double wd;
  int decoupled;
};
const SgdAttrs kSgd[] = {{0.0, 0.0}, {0.9, 0.0}, {0.0, 0.01}, {0.9, 0.01}};
const AdamAttrs kAdam[] = {{0.0, 0}, {0.01, 0}, {0.0, 1}, {0.01, 1}};

Attrs sgd_attrs(const SgdAttrs& a) {
  return Attrs{{"lr", 0.05}, {"momentum", a.momentum}, {"weight_decay", a.wd}};
}
Attrs adam_attrs(const AdamAttrs& a) {
  return Attrs{{"lr", 0.01},  {"beta1", 0.9},         {"beta2", 0.999},
               {"eps", 1e-8}, {"weight_decay", a.wd}, {"decoupled", a.decoupled}};
}
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
std::string sgd_label(const SgdAttrs& a) {
  return " momentum=" + num(a.momentum) + " wd=" + num(a.wd);
}
std::string adam_label(const AdamAttrs& a) {
  return std::string(a.decoupled ? " AdamW" : " Adam") + " wd=" + num(a.wd);
}

}  // namespace

std::vector<OpCase> optim_cases(Rng& rng) {
  std::vector<OpCase> cases;

  // Dense: empty, one element, odd sizes, and one past the CPU kernels'
  // parallel threshold.
  const Shape dense_shapes[] = {{0}, {0, 4}, {1}, {7}, {3, 5}, {257, 129}};
  for (const Shape& s : dense_shapes) {
    for (const SgdAttrs& a : kSgd) {
      OpCase c;
      c.op = "sgd_update";
      c.attrs = sgd_attrs(a);
      c.inputs = {randn(rng, s, "w"), randn(rng, s, "g"), randn(rng, s, "mom", 0.1)};
      c.label = shape_label(s) + sgd_label(a);
      cases.push_back(std::move(c));
    }
    for (const AdamAttrs& a : kAdam) {
      OpCase c;
      c.op = "adam_update";
      c.attrs = adam_attrs(a);
      HostTensor m = randn(rng, s, "m", 0.1);
      HostTensor v = second_moment(rng, m, "v");
      c.inputs = {randn(rng, s, "w"), randn(rng, s, "g"), std::move(m), std::move(v)};
      c.label = shape_label(s) + adam_label(a);
      cases.push_back(std::move(c));
    }
  }

  // Gradient clipping: the gradients' sum of squares as the last input, one
  // above max_norm² (the factor 1.5/3 scales g) and one below (factor 1).
  for (const Shape& s : {Shape{7}, Shape{257, 129}}) {
    for (const double sumsq : {9.0, 0.01}) {
      const HostTensor n{DType::f32, {1}, {sumsq}, "sumsq"};
      const std::string label = shape_label(s) + " clip 1.5, |g|^2=" + num(sumsq);
      OpCase c;
      c.op = "sgd_update";
      c.attrs = sgd_attrs(kSgd[3]);
      c.attrs.set("max_norm", 1.5);
      c.inputs = {randn(rng, s, "w"), randn(rng, s, "g"), randn(rng, s, "mom", 0.1), n};
      c.label = label + sgd_label(kSgd[3]);
      cases.push_back(std::move(c));
      OpCase d;
      d.op = "adam_update";
      d.attrs = adam_attrs(kAdam[3]);
      d.attrs.set("max_norm", 1.5);
      HostTensor m = randn(rng, s, "m", 0.1);
      HostTensor v = second_moment(rng, m, "v");
      d.inputs = {randn(rng, s, "w"), randn(rng, s, "g"), std::move(m), std::move(v), n};
      d.label = label + adam_label(kAdam[3]);
      cases.push_back(std::move(d));
    }
  }
  // The sum of squares, alone and added to a running sum.
  for (const Shape& s : dense_shapes) {
    for (const bool running : {false, true}) {
      OpCase c;
      c.op = "grad_sumsq";
      c.inputs = {randn(rng, s, "g")};
      if (running) c.inputs.push_back(HostTensor{DType::f32, {1}, {2.5}, "acc"});
      c.label = shape_label(s) + (running ? " + acc" : "");
      cases.push_back(std::move(c));
    }
  }

  // Row-sparse: w[F,O], rows[1+R], g[R,O]. Some rows listed (n < R), every
  // row listed (n = R = F), none (n = 0), no features, zero-width rows, and a
  // batch past the parallel threshold.
  struct RowsShape {
    int64_t f, o, r, n;
  };
  const RowsShape rows_shapes[] = {{10, 4, 6, 3}, {5, 3, 5, 5}, {8, 6, 4, 0},
                                   {0, 4, 0, 0},  {6, 0, 3, 2}, {2000, 64, 1000, 700}};
  for (const RowsShape& s : rows_shapes) {
    const Shape ws{s.f, s.o}, gs{s.r, s.o};
    const std::string label = "F=" + std::to_string(s.f) + " O=" + std::to_string(s.o) +
                              " R=" + std::to_string(s.r) + " n=" + std::to_string(s.n);
    for (const SgdAttrs& a : kSgd) {
      OpCase c;
      c.op = "sgd_update_rows";
      c.attrs = sgd_attrs(a);
      c.inputs = {randn(rng, ws, "w"), row_list(rng, s.f, s.r, s.n), randn(rng, gs, "g"),
                  randn(rng, ws, "mom", 0.1)};
      c.label = label + sgd_label(a);
      cases.push_back(std::move(c));
    }
    for (const AdamAttrs& a : kAdam) {
      OpCase c;
      c.op = "adam_update_rows";
      c.attrs = adam_attrs(a);
      HostTensor m = randn(rng, ws, "m", 0.1);
      HostTensor v = second_moment(rng, m, "v");
      c.inputs = {randn(rng, ws, "w"), row_list(rng, s.f, s.r, s.n), randn(rng, gs, "g"),
                  std::move(m), std::move(v)};
      c.label = label + adam_label(a);
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace pooch::opcheck
