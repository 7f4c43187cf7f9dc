// Kernel checker cases for the losses (docs/OPS.md, "Losses"). Logits mix
// ordinary values with |x| = 30 and 100, where a naive exp or log overflows in
// f32, so an unstable formula fails here rather than in training.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

enum class Targets { binary, weights };

// x[B,L] from N(0, 2²) with every 7th element pushed to +-30 and, when `huge`,
// every 11th to +-100 (before rounding to f32, as the kernels see them).
HostTensor logits(Rng& rng, int64_t b, int64_t l, bool huge) {
  HostTensor x = randn(rng, {b, l}, "x", 2.0);
  for (size_t i = 0; i < x.values.size(); ++i) {
    const double sign = (i / 7) % 2 ? -1.0 : 1.0;
    if (i % 7 == 3) x.values[i] = 30.0 * sign;
    if (huge && i % 11 == 5) x.values[i] = 100.0 * sign;
  }
  return x;
}

// Binary 0/1 targets, or non-negative softmax weights with every third row
// all zero (such a row contributes nothing to the loss or the gradient).
HostTensor targets(Rng& rng, int64_t b, int64_t l, Targets kind) {
  HostTensor t{DType::f32, {b, l}, {}, "t"};
  t.values.resize(static_cast<size_t>(b * l));
  std::bernoulli_distribution on(0.3);
  std::uniform_real_distribution<double> weight(0.0, 2.0);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < l; ++j) {
      double v = on(rng) ? 1.0 : 0.0;
      if (kind == Targets::weights)
        v = (r % 3 == 1 || v == 0.0) ? 0.0 : static_cast<float>(weight(rng));
      t.values[static_cast<size_t>(r * l + j)] = v;
    }
  return t;
}

// Positive labels as a CSR over L labels: {lptr, lidx}, the ids of a row
// distinct and in random order (a kernel may not assume them sorted). Every
// third row has none; the others take each label with probability 0.3, and
// row 2 (when there is one) takes them all. Past lptr[B], lidx carries junk
// that no kernel may read: ids out of range (L, -1, L + 1000) and a valid one
// (0) that would be counted twice.
std::vector<HostTensor> label_csr(Rng& rng, int64_t b, int64_t l) {
  std::vector<double> ptr{0.0}, idx;
  std::bernoulli_distribution on(0.3);
  for (int64_t r = 0; r < b; ++r) {
    std::vector<double> row;
    for (int64_t j = 0; j < l; ++j)
      if (r % 3 != 1 && (r == 2 || on(rng))) row.push_back(static_cast<double>(j));
    std::shuffle(row.begin(), row.end(), rng);
    idx.insert(idx.end(), row.begin(), row.end());
    ptr.push_back(static_cast<double>(idx.size()));
  }
  const double junk[] = {static_cast<double>(l), -1.0, static_cast<double>(l) + 1000.0, 0.0};
  for (double j : junk) idx.push_back(j);
  const auto m = static_cast<int64_t>(idx.size());
  return {HostTensor{DType::i32, {b + 1}, std::move(ptr), "lptr"},
          HostTensor{DType::i32, {m}, std::move(idx), "lidx"}};
}

// The dense 0/1 targets the CSR stands for.
HostTensor dense_of(const std::vector<HostTensor>& csr, int64_t b, int64_t l) {
  HostTensor t{DType::f32, {b, l}, std::vector<double>(static_cast<size_t>(b * l), 0.0), "t"};
  const std::vector<double>& ptr = csr[0].values;
  const std::vector<double>& idx = csr[1].values;
  for (int64_t r = 0; r < b; ++r)
    for (auto j = static_cast<size_t>(ptr[static_cast<size_t>(r)]);
         j < static_cast<size_t>(ptr[static_cast<size_t>(r + 1)]); ++j)
      t.values[static_cast<size_t>(r * l + static_cast<int64_t>(idx[j]))] = 1.0;
  return t;
}

// The squared hinge has a second-derivative jump where 1 - s*x = 0; a
// central difference straddling it is off by O(h), so logits keep clear.
void clear_hinge_kink(HostTensor& x, const HostTensor& t) {
  for (size_t i = 0; i < x.values.size(); ++i) {
    const double s = 2.0 * t.values[i] - 1.0;
    if (std::fabs(1.0 - s * x.values[i]) < 1e-3)
      x.values[i] = static_cast<float>(x.values[i] - s * 0.01);
  }
}

struct Shape2 {
  int64_t b, l;
  bool huge;
};

std::string shape_label(const Shape& s) {
  std::string out = "x";  // (appending: GCC 12 warns falsely on "," + string)
  out += shape_str(s);
  return out;
}

int64_t lead_rows(const Shape& s) {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}

// The dense-target losses over x[..., L] of rank 3 and 4: the leading
// dimensions are rows, so the data are those of a [rows, L] case, reshaped.
void append_rank_cases(Rng& rng, std::vector<OpCase>& cases) {
  const Shape shapes[] = {{2, 3, 7}, {2, 2, 3, 5}, {3, 0, 4}, {2, 4, 0}, {1, 1, 1, 1}, {2, 4, 300}};
  struct LossKind {
    const char* op;
    Targets targets;
  };
  const LossKind kinds[] = {{"bce_logits", Targets::binary},
                            {"squared_hinge", Targets::binary},
                            {"softmax_xent", Targets::weights}};
  for (const LossKind& k : kinds)
    for (const Shape& shape : shapes) {
      const bool hinge = std::string(k.op) == "squared_hinge";
      const int64_t b = lead_rows(shape), l = shape.back();
      HostTensor x = logits(rng, b, l, !hinge);
      HostTensor t = targets(rng, b, l, k.targets);
      if (hinge) clear_hinge_kink(x, t);
      x.shape = t.shape = shape;
      const bool empty = b * l == 0;
      const std::string label = shape_label(shape) + (hinge ? " |x| to 30" : " |x| to 100");
      OpCase c;
      c.op = k.op;
      c.inputs = {x, t};
      if (!empty) c.grad_inputs = {0};
      // As for 1000 labels above: a loss of ~1e4 makes the finite
      // differences' rounding noise ~1e-6 of the gradient.
      if (l >= 300) c.fd_tol = 1e-5;
      c.label = label;
      cases.push_back(std::move(c));
      if (shape.size() == 4 || empty) {
        OpCase g;
        g.op = std::string(k.op) + "_grad";
        g.attrs = Attrs{{"scale", 0.37}};
        g.inputs = {std::move(x), std::move(t)};
        g.label = label + " scale=0.37";
        cases.push_back(std::move(g));
      }
    }
}

// Row weights for mse: 1 for real rows, 0 for the padding rows at the end
// of every second "sequence" of `seq` rows (as a padded batch has them).
HostTensor row_weights(int64_t rows, int64_t seq, bool all_masked) {
  HostTensor w{DType::f32, {rows}, std::vector<double>(static_cast<size_t>(rows), 1.0), "w"};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = seq > 0 ? r % seq : 0, s = seq > 0 ? r / seq : 0;
    if (all_masked || (s % 2 == 1 && pos >= seq / 2)) w.values[static_cast<size_t>(r)] = 0.0;
  }
  return w;
}

// mse over pred[..., C] with row weights: empty batches, zero-width rows, a
// single element, rank 2, 3 and 4, an all-padding batch (loss and gradient
// 0), and padding rows that hold NaN and huge values (they must be ignored).
void append_mse_cases(Rng& rng, std::vector<OpCase>& cases) {
  struct MseCase {
    Shape shape;
    bool all_masked;
    bool junk_in_padding;
  };
  const MseCase shapes[] = {
      {{0, 3}, false, false}, {{4, 0}, false, false},    {{1, 1}, false, false},
      {{5, 6}, false, false}, {{3, 4, 6}, false, true},  {{2, 3, 2, 5}, false, false},
      {{4, 5}, true, true},   {{2, 0, 3}, false, false}, {{4, 16, 48}, false, true}};
  for (const MseCase& m : shapes) {
    const int64_t b = lead_rows(m.shape), c = m.shape.back();
    HostTensor p = randn(rng, m.shape, "pred", 2.0);
    HostTensor t = randn(rng, m.shape, "target", 2.0);
    HostTensor w =
        row_weights(b, m.shape.size() > 2 ? m.shape[m.shape.size() - 2] : 2, m.all_masked);
    if (m.junk_in_padding)
      for (int64_t r = 0; r < b; ++r)
        if (w.values[static_cast<size_t>(r)] == 0.0)
          for (int64_t j = 0; j < c; ++j) {
            const auto i = static_cast<size_t>(r * c + j);
            p.values[i] = j % 3 == 0 ? std::nan("") : 1e30;
            t.values[i] = j % 3 == 1 ? -INFINITY : -1e30;
          }
    std::string label = shape_label(m.shape);
    if (m.all_masked) label += " every row padding";
    if (m.junk_in_padding) label += " NaN/Inf in padding";
    const bool empty = b * c == 0;
    OpCase k;
    k.op = "mse";
    k.inputs = {p, t, w};
    if (!empty) k.grad_inputs = {0};
    k.label = label;
    cases.push_back(std::move(k));
    if (empty || m.shape.size() >= 3 || m.all_masked) {
      OpCase g;
      g.op = "mse_grad";
      g.attrs = Attrs{{"scale", 0.37}};
      g.inputs = {std::move(p), std::move(t), std::move(w)};
      g.label = label + " scale=0.37";
      cases.push_back(std::move(g));
    }
  }
}

// softmax_xent_index over logits[..., C] and i32 class ids: ids drawn from
// [0, C), with -1 (ignored: padding) at every fifth row, and, where `bad`, ids
// outside [-1, C) that the kernels must treat as ignored without reading out
// of bounds. Rows up to 2048 wide and wider take different CUDA paths.
void append_index_cases(Rng& rng, std::vector<OpCase>& cases) {
  struct IndexCase {
    Shape shape;
    bool all_ignored;
    bool bad;
  };
  const IndexCase shapes[] = {{{0, 5}, false, false},      {{3, 0}, false, false},
                              {{1, 1}, false, false},      {{5, 7}, false, false},
                              {{2, 3, 9}, false, true},    {{2, 2, 3, 6}, false, false},
                              {{4, 6}, true, false},       {{32, 1000}, false, false},
                              {{2, 2, 2100}, false, true}, {{2, 0, 4}, false, false}};
  for (const IndexCase& k : shapes) {
    const int64_t b = lead_rows(k.shape), l = k.shape.back();
    HostTensor x = logits(rng, b, l, true);
    x.shape = k.shape;
    const Shape lead(k.shape.begin(), k.shape.end() - 1);
    HostTensor t{DType::i32, lead, std::vector<double>(static_cast<size_t>(b), -1.0), "class"};
    std::uniform_int_distribution<int64_t> cls(0, std::max<int64_t>(l - 1, 0));
    for (int64_t r = 0; r < b; ++r) {
      double v = l > 0 && r % 5 != 4 ? static_cast<double>(cls(rng)) : -1.0;
      if (k.all_ignored) v = -1.0;
      if (k.bad && r % 3 == 1) v = (r / 3) % 2 ? -1000.0 : static_cast<double>(l);
      t.values[static_cast<size_t>(r)] = v;
    }
    std::string label = shape_label(k.shape) + " |x| to 100";
    if (k.all_ignored) label += " every row ignored";
    if (k.bad) label += " ids outside [-1, C)";
    const bool empty = b * l == 0;
    OpCase c;
    c.op = "softmax_xent_index";
    c.inputs = {x, t};
    if (!empty) c.grad_inputs = {0};
    if (l >= 1000) c.fd_tol = 1e-5;
    c.label = label;
    cases.push_back(std::move(c));
    if (empty || k.shape.size() >= 3 || k.all_ignored) {
      OpCase g;
      g.op = "softmax_xent_index_grad";
      g.attrs = Attrs{{"scale", 0.37}};
      g.inputs = {std::move(x), std::move(t)};
      g.label = label + " scale=0.37";
      cases.push_back(std::move(g));
    }
  }
}

}  // namespace

std::vector<OpCase> loss_cases(Rng& rng) {
  // B = 0 (the mean over no rows is 0), a single element, one row, a batch
  // with zero-width rows, odd sizes, and a realistic batch over many labels.
  const Shape2 shapes[] = {{0, 5, false}, {1, 1, false}, {1, 9, true},    {2, 0, false},
                           {3, 7, false}, {5, 13, true}, {32, 1000, true}};
  struct LossKind {
    const char* op;
    Targets targets;
  };
  const LossKind kinds[] = {{"bce_logits", Targets::binary},
                            {"squared_hinge", Targets::binary},
                            {"softmax_xent", Targets::weights}};

  std::vector<OpCase> cases;
  for (const LossKind& k : kinds)
    for (const Shape2& s : shapes) {
      const bool hinge = std::string(k.op) == "squared_hinge";
      // The hinge has no exponential to overflow, and at |x| = 100 its terms
      // reach 1e4 each: the loss would then be so large that the rounding
      // noise of a finite difference (~1e-16 * loss / h) swamps the gradient.
      const bool huge = s.huge && !hinge;
      HostTensor x = logits(rng, s.b, s.l, huge);
      HostTensor t = targets(rng, s.b, s.l, k.targets);
      if (hinge) clear_hinge_kink(x, t);
      const std::string label = "B=" + std::to_string(s.b) + " L=" + std::to_string(s.l) +
                                (huge ? " |x| to 100" : " |x| to 30");
      const bool empty = s.b * s.l == 0;

      OpCase c;
      c.op = k.op;
      c.inputs = {x, t};
      // An empty batch has no element to differentiate; its gradient op is
      // checked directly below instead.
      if (!empty) c.grad_inputs = {0};
      // A central difference in double carries rounding noise of about
      // 1e-16 * |loss| / h with h = 1e-6. Over 1000 labels with |x| to 30 or
      // 100 the loss reaches 1e4 to 1e5, so the noise is ~1e-5 of the
      // gradient there; the small cases keep the default 1e-6.
      if (s.l >= 1000) c.fd_tol = 1e-5;
      c.label = label;
      cases.push_back(std::move(c));

      // The gradient op on its own, with a scale other than the 1 that the
      // backward builder passes, and at the empty shapes.
      if (empty || s.b == 3) {
        OpCase g;
        g.op = std::string(k.op) + "_grad";
        g.attrs = Attrs{{"scale", empty ? 1.0 : 0.37}};
        g.inputs = {std::move(x), std::move(t)};
        g.label = label + (empty ? "" : " scale=0.37");
        cases.push_back(std::move(g));
      }
    }

  // The label-CSR forms (lptr, lidx instead of t): binary targets, softmax
  // with each listed label weighted 1. B = 0, a single element, one row, a
  // batch of zero-width rows, odd sizes, and 32 rows over 1000 labels; every
  // third row has no label, row 2 has all of them.
  const Shape2 csr_shapes[] = {{0, 5, false}, {1, 1, false}, {1, 9, true},    {2, 0, false},
                               {3, 7, false}, {5, 13, true}, {32, 1000, true}};
  for (const char* op : {"bce_logits_csr", "squared_hinge_csr", "softmax_xent_csr"})
    for (const Shape2& s : csr_shapes) {
      const bool hinge = std::string(op) == "squared_hinge_csr";
      const bool huge = s.huge && !hinge;  // as for the dense hinge above
      HostTensor x = logits(rng, s.b, s.l, huge);
      std::vector<HostTensor> csr = label_csr(rng, s.b, s.l);
      if (hinge) clear_hinge_kink(x, dense_of(csr, s.b, s.l));
      const std::string label = "B=" + std::to_string(s.b) + " L=" + std::to_string(s.l) +
                                (huge ? " |x| to 100" : " |x| to 30") + " labels as CSR";
      const bool empty = s.b * s.l == 0;

      OpCase c;
      c.op = op;
      c.inputs = {x, csr[0], csr[1]};
      if (!empty) c.grad_inputs = {0};
      if (s.l >= 1000) c.fd_tol = 1e-5;
      c.label = label;
      cases.push_back(std::move(c));

      if (empty || s.b == 3 || s.b == 5) {
        OpCase g;
        g.op = std::string(op) + "_grad";
        g.attrs = Attrs{{"scale", empty ? 1.0 : 0.37}};
        g.inputs = {std::move(x), std::move(csr[0]), std::move(csr[1])};
        g.label = label + (empty ? "" : " scale=0.37");
        cases.push_back(std::move(g));
      }
    }

  // Everything below is appended after the cases above, so their data (drawn
  // from the same stream) stays as it was.
  append_rank_cases(rng, cases);
  append_mse_cases(rng, cases);
  append_index_cases(rng, cases);
  return cases;
}

}  // namespace pooch::opcheck
