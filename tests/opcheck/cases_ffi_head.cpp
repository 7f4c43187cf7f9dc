// Kernel checker cases for the fused fixed fan-in output layer (ffi_loss,
// ffi_loss_grad, ffi_topk; docs/OPS.md, "Sparse"). ffi_loss carries the
// gradient checks (the runner derives ffi_loss_grad from its backward
// builder); ffi_loss_grad also gets cases of its own with a scale other than 1.
// Shapes: an empty batch, one row, odd sizes that fill no vector tile, batches
// of every row-block width (16, 32, 64 and 128 rows) and one past a 128-row
// block, labels enough to split over threads, u16 and i32 indices, repeated
// inputs within a label, and rows without labels.
#include <algorithm>
#include <cmath>
#include <string>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

std::string n(int64_t v) {
  return std::to_string(v);
}

// Positive labels as a CSR over L labels, distinct within a row and in random
// order; every third row has none. Junk past lptr[B] that no kernel may read.
std::vector<HostTensor> targets(Rng& rng, int64_t b, int64_t l) {
  std::vector<double> ptr{0.0}, idx;
  std::bernoulli_distribution on(0.2);
  for (int64_t r = 0; r < b; ++r) {
    std::vector<double> row;
    for (int64_t j = 0; j < l; ++j)
      if (r % 3 != 1 && on(rng)) row.push_back(static_cast<double>(j));
    std::shuffle(row.begin(), row.end(), rng);
    idx.insert(idx.end(), row.begin(), row.end());
    ptr.push_back(static_cast<double>(idx.size()));
  }
  for (double j : {static_cast<double>(l), -1.0, 0.0}) idx.push_back(j);
  const auto m = static_cast<int64_t>(idx.size());
  return {HostTensor{DType::i32, {b + 1}, std::move(ptr), "lptr"},
          HostTensor{DType::i32, {m}, std::move(idx), "lidx"}};
}

struct Dims {
  int64_t B, H, L, K;
  DType index;
};

// h, index (repeats within some labels), w, b as at initialisation.
std::vector<HostTensor> layer(Rng& rng, const Dims& d) {
  HostTensor index = randint(rng, {d.L, d.K}, 0, d.H, d.index, "index");
  for (int64_t l = 0; l + 1 < d.L && d.K >= 2; l += 3)
    index.values[static_cast<size_t>(l * d.K + 1)] = index.values[static_cast<size_t>(l * d.K)];
  const double ws = 1.0 / std::sqrt(static_cast<double>(d.K > 0 ? d.K : 1));
  return {randn(rng, {d.B, d.H}, "h"), std::move(index), randn(rng, {d.L, d.K}, "w", ws),
          randn(rng, {d.L}, "b")};
}

std::string label_of(const Dims& d) {
  return "B=" + n(d.B) + " H=" + n(d.H) + " L=" + n(d.L) + " K=" + n(d.K) + " " +
         dtype_name(d.index);
}

const char* loss_name(int k) {
  return k == 0 ? "bce" : k == 1 ? "squared hinge" : "softmax";
}

void loss_cases(Rng& rng, std::vector<OpCase>& out) {
  const DType u16 = DType::u16, i32 = DType::i32;
  const Dims dims[] = {{0, 5, 4, 2, u16},      {1, 3, 1, 1, i32},     {3, 10, 7, 4, u16},
                       {13, 20, 37, 8, i32},   {17, 9, 23, 32, u16},  {40, 24, 50, 5, i32},
                       {70, 40, 300, 16, u16}, {150, 12, 40, 6, u16}, {5, 70000, 9, 3, i32},
                       {3, 16, 20000, 4, u16}};
  for (int kind = 0; kind < 3; ++kind)
    for (size_t di = 0; di < std::size(dims); ++di) {
      const Dims& d = dims[di];
      std::vector<HostTensor> in = layer(rng, d);
      for (HostTensor& t : targets(rng, d.B, d.L)) in.push_back(std::move(t));
      const bool empty = d.B * d.L == 0;
      // The squared hinge's second derivative jumps where a logit is +-1: a
      // finite difference across it is off by O(h), so only the small
      // shapes (few logits to land there) check it by finite differences.
      // The 20 000-label shape (three label ranges of the CUDA kernels'
      // log-sum-exp) is too large for finite differences over every weight.
      const bool fd = !empty && (kind != 1 || d.B * d.L <= 64) && d.L <= 1000;
      OpCase c;
      c.op = "ffi_loss";
      c.attrs = Attrs{{"loss", static_cast<double>(kind)}};
      c.inputs = in;
      if (fd) c.grad_inputs = {0, 2, 3};
      // A mean over B*L float terms against the reference's double sum.
      c.rtol = 1e-4;
      c.atol = 1e-5;
      c.fd_tol = 1e-5;
      c.label = label_of(d) + " " + loss_name(kind);
      out.push_back(c);

      OpCase g;
      g.op = "ffi_loss_grad";
      // Every other shape asks for the loss too (with_loss, as a train step
      // does): the fourth output, which the kernels sum as they form the
      // gradient, is checked against the reference's loss.
      const bool with_loss = di % 2 == 1;
      g.attrs = Attrs{{"loss", static_cast<double>(kind)},
                      {"scale", empty ? 1.0 : 0.37},
                      {"with_loss", with_loss ? 1.0 : 0.0}};
      g.inputs = std::move(in);
      g.rtol = 1e-4;
      g.atol = 1e-5;
      g.label = c.label + " scale=" + (empty ? "1" : "0.37") + (with_loss ? " with_loss" : "");
      out.push_back(std::move(g));
    }
  // BCE where most logits lie far below zero, as a large label space's do (a
  // bias starts at log(1 / labels)): the kernels' series for e^z < 2^-8
  // (runs of 16 rows all below ln 2^-8), beside runs that are not, in one
  // call. Every label but each fourth is shifted down by 12.
  const Dims far[] = {{40, 24, 50, 5, i32}, {150, 12, 40, 6, u16}, {70, 40, 300, 16, u16}};
  for (const Dims& d : far) {
    std::vector<HostTensor> in = layer(rng, d);
    for (int64_t l = 0; l < d.L; ++l)
      if (l % 4 != 3) in[3].values[static_cast<size_t>(l)] -= 12.0;
    for (HostTensor& t : targets(rng, d.B, d.L)) in.push_back(std::move(t));
    OpCase c;
    c.op = "ffi_loss";
    c.attrs = Attrs{{"loss", 0.0}};
    c.inputs = in;
    if (d.L <= 50) c.grad_inputs = {0, 2, 3};
    c.rtol = 1e-4;
    c.atol = 1e-5;
    c.fd_tol = 1e-5;
    c.label = label_of(d) + " bce, logits far below zero";
    out.push_back(c);
    OpCase g;
    g.op = "ffi_loss_grad";
    g.attrs = Attrs{{"loss", 0.0}, {"scale", 0.37}, {"with_loss", 1.0}};
    g.inputs = std::move(in);
    g.rtol = 1e-4;
    g.atol = 1e-5;
    g.label = c.label + " scale=0.37 with_loss";
    out.push_back(std::move(g));
  }
  // Softmax over a row whose log-sum-exp is +inf: one label's logit is +inf
  // (in the first of the CUDA kernels' label ranges), another's 800 (in the
  // last; e^-800 is 0 in double, so scaling the first range's infinite sum to
  // the second's shift would make inf·0). Rows with targets (none of them
  // those two labels) add lse − x = +inf; every third row has none and must
  // add nothing (0·inf is NaN): the loss is +inf, not NaN.
  {
    const Dims d{9, 16, 20000, 4, u16};
    std::vector<HostTensor> in = layer(rng, d);
    in[3].values[11] = INFINITY;
    in[3].values[15000] = 800.0;
    std::vector<double> ptr{0.0}, idx;
    for (int64_t r = 0; r < d.B; ++r) {
      if (r % 3 != 1) idx.push_back(static_cast<double>(20 + r));
      ptr.push_back(static_cast<double>(idx.size()));
    }
    const auto m = static_cast<int64_t>(idx.size());
    in.push_back(HostTensor{DType::i32, {d.B + 1}, std::move(ptr), "lptr"});
    in.push_back(HostTensor{DType::i32, {m}, std::move(idx), "lidx"});
    OpCase c;
    c.op = "ffi_loss";
    c.attrs = Attrs{{"loss", 2.0}};
    c.inputs = std::move(in);
    c.rtol = 1e-4;
    c.atol = 1e-5;
    c.label = label_of(d) + " softmax, lse +inf, rows without targets";
    out.push_back(std::move(c));
  }
}

OpCase topk_case(std::vector<HostTensor> in, int64_t k, std::string label) {
  OpCase c;
  c.op = "ffi_topk";
  c.attrs = Attrs{{"k", static_cast<double>(k)}};
  c.inputs = std::move(in);
  c.rtol = 2e-5;
  c.atol = 2e-5;
  c.label = std::move(label);
  return c;
}

void topk_cases(Rng& rng, std::vector<OpCase>& out) {
  const DType u16 = DType::u16, i32 = DType::i32;
  struct TopK {
    Dims d;
    int64_t k;
  };
  for (const TopK t : {TopK{{0, 5, 4, 2, u16}, 1}, TopK{{1, 3, 1, 1, i32}, 1},
                       TopK{{4, 10, 9, 4, u16}, 9}, TopK{{7, 20, 33, 8, i32}, 5},
                       TopK{{40, 24, 50, 5, i32}, 3}, TopK{{70, 40, 2000, 16, u16}, 10},
                       TopK{{150, 12, 60, 6, u16}, 4}, TopK{{3, 16, 20000, 4, u16}, 16}})
    out.push_back(topk_case(layer(rng, t.d), t.k, label_of(t.d) + " k=" + n(t.k)));
  // Ties: zero weights, so each logit is its label's bias, drawn from three
  // values: the order among equals is by label.
  const Dims d{6, 8, 40, 4, u16};
  std::vector<HostTensor> in = layer(rng, d);
  std::fill(in[2].values.begin(), in[2].values.end(), 0.0);
  in[3] = randint(rng, {d.L}, 0, 3, DType::f32, "b");
  out.push_back(topk_case(in, 7, "ties " + label_of(d) + " k=7"));
  // The same across the CUDA kernel's label ranges (about 8 192 labels each):
  // the ranges' candidates must merge by label among equals.
  const Dims wide{3, 8, 20000, 4, u16};
  std::vector<HostTensor> win = layer(rng, wide);
  std::fill(win[2].values.begin(), win[2].values.end(), 0.0);
  win[3] = randint(rng, {wide.L}, 0, 3, DType::f32, "b");
  out.push_back(topk_case(win, 16, "ties " + label_of(wide) + " k=16"));
  // Labels whose logits are NaN (after every number), -inf and +inf, in a
  // list that holds all of them (k = L) and in one that ends before them.
  const Dims odd{20, 8, 30, 4, u16};
  std::vector<HostTensor> oin = layer(rng, odd);
  oin[3].values[3] = std::nan("");
  oin[3].values[7] = -INFINITY;
  oin[3].values[11] = INFINITY;
  out.push_back(topk_case(oin, 30, "nan and inf " + label_of(odd) + " k=30"));
  out.push_back(topk_case(std::move(oin), 5, "nan and inf " + label_of(odd) + " k=5"));
}

}  // namespace

std::vector<OpCase> ffi_head_cases(Rng& rng) {
  std::vector<OpCase> out;
  loss_cases(rng, out);
  topk_cases(rng, out);
  return out;
}

}  // namespace pooch::opcheck
