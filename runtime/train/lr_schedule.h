// Learning-rate schedules as the factor a session applies to its optimizer's
// learning rate (Session::set_lr_scale; kernels read it as lr_scale).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pooch {

// Linear warm-up, then cosine decay (as GPT-2 and nanoGPT train): for the
// optimizer step `step` (1 for the first update), the factor rises linearly
// from 1/warmup to 1 over `warmup` steps, then follows half a cosine from 1
// at step warmup + 1 down to `min_ratio` at step `total`, and stays there. warmup 0:
// no warm-up; total <= warmup: the factor is 1 after the warm-up.
inline double cosine_lr_scale(uint64_t step, uint64_t warmup, uint64_t total, double min_ratio) {
  const double s = static_cast<double>(std::max<uint64_t>(step, 1));
  if (warmup > 0 && step <= warmup) return s / static_cast<double>(warmup);
  if (total <= warmup + 1) return step >= total && total > warmup ? min_ratio : 1.0;
  if (step >= total) return min_ratio;
  // 0 at the first step after the warm-up, 1 at `total`.
  const double t =
      (s - 1.0 - static_cast<double>(warmup)) / static_cast<double>(total - 1 - warmup);
  return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * t));
}

}  // namespace pooch
