// The kernel checker's test cases (dav1d's checkasm and ggml's
// test-backend-ops in spirit). A case names a forward op, its attributes and
// its inputs with data; the runner
//  - runs the op with the reference kernel and with every kernel variant of
//    every available backend, comparing outputs with the case's tolerance,
//    checking NaN/Inf parity and guard bytes around every output;
//  - if the op is differentiable, builds its backward ops with the op's own
//    backward builder, checks each of those ops the same way, and checks the
//    gradients against central finite differences in double precision.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../runtime/core/graph.h"

namespace pooch::opcheck {

struct HostTensor {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<double> values;  // element values (indices too), converted to dtype when run
  std::string name;
};

struct OpCase {
  std::string op;
  Attrs attrs;
  std::vector<HostTensor> inputs;
  // Float inputs whose gradient is checked by finite differences (by index).
  std::vector<int> grad_inputs;
  // |fast - ref| <= atol + rtol * |ref| for every element.
  double rtol = 1e-5;
  double atol = 1e-6;
  // Finite-difference tolerance (double precision, relative to the largest gradient).
  double fd_tol = 1e-6;
  // False: the backward ops are checked on every backend but not against
  // finite differences (large cases whose reference forward pass is too slow
  // to repeat twice per sampled element).
  bool finite_differences = true;
  std::string label;     // shape summary for the report, e.g. "B=3 I=5 O=7"
  bool training = true;  // the kernel context's training flag (false: inference)
};

using Rng = std::mt19937_64;

// Random helpers for case files.
HostTensor randn(Rng& rng, Shape shape, std::string name, double scale = 1.0);
// Integers in the half-open range [lo, hi).
HostTensor randint(Rng& rng, Shape shape, int64_t lo, int64_t hi, DType dt, std::string name);
// A CSR batch over `features` columns: returns {ptr, idx, val}, with `cap`
// entries reserved (cap >= nnz; the tail is filled with junk on purpose).
std::vector<HostTensor> random_csr(Rng& rng, int64_t rows, int64_t features, double density,
                                   int64_t cap_extra = 3);

// One function per op family, each in its own file (cases_*.cpp).
std::vector<OpCase> dense_cases(Rng& rng);
std::vector<OpCase> sparse_cases(Rng& rng);
std::vector<OpCase> ffi_head_cases(Rng& rng);  // part of sparse_cases (cases_ffi_head.cpp)
std::vector<OpCase> loss_cases(Rng& rng);
std::vector<OpCase> optim_cases(Rng& rng);
std::vector<OpCase> lm_cases(Rng& rng);
std::vector<OpCase> conv_cases(Rng& rng);

}  // namespace pooch::opcheck
