// How many of a paging level's tensors to page (docs/PLANNER.md, "Weights
// and optimizer state"): the session pages optimizer states, then weights,
// then moves weights' updates to the host, each level's candidates largest
// first; this search picks how many of them, planning the step through a
// callback. Apart from the session so that each of its rules is tested on
// its own (tests/unit/test_paging_search.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <vector>

namespace pooch {

struct PagingSearch {
  std::vector<size_t> bytes;  // the candidates' sizes, largest first
  // How many bytes the level below (no candidate paged) was short of the
  // budget; 0 when it fitted, and this level is then a bet on speed.
  size_t below_short_by = 0;
  // The level below's slowdown when it fitted, which a count must beat to
  // matter; infinity when it did not fit.
  double to_beat = std::numeric_limits<double>::infinity();
  // The slowdown with every candidate paged (that plan already made).
  double all_slowdown = 0;
  // True where paging a candidate moves its bytes off the device and across
  // the link each way every step (optimizer states, weights): then paging k
  // frees at most their bytes, and their copies bound the step's slowdown
  // from below (latency per copy plus bytes over bandwidth, against
  // in_core_seconds; no bound where that is ≤ 0). False for updates moved
  // to the host, which copy other things.
  bool pages_bytes = true;
  double link_latency = 0, link_bandwidth = 1, in_core_seconds = 0;
};

// Plans the step with the first k candidates paged. With timed, returns its
// slowdown against in core; without, any value (only whether it fits is
// asked). nullopt when it does not fit the budget; other errors propagate.
using PlanCount = std::function<std::optional<double>(size_t k, bool timed)>;

struct PagingChoice {
  size_t count = 0;                // how many to page
  std::map<size_t, double> timed;  // every count planned and timed that fitted
  size_t plans = 0;                // calls to PlanCount
};

// Slowdowns within kPagingTie of each other are a tie (the simulator's error
// against measured steps is up to 10% on bench/ooc); a tie goes to paging
// fewer.
inline constexpr double kPagingTie = 1.02;

// The fewest candidates that fit (bisection, starting above the counts
// whose bytes cannot cover the level below's shortfall), then a grid of
// counts between it and all, refined around the fastest where the grid
// jumps beside it; the fewest count within kPagingTie of the fastest.
PagingChoice choose_paging_count(const PagingSearch& s, const PlanCount& plan);

}  // namespace pooch
