// Fast f32 optimizer updates (docs/OPS.md, "Optimizer updates"). Each element
// is independent, so the loops are split across threads and vectorised (in
// AVX-512 or AVX2 where the CPU has them: POOCH_VEC_CLONES); the float
// arithmetic follows torch.optim's sequence of tensor ops so results track
// PyTorch's float32 run closely, each element as optim_params.h's
// sgd_element / adam_element say, fused multiply-adds written out, so that
// the bits are those of the CUDA kernels and the same on every machine.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../common/optim_params.h"
#include "../common/supports.h"
#include "cpu_kernels.h"
#include "target_clones.h"

namespace pooch::kern {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kGrain = 1 << 15;

using Sgd = SgdParams;
using Adam = AdamParams;

// With and without momentum are separate loops, so neither has a branch inside.
// `c` is the gradient's clipping factor (1: none; x·1 is exact).
POOCH_VEC_CLONES void sgd_span(const Sgd& p, float c, float* __restrict w,
                               const float* __restrict g, float* __restrict mom, int64_t n) {
  if (p.momentum == 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) sgd_element(p, c, w[i], g[i], nullptr);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) sgd_element(p, c, w[i], g[i], mom + i);
  }
}

// std::sqrt may set errno, so GCC keeps this loop scalar unless the build
// passes -fno-math-errno; it is memory-bound either way (7 float streams).
POOCH_VEC_CLONES void adam_span(const Adam& p, float c, float* __restrict w,
                                const float* __restrict g, float* __restrict m, float* __restrict v,
                                int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) adam_element(p, c, w[i], g[i], m[i], v[i]);
}

// Threads take the tensor in chunks of this many elements, each a long
// contiguous run for the vectorised loops above.
constexpr int64_t kChunk = 1 << 14;

// The clipping factor from the update's optional last input, ‖g‖².
float clip_of(const KernelArgs& a, int at) {
  return a.n_in > at ? clip_coef(a.in[at].as<const float>()[0], a.attrs.get("max_norm", 1.0))
                     : 1.0f;
}

void sgd_dense(const KernelArgs& a) {
  const Sgd p = sgd_params(a.attrs, a.ctx);
  const float clip = clip_of(a, 3);
  float* w = a.in[0].as<float>();
  const float* g = a.in[1].as<const float>();
  float* mom = a.in[2].as<float>();
  const int64_t n = a.in[0].numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_of(a)) if (n > kGrain) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
    sgd_span(p, clip, w + lo, g + lo, mom + lo, len);
  }
}

void adam_dense(const KernelArgs& a) {
  const Adam p = adam_params(a.attrs, a.ctx);
  const float clip = clip_of(a, 4);
  float* w = a.in[0].as<float>();
  const float* g = a.in[1].as<const float>();
  float* m = a.in[2].as<float>();
  float* v = a.in[3].as<float>();
  const int64_t n = a.in[0].numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_of(a)) if (n > kGrain) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
    adam_span(p, clip, w + lo, g + lo, m + lo, v + lo, len);
  }
}

// rows[0] = n, rows[1..n] the ids. The producer guarantees 0 <= n <= R and ids
// in [0, F), distinct; a kernel cannot report an error, so anything outside
// those bounds is skipped rather than written out of bounds (as the reference).
int64_t listed_rows(const TensorView& rows) {
  const int64_t cap = rows.numel() - 1;
  if (cap < 0) return 0;
  const int64_t n = rows.as<const int32_t>()[0];
  return n < 0 ? 0 : (n > cap ? cap : n);
}

void sgd_rows(const KernelArgs& a) {
  const Sgd p = sgd_params(a.attrs, a.ctx);
  const int64_t f = a.in[0].ndim == 2 ? a.in[0].shape[0] : 0;
  const int64_t o = a.in[0].ndim == 2 ? a.in[0].shape[1] : 0;
  const int64_t n = listed_rows(a.in[1]);
  const int32_t* ids = a.in[1].as<const int32_t>() + 1;
  float* w = a.in[0].as<float>();
  const float* g = a.in[2].as<const float>();
  float* mom = a.in[3].as<float>();
#pragma omp parallel for num_threads(threads_of(a)) if (n * o > kGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    if (r < 0 || r >= f) continue;
    // The rows are scattered over the weight (the batch's features): the
    // next row's weights and momentum are fetched while this one updates.
    // In a Debtags training run (the defaults) sgd_span fell from 18.2% of
    // the samples to 10.8%, plus 3.7% for these prefetches; 5% fewer
    // samples in all, the model the same bits.
    if (i + 1 < n && ids[i + 1] >= 0 && ids[i + 1] < f) {
      const int64_t next = ids[i + 1];
      for (int64_t q = 0; q < o; q += 16) {
        __builtin_prefetch(w + next * o + q, 1, 3);
        if (p.momentum != 0.0f) __builtin_prefetch(mom + next * o + q, 1, 3);
      }
    }
    sgd_span(p, 1.0f, w + r * o, g + i * o, mom + r * o, o);
  }
}

void adam_rows(const KernelArgs& a) {
  const Adam p = adam_params(a.attrs, a.ctx);
  const int64_t f = a.in[0].ndim == 2 ? a.in[0].shape[0] : 0;
  const int64_t o = a.in[0].ndim == 2 ? a.in[0].shape[1] : 0;
  const int64_t n = listed_rows(a.in[1]);
  const int32_t* ids = a.in[1].as<const int32_t>() + 1;
  float* w = a.in[0].as<float>();
  const float* g = a.in[2].as<const float>();
  float* m = a.in[3].as<float>();
  float* v = a.in[4].as<float>();
#pragma omp parallel for num_threads(threads_of(a)) if (n * o > kGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ids[i];
    if (r < 0 || r >= f) continue;
    adam_span(p, 1.0f, w + r * o, g + i * o, m + r * o, v + r * o, o);
  }
}

// out = acc + Σ g²: each chunk summed in double, the chunks added in order,
// so the result does not depend on the thread count.
void grad_sumsq(const KernelArgs& a) {
  const float* g = a.in[0].as<const float>();
  const int64_t n = a.in[0].numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
#pragma omp parallel for num_threads(threads_of(a)) if (n > kGrain) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk, e = std::min(n, i + kChunk); i < e; ++i)
      s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    part[static_cast<size_t>(c)] = s;
  }
  double s = a.n_in > 1 ? static_cast<double>(a.in[1].as<const float>()[0]) : 0.0;
  for (double p : part) s += p;
  a.out[0].as<float>()[0] = static_cast<float>(s);
}

}  // namespace

std::vector<KernelVariant> cpu_optim_kernels() {
  return {
      // A convolution's weight, gradient and state may lie in oihw16i16o:
      // the dense updates go element by element, so any one layout for all
      // of them gives the same values; ‖g‖² sums the gradient's elements in
      // double in the order they lie.
      {"grad_sumsq", "omp", grad_sumsq, nullptr, true, f32_operands, 0, false, in_bit(0)},
      {"sgd_update", "omp", sgd_dense, nullptr, true, f32_operands, 0, true,
       in_bit(0) | in_bit(1) | in_bit(2)},
      {"adam_update", "omp", adam_dense, nullptr, true, f32_operands, 0, true,
       in_bit(0) | in_bit(1) | in_bit(2) | in_bit(3)},
      {"sgd_update_rows", "omp", sgd_rows, nullptr, true, f32_operands},
      {"adam_update_rows", "omp", adam_rows, nullptr, true, f32_operands},
  };
}

}  // namespace pooch::kern
