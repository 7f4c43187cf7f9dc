#include "paging_search.h"

#include <algorithm>

namespace pooch {

PagingChoice choose_paging_count(const PagingSearch& s, const PlanCount& plan) {
  PagingChoice out;
  const size_t n = s.bytes.size();
  auto fits = [&](size_t k) {
    ++out.plans;
    return plan(k, false).has_value();
  };
  size_t lo = 0, hi = n;  // lo does not fit (0: the level below); hi fits
  if (s.below_short_by == 0) {
    // The level below fitted (this level is a bet on speed): any count
    // fits, so the fewest is 1 and the grid below plans it.
    hi = std::min<size_t>(1, n);
  } else if (s.pages_bytes) {
    // Paging tensors shrinks the arena by at most their bytes, so the
    // counts whose bytes fall short of the level below's shortfall cannot
    // fit; the bisection starts above them, galloping up from the first
    // count that might (it usually fits within a few).
    size_t freed = 0;
    while (lo < n && freed + s.bytes[lo] < s.below_short_by) freed += s.bytes[lo++];
    for (size_t step = 1; lo + step < hi; step *= 2) {
      if (fits(lo + step)) {
        hi = lo + step;
        break;
      }
      lo += step;
    }
  }
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? hi : lo) = mid;
  }

  // The count kept is the fewest timed whose step is within kPagingTie of
  // the fastest timed. A count within kPagingTie of in core ties with any,
  // so once the grid reaches one no more are planned. (ResNet-50 at 128
  // pixels in a third of its arena planned 18 counts, each a full search,
  // to go from 1.0070x to 1.0066x: 0.52 s.)
  std::map<size_t, double>& timed = out.timed;
  timed[n] = s.all_slowdown;
  // The fewest of the counts timed whose step is the fastest.
  auto fastest_count = [&] {
    return std::min_element(timed.begin(), timed.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  };
  auto fastest = [&] { return timed.at(fastest_count()); };
  std::vector<char> planned(n + 1, 0);
  planned[n] = 1;
  // A count whose copies alone bound its slowdown above the level below,
  // or above a tie with the fastest count timed, is not planned (ResNet-50
  // at 64 pixels betting on paging: 13 counts planned, all slower than the
  // level below).
  std::vector<double> copy_seconds(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    copy_seconds[i + 1] =
        copy_seconds[i] + s.link_latency + static_cast<double>(s.bytes[i]) / s.link_bandwidth;
  auto cannot_matter = [&](size_t k) {
    if (!s.pages_bytes || s.in_core_seconds <= 0) return false;
    return copy_seconds[k] / s.in_core_seconds > std::min(s.to_beat, fastest() * kPagingTie);
  };
  auto try_count = [&](size_t k) {
    if (k < hi || k > n || planned[k] || cannot_matter(k)) return;
    planned[k] = 1;
    ++out.plans;
    if (const std::optional<double> sd = plan(k, true)) timed[k] = *sd;
  };
  std::vector<size_t> grid;
  for (size_t q = 0; q < 8; ++q) {
    const size_t k = hi + (n - hi) * q / 8;
    try_count(k);
    grid.push_back(k);
    if (auto it = timed.find(k); it != timed.end() && it->second <= kPagingTie) break;
  }
  grid.push_back(n);
  // Then, where the grid shows a jump beside its fastest count (a
  // neighbour not within kPagingTie of it), around that count with the
  // step halved each round: how many are paged moves the activations' plan
  // in jumps, so a count between two of the grid's can plan faster than
  // both (a small ResNet-50 over a 1 GB/s link with 1 ms a copy: 0.023 s at
  // 5.05 MB, 0.093 s at 5.1 MB before). A flat grid is not refined.
  bool jump = false;
  const size_t i =
      static_cast<size_t>(std::find(grid.begin(), grid.end(), fastest_count()) - grid.begin());
  for (size_t j : {i - 1, i + 1})
    if (i < grid.size() && j < grid.size()) {
      const auto nb = timed.find(grid[j]);
      jump = jump || nb == timed.end() || nb->second > fastest() * kPagingTie;
    }
  for (size_t d = (n - hi) / 16; jump && fastest() > kPagingTie && d > 0; d /= 2) {
    const size_t at = fastest_count();
    if (at >= d) try_count(at - d);
    try_count(at + d);
  }
  const double f = fastest();
  out.count = n;
  for (const auto& [k, sd] : timed)
    if (sd <= f * kPagingTie) {
      out.count = k;
      break;
    }
  return out;
}

}  // namespace pooch
