// Kernel checker cases for the sparse family (docs/OPS.md, "Sparse").
//
// The forward ops carry the gradient checks; the runner derives
// sparse_linear_grad_weight, ffi_grad_input and ffi_grad_weight from their
// backward builders, always with a dense random dy. The gradient ops also get
// cases of their own for what that dy never has: zeros (the CPU kernels skip
// labels whose dy is zero) and a batch that touches every feature.
//
// Each op sweeps an empty batch, a single row, odd sizes that fit no vector
// width or block, and one shape above the CPU kernels' threading grain.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string n(int64_t v) {
  return std::to_string(v);
}

// A CSR batch with the given rows of feature ids (repeats allowed), random
// values, and `junk` entries past ptr[B] that no kernel may read (invalid ids,
// NaN values), as random_csr leaves them.
std::vector<HostTensor> csr_of(Rng& rng, const std::vector<std::vector<int64_t>>& rows,
                               int64_t features, int64_t junk) {
  HostTensor ptr{DType::i32, {static_cast<int64_t>(rows.size()) + 1}, {0.0}, "ptr"};
  HostTensor idx{DType::i32, {0}, {}, "idx"};
  for (const auto& r : rows) {
    for (int64_t f : r) idx.values.push_back(static_cast<double>(f));
    ptr.values.push_back(static_cast<double>(idx.values.size()));
  }
  const auto nnz = static_cast<int64_t>(idx.values.size());
  HostTensor val = randn(rng, {nnz}, "val");
  for (int64_t j = 0; j < junk; ++j) {
    idx.values.push_back(j % 2 ? -1.0 : static_cast<double>(features + j));
    val.values.push_back(kNaN);
  }
  idx.shape = val.shape = {nnz + junk};
  return {ptr, idx, val};
}

// ---- sparse_linear -----------------------------------------------------------

// The CPU kernel sums each output in float, over a row's few entries (and,
// for the weight gradient, over a feature's entries in the batch).
void set_sparse_linear_tols(OpCase& c) {
  c.rtol = 1e-5;
  c.atol = 1e-5;
}

OpCase sparse_linear_case(Rng& rng, std::vector<HostTensor> csr, int64_t features, int64_t out,
                          std::string label) {
  OpCase c;
  c.op = "sparse_linear";
  c.inputs = std::move(csr);
  c.inputs.push_back(randn(rng, {features, out}, "W", 0.5));
  c.inputs.push_back(randn(rng, {out}, "b"));
  c.grad_inputs = {3, 4};
  set_sparse_linear_tols(c);
  c.label = std::move(label);
  return c;
}

void sparse_linear_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, F, O;
    double density;
    int64_t cap_extra;
  };
  // F = 70000 with a handful of entries per row: the shape of a bag-of-words
  // layer, where the weight gradient touches a few rows out of many.
  for (const Dims d : {Dims{0, 5, 3, 0.5, 3}, Dims{1, 6, 4, 0.5, 0}, Dims{3, 1, 5, 0.7, 2},
                       Dims{7, 11, 13, 0.3, 5}, Dims{5, 70000, 3, 2e-4, 3},
                       Dims{64, 40, 129, 0.2, 3}, Dims{6, 9, 0, 0.4, 1}}) {
    out.push_back(sparse_linear_case(
        rng, random_csr(rng, d.B, d.F, d.density, d.cap_extra), d.F, d.O,
        "B=" + n(d.B) + " F=" + n(d.F) + " O=" + n(d.O) + " cap+" + n(d.cap_extra)));
  }
  // Empty rows (first, middle, last), a feature repeated within a row, rows
  // sharing features, and entries out of order.
  out.push_back(sparse_linear_case(
      rng, csr_of(rng, {{}, {2, 2, 5}, {}, {8, 0, 0, 3, 0}, {5}, {7, 2}, {}}, 9, 4), 9, 6,
      "empty rows, repeats B=7 F=9 O=6"));
  // Every row empty: no feature touched, the gradient has no rows.
  out.push_back(sparse_linear_case(rng, csr_of(rng, {{}, {}, {}}, 4, 2), 4, 5, "all rows empty"));
  // F < N: more entries than features, so the gradient's row count is F.
  out.push_back(sparse_linear_case(rng, csr_of(rng, {{0, 1, 2}, {2, 1, 0, 1}, {1}}, 3, 2), 3, 4,
                                   "F<N B=3 F=3 O=4"));
}

// sparse_linear_grad_weight on its own: many rows per feature (long sums),
// every feature touched, and a dy with zeros.
void sparse_linear_grad_weight_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, F, O;
    double density;
  };
  for (const Dims d : {Dims{0, 3, 4, 0.5}, Dims{200, 5, 7, 0.9}, Dims{33, 3000, 17, 0.01}}) {
    OpCase c;
    c.op = "sparse_linear_grad_weight";
    c.attrs = Attrs{{"features", static_cast<double>(d.F)}};
    c.inputs = random_csr(rng, d.B, d.F, d.density, 2);
    HostTensor dy = randn(rng, {d.B, d.O}, "dy");
    for (size_t i = 0; i < dy.values.size(); i += 3) dy.values[i] = 0.0;
    c.inputs.push_back(std::move(dy));
    // Up to 200 float products summed per element.
    c.rtol = 1e-5;
    c.atol = 3e-5;
    c.label = "B=" + n(d.B) + " F=" + n(d.F) + " O=" + n(d.O);
    out.push_back(std::move(c));
  }
}

// ---- ffi_linear --------------------------------------------------------------

void set_ffi_tols(OpCase& c) {
  // Sums of K products in float (forward, input gradient) and of B products
  // per panel of 64 rows (weight gradient).
  c.rtol = 2e-5;
  c.atol = 2e-5;
}

HostTensor ffi_index(Rng& rng, int64_t labels, int64_t fan_in, int64_t hidden, DType dt) {
  return randint(rng, {labels, fan_in}, 0, hidden, dt, "index");
}

void ffi_linear_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, H, L, K;
    DType index;
  };
  const DType u16 = DType::u16, i32 = DType::i32;
  // K > H forces repeated indices within a row; B = 70 spans two 64-row
  // panels; H = 70000 needs an i32 index, H = 65536 is the widest u16 one.
  for (const Dims d :
       {Dims{0, 8, 5, 3, u16}, Dims{1, 1, 1, 1, i32}, Dims{3, 10, 7, 1, u16},
        Dims{5, 13, 9, 32, i32}, Dims{4, 6, 11, 4, u16}, Dims{64, 100, 301, 32, u16},
        Dims{70, 50, 37, 5, i32}, Dims{3, 4, 5, 0, u16}, Dims{3, 4, 0, 3, i32},
        Dims{2, 70000, 5, 3, i32}, Dims{2, 65536, 4, 3, u16}, Dims{9, 31, 17, 32, u16}}) {
    OpCase c;
    c.op = "ffi_linear";
    HostTensor index = ffi_index(rng, d.L, d.K, d.H, d.index);
    if (d.H == 65536 && !index.values.empty()) index.values[0] = 65535.0;
    // Repeats within a row, also where K alone would not force them.
    for (int64_t l = 0; l + 1 < d.L && d.K >= 2; l += 2)
      index.values[static_cast<size_t>(l * d.K + 1)] = index.values[static_cast<size_t>(l * d.K)];
    // Weights as at initialisation, so y stays O(1) whatever K is.
    const double ws = 1.0 / std::sqrt(static_cast<double>(d.K > 0 ? d.K : 1));
    c.inputs = {randn(rng, {d.B, d.H}, "x"), std::move(index), randn(rng, {d.L, d.K}, "w", ws),
                randn(rng, {d.L}, "b")};
    c.grad_inputs = {0, 2, 3};
    set_ffi_tols(c);
    c.label = "B=" + n(d.B) + " H=" + n(d.H) + " L=" + n(d.L) + " K=" + n(d.K) + " " +
              dtype_name(d.index);
    out.push_back(std::move(c));
  }
}

// dy with zeros in patterns the CPU kernels shortcut: whole labels zero in
// every row, and labels zero in some rows only.
HostTensor sparse_dy(Rng& rng, int64_t batch, int64_t labels) {
  HostTensor dy = randn(rng, {batch, labels}, "dy");
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < labels; ++l)
      if (l % 3 == 0 || (b + l) % 4 == 0) dy.values[static_cast<size_t>(b * labels + l)] = 0.0;
  return dy;
}

void ffi_grad_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, H, L, K;
    DType index;
  };
  for (const Dims d : {Dims{0, 5, 4, 2, DType::u16}, Dims{13, 10, 17, 8, DType::u16},
                       Dims{70, 40, 300, 16, DType::i32}}) {
    const double ws = 1.0 / std::sqrt(static_cast<double>(d.K));
    const std::string label = "sparse dy B=" + n(d.B) + " H=" + n(d.H) + " L=" + n(d.L) +
                              " K=" + n(d.K) + " " + dtype_name(d.index);
    HostTensor index = ffi_index(rng, d.L, d.K, d.H, d.index);
    HostTensor dy = sparse_dy(rng, d.B, d.L);

    OpCase gi;
    gi.op = "ffi_grad_input";
    gi.attrs = Attrs{{"hidden", static_cast<double>(d.H)}};
    gi.inputs = {dy, index, randn(rng, {d.L, d.K}, "w", ws)};
    set_ffi_tols(gi);
    gi.label = label;
    out.push_back(std::move(gi));

    OpCase gw;
    gw.op = "ffi_grad_weight";
    gw.inputs = {dy, randn(rng, {d.B, d.H}, "x"), index};
    set_ffi_tols(gw);
    gw.label = label;
    out.push_back(std::move(gw));
  }
}

// ---- topk --------------------------------------------------------------------

OpCase topk_case(HostTensor x, int64_t k, std::string label) {
  OpCase c;
  c.op = "topk";
  c.attrs = Attrs{{"k", static_cast<double>(k)}};
  c.inputs = {std::move(x)};
  // Values are copied, never computed.
  c.rtol = 0;
  c.atol = 0;
  c.label = std::move(label);
  return c;
}

void topk_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, L, k;
  };
  for (const Dims d : {Dims{0, 5, 1}, Dims{1, 1, 1}, Dims{4, 9, 1}, Dims{4, 9, 9}, Dims{7, 33, 5},
                       Dims{64, 2000, 10}, Dims{3, 100, 100}})
    out.push_back(topk_case(randn(rng, {d.B, d.L}, "x"), d.k,
                            "B=" + n(d.B) + " L=" + n(d.L) + " k=" + n(d.k)));

  // Ties: few distinct values, so most of the order is decided by position.
  HostTensor ties = randint(rng, {6, 13}, 0, 3, DType::f32, "x");
  out.push_back(topk_case(ties, 5, "ties k=5"));
  out.push_back(topk_case(ties, 13, "ties k=L"));

  // One row each: NaNs among numbers (k reaching into them), all NaN, all
  // -inf, ±inf with numbers, 0 and -0 (equal, so a tie by position).
  const int64_t L = 8;
  const std::vector<std::vector<double>> rows = {
      {1.0, kNaN, 3.0, kNaN, -2.0, 3.0, kNaN, 0.5},
      {kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN},
      {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
      {-kInf, 2.0, kInf, kNaN, -kInf, kInf, -1e30, 1e30},
      {0.0, -0.0, -1.0, 0.0, -0.0, 1.0, -0.0, -1.0},
  };
  HostTensor x{DType::f32, {static_cast<int64_t>(rows.size()), L}, {}, "x"};
  for (const auto& r : rows) x.values.insert(x.values.end(), r.begin(), r.end());
  for (const int64_t k : {int64_t{1}, int64_t{3}, int64_t{6}, L})
    out.push_back(topk_case(x, k, "NaN/Inf/-0 k=" + n(k)));
}

// scatter_add_rows: dense[F,O] + the listed rows of g[R,O]. rows[0] = n, n
// distinct ids in random order (the kernels may not assume them sorted),
// then junk in the R - n unused slots (ids of other rows and out-of-range
// ids) over rows of g that hold NaN: a kernel reading past n shows it.
void scatter_add_rows_cases(Rng& rng, std::vector<OpCase>& out) {
  struct S {
    int64_t f, o, r, n;
  };
  const S shapes[] = {{10, 4, 6, 3}, {5, 3, 5, 5}, {8, 6, 4, 0},         {0, 3, 0, 0},
                      {6, 0, 3, 2},  {1, 1, 1, 1}, {2000, 70, 1200, 970}};
  for (const S& s : shapes) {
    std::vector<double> ids(static_cast<size_t>(s.f));
    for (int64_t i = 0; i < s.f; ++i) ids[static_cast<size_t>(i)] = static_cast<double>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    HostTensor rows{DType::i32, {1 + s.r}, {static_cast<double>(s.n)}, "rows"};
    for (int64_t i = 0; i < s.n; ++i) rows.values.push_back(ids[static_cast<size_t>(i)]);
    for (int64_t i = s.n; i < s.r; ++i)
      rows.values.push_back(i < s.f && i % 2 == 0 ? ids[static_cast<size_t>(i)]
                                                  : static_cast<double>(i % 3 ? s.f + 1000 : -1));
    HostTensor g = randn(rng, {s.r, s.o}, "g");
    for (int64_t i = s.n * s.o; i < s.r * s.o; ++i)
      g.values[static_cast<size_t>(i)] = std::numeric_limits<double>::quiet_NaN();
    OpCase c;
    c.op = "scatter_add_rows";
    c.inputs = {randn(rng, {s.f, s.o}, "dense"), std::move(rows), std::move(g)};
    c.label = "F=" + std::to_string(s.f) + " O=" + std::to_string(s.o) +
              " R=" + std::to_string(s.r) + " n=" + std::to_string(s.n);
    out.push_back(std::move(c));
  }
}

}  // namespace

std::vector<OpCase> sparse_cases(Rng& rng) {
  std::vector<OpCase> out;
  sparse_linear_cases(rng, out);
  sparse_linear_grad_weight_cases(rng, out);
  ffi_linear_cases(rng, out);
  ffi_grad_cases(rng, out);
  topk_cases(rng, out);
  scatter_add_rows_cases(rng, out);  // the cases above keep their data
  for (OpCase& c : ffi_head_cases(rng)) out.push_back(std::move(c));
  return out;
}

}  // namespace pooch::opcheck
