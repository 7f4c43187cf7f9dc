// Kernel checker cases for the language-model family (docs/OPS.md,
// "Language models"). Forward ops only: the runner derives
// embedding_grad_rows/_dense, gelu_tanh_grad, causal_attention_grad and
// linear_xent_index_grad from the backward builders.
//
// Each op sweeps empty shapes, single elements, odd sizes, and sizes past
// the fast kernels' tiles (the CUDA attention's 32-row tiles and 8-row
// blocks, the lm head's row blocks and vocabulary chunks). The largest cases
// check the backward kernels without finite differences: the reference
// forward pass is quadratic there, too slow to repeat per sampled element.
#include <fmt/format.h>

#include <cmath>

#include "opcheck.h"

namespace pooch::opcheck {
namespace {

void embedding_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    Shape ids;
    int64_t V, C;
  };
  for (const Dims& d :
       {Dims{{0}, 5, 3}, Dims{{1}, 1, 1}, Dims{{7}, 5, 3}, Dims{{2, 3}, 11, 9},
        Dims{{2, 3, 4}, 6, 5}, Dims{{3, 0}, 4, 2}, Dims{{4}, 9, 0}, Dims{{8, 33}, 50, 70}}) {
    for (const bool dense : {false, true}) {
      OpCase c;
      c.op = "embedding";
      if (dense) c.attrs.set("dense_grad", 1);
      HostTensor ids = randint(rng, d.ids, 0, d.V, DType::i32, "ids");
      // Ids outside [0, V) (padding) embed as zeros and get no gradient.
      if (ids.values.size() > 3) ids.values[2] = -1;
      c.inputs = {ids, randn(rng, {d.V, d.C}, "table")};
      c.grad_inputs = {1};
      c.label =
          fmt::format("ids={} V={} C={}{}", shape_str(d.ids), d.V, d.C, dense ? " dense grad" : "");
      out.push_back(std::move(c));
    }
  }
}

void gelu_tanh_cases(Rng& rng, std::vector<OpCase>& out) {
  for (const Shape& s :
       std::vector<Shape>{{}, {0}, {1}, {7}, {3, 5}, {2, 3, 5}, {2, 0, 3}, {96, 517}}) {
    OpCase c;
    c.op = "gelu_tanh";
    c.inputs = {randn(rng, s, "x", 2.5)};
    c.grad_inputs = {0};
    c.rtol = 1e-5;
    c.atol = 3e-6;
    c.label = "shape=" + shape_str(s);
    out.push_back(std::move(c));
  }
}

void attention_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, T, C, H;
    bool fd;
  };
  for (const Dims& d :
       {Dims{1, 1, 4, 1, true}, Dims{2, 5, 12, 3, true}, Dims{2, 9, 32, 2, true},
        Dims{1, 17, 8, 1, true}, Dims{0, 3, 6, 1, true}, Dims{1, 0, 6, 2, true},
        Dims{2, 40, 96, 2, false}, Dims{1, 70, 64, 1, false}, Dims{1, 9, 256, 2, false}}) {
    OpCase c;
    c.op = "causal_attention";
    c.attrs.set("heads", static_cast<double>(d.H));
    c.inputs = {randn(rng, {d.B, d.T, 3 * d.C}, "qkv")};
    c.grad_inputs = {0};
    c.finite_differences = d.fd;
    // GEMM and tiled sums in their own orders, and fast exp on CUDA.
    c.rtol = 2e-4;
    c.atol = 2e-5;
    c.label = fmt::format("B={} T={} C={} H={}", d.B, d.T, d.C, d.H);
    out.push_back(std::move(c));
  }
}

// The cache holds earlier positions' k and v (random); the step writes its
// own at `pos` (the checker compares the mutated cache too). A position
// outside the cache gives zeros and writes nothing.
void attention_decode_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    int64_t B, P, C, H;
  };
  for (const Dims& d : {Dims{1, 1, 4, 1}, Dims{2, 7, 12, 3}, Dims{3, 40, 64, 2}, Dims{0, 5, 6, 1},
                        Dims{2, 300, 32, 4}}) {
    OpCase c;
    c.op = "attention_decode";
    c.attrs.set("heads", static_cast<double>(d.H));
    HostTensor pos = randint(rng, {d.B, 1}, 0, d.P, DType::i32, "pos");
    if (d.B > 2) pos.values[2] = static_cast<double>(d.P);      // outside: zeros, no write
    if (d.B > 1) pos.values[0] = static_cast<double>(d.P - 1);  // the last position
    c.inputs = {randn(rng, {d.B, 1, 3 * d.C}, "qkv"), randn(rng, {d.B, d.P, 2 * d.C}, "cache"),
                pos};
    c.rtol = 2e-4;
    c.atol = 2e-5;
    c.label = fmt::format("B={} P={} C={} H={}", d.B, d.P, d.C, d.H);
    out.push_back(std::move(c));
  }
}

void lm_head_cases(Rng& rng, std::vector<OpCase>& out) {
  struct Dims {
    Shape x;
    int64_t V;
    bool fd;
  };
  for (const Dims& d : {Dims{{0, 4}, 5, true}, Dims{{1, 1}, 1, true}, Dims{{7, 5}, 11, true},
                        Dims{{2, 3, 8}, 37, true}, Dims{{3, 4}, 0, true}, Dims{{4, 0}, 3, true},
                        Dims{{520, 4}, 4100, false}, Dims{{2, 600, 3}, 9, false}}) {
    OpCase c;
    c.op = "linear_xent_index";
    const int64_t C = d.x.back();
    Shape lead(d.x.begin(), d.x.end() - 1);
    HostTensor cls = d.V > 0 ? randint(rng, lead, 0, d.V, DType::i32, "class")
                             : randint(rng, lead, -1, 0, DType::i32, "class");
    // Ignored rows: -1 (padding) and an id past V.
    if (cls.values.size() > 2) {
      cls.values[1] = -1;
      cls.values[cls.values.size() - 1] = static_cast<double>(d.V + 3);
    }
    c.inputs = {randn(rng, d.x, "x"), randn(rng, {d.V, C}, "W", 1.0 / std::sqrt(double(C ? C : 1))),
                cls};
    c.grad_inputs = {0, 1};
    c.finite_differences = d.fd;
    c.rtol = 2e-4;
    c.atol = 2e-5;
    c.label = fmt::format("x={} V={}", shape_str(d.x), d.V);
    if (d.fd && d.V > 0) {
      // A frozen W (LoRA): dx alone, and an empty dW.
      OpCase frozen = c;
      frozen.grad_inputs = {0};
      frozen.label += " W frozen";
      out.push_back(std::move(frozen));
    }
    out.push_back(std::move(c));
  }
}

}  // namespace

std::vector<OpCase> lm_cases(Rng& rng) {
  std::vector<OpCase> out;
  embedding_cases(rng, out);
  gelu_tanh_cases(rng, out);
  attention_cases(rng, out);
  attention_decode_cases(rng, out);
  lm_head_cases(rng, out);
  return out;
}

}  // namespace pooch::opcheck
