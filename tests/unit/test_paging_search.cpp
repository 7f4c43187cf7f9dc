// choose_paging_count (runtime/plan/paging_search.h), one rule a test, over
// made-up levels: which counts fit and how fast each plans are functions
// here, and the tests check which counts were planned and which was chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "runtime/plan/paging_search.h"

namespace pooch {
namespace {

// A level of n candidates of `each` bytes; counts from `fits_from` on fit,
// and a timed count's slowdown is speed(k). Records every call.
struct FakeLevel {
  size_t fits_from = 0;
  std::function<double(size_t)> speed = [](size_t) { return 1.5; };
  std::vector<size_t> untimed, timed;

  PlanCount plan() {
    return [this](size_t k, bool want_time) -> std::optional<double> {
      (want_time ? timed : untimed).push_back(k);
      if (k < fits_from) return std::nullopt;
      return want_time ? speed(k) : 0.0;
    };
  }
};

PagingSearch level_of(size_t n, size_t each, size_t short_by) {
  PagingSearch s;
  s.bytes.assign(n, each);
  s.below_short_by = short_by;
  s.all_slowdown = 1.5;
  return s;
}

TEST(PagingSearch, FindsTheFewestCountThatFitsAndNeverTimesACountThatCannot) {
  FakeLevel f;
  f.fits_from = 37;
  PagingSearch s = level_of(100, 10, 50);
  s.all_slowdown = f.speed(100);
  const PagingChoice c = choose_paging_count(s, f.plan());
  EXPECT_EQ(c.count, 37u);
  // Only counts that fitted were timed; every one at or above 37.
  for (size_t k : f.timed) EXPECT_GE(k, 37u);
  EXPECT_TRUE(c.timed.count(37));
  EXPECT_EQ(c.plans, f.timed.size() + f.untimed.size());
}

TEST(PagingSearch, StartsAboveTheCountsWhoseBytesCannotCoverTheShortfall) {
  // Short by 405 bytes of 10-byte candidates: 40 cannot free enough, so no
  // count below 40 is planned; 41 is the first that can and fits.
  FakeLevel f;
  f.fits_from = 41;
  const PagingChoice c = choose_paging_count(level_of(100, 10, 405), f.plan());
  EXPECT_EQ(c.count, 41u);
  for (size_t k : f.untimed) EXPECT_GE(k, 40u);
  // Galloping from 40: 41 fits at once, so no bisection is needed.
  EXPECT_EQ(f.untimed, std::vector<size_t>{41});
}

TEST(PagingSearch, UpdatesOnTheHostAreSearchedWithoutTheBytesRule) {
  // pages_bytes false (level 3): the bytes say nothing about fitting, so
  // the bisection runs over every count.
  FakeLevel f;
  f.fits_from = 3;
  PagingSearch s = level_of(100, 10, 405);
  s.pages_bytes = false;
  const PagingChoice c = choose_paging_count(s, f.plan());
  EXPECT_EQ(c.count, 3u);
  EXPECT_TRUE(std::find(f.untimed.begin(), f.untimed.end(), 3u) != f.untimed.end());
}

TEST(PagingSearch, ABetOnSpeedStartsAtOneWithoutBisecting) {
  // The level below fitted: every count fits, so none is planned untimed.
  FakeLevel f;
  f.speed = [](size_t k) { return 1.2 + 0.01 * static_cast<double>(k); };
  PagingSearch s = level_of(64, 10, 0);
  s.all_slowdown = f.speed(64);
  const PagingChoice c = choose_paging_count(s, f.plan());
  EXPECT_TRUE(f.untimed.empty());
  ASSERT_FALSE(f.timed.empty());
  EXPECT_EQ(f.timed.front(), 1u);
  EXPECT_EQ(c.count, 1u);
}

TEST(PagingSearch, SlowdownsWithinTheTieGoToPagingFewer) {
  // Paging more is faster, but by under 2% from 10 to 100: 10 is kept.
  FakeLevel f;
  f.fits_from = 10;
  f.speed = [](size_t k) { return 1.50 - 0.0002 * static_cast<double>(k); };
  PagingSearch s = level_of(100, 10, 95);
  s.all_slowdown = f.speed(100);
  EXPECT_EQ(choose_paging_count(s, f.plan()).count, 10u);
}

TEST(PagingSearch, AFasterCountBeyondTheTieIsKept) {
  // From 60 on the step is 10% faster: the fewest of those within 2% of
  // the fastest is the first grid count at or above 60.
  FakeLevel f;
  f.fits_from = 10;
  f.speed = [](size_t k) { return k >= 60 ? 1.30 : 1.45; };
  PagingSearch s = level_of(100, 10, 95);
  s.all_slowdown = f.speed(100);
  const PagingChoice c = choose_paging_count(s, f.plan());
  EXPECT_GE(c.count, 60u);
  // Refined below the grid's count: the jump from 1.45 to 1.30 sits between
  // two grid counts, so the search closes in on 60.
  EXPECT_LE(c.count, 62u);
  for (const auto& [k, sd] : c.timed) {
    if (k < c.count) EXPECT_GT(sd, 1.30 * kPagingTie) << k;
  }
}

TEST(PagingSearch, TheGridStopsAtACountThatTiesWithInCore) {
  // The first count fits at 1.01x: nothing more is planned.
  FakeLevel f;
  f.fits_from = 20;
  f.speed = [](size_t) { return 1.01; };
  PagingSearch s = level_of(100, 10, 195);
  s.all_slowdown = 1.01;
  const PagingChoice c = choose_paging_count(s, f.plan());
  EXPECT_EQ(c.count, 20u);
  EXPECT_EQ(f.timed, std::vector<size_t>{20});
}

TEST(PagingSearch, AFlatGridIsNotRefined) {
  FakeLevel f;
  f.fits_from = 0;
  f.speed = [](size_t) { return 1.40; };
  PagingSearch s = level_of(160, 10, 5);
  s.all_slowdown = 1.40;
  const PagingChoice c = choose_paging_count(s, f.plan());
  // 1 fits (0 is the level below); the grid's 8 counts, no more.
  EXPECT_EQ(f.timed.size(), 8u);
  EXPECT_EQ(c.count, 1u);
}

TEST(PagingSearch, CountsWhoseCopiesAloneAreTooSlowAreNotPlanned) {
  // Each candidate's copy takes 0.1 s against a 1 s in-core step, so k
  // paged make a step of at least 0.1·k s. Count 1 plans at 1.1x; from
  // then on a count must be able to tie with it (1.122x): 12 copies alone
  // take 1.2 s, so no count above 11 is planned.
  FakeLevel f;
  f.speed = [](size_t k) { return 1.0 + 0.1 * static_cast<double>(k); };
  PagingSearch s = level_of(64, 100, 0);
  s.to_beat = 1.25;
  s.all_slowdown = f.speed(64);
  s.link_bandwidth = 1000;  // 100 bytes: 0.1 s
  s.in_core_seconds = 1.0;
  const PagingChoice c = choose_paging_count(s, f.plan());
  ASSERT_FALSE(f.timed.empty());
  for (size_t k : f.timed) EXPECT_LE(k, 11u);
  EXPECT_EQ(c.count, 1u);
  // Without the bound (updates on the host), the grid plans them.
  FakeLevel g;
  g.speed = f.speed;
  s.pages_bytes = false;
  EXPECT_EQ(choose_paging_count(s, g.plan()).count, 1u);
  EXPECT_GT(*std::max_element(g.timed.begin(), g.timed.end()), 11u);
}

TEST(PagingSearch, ErrorsOtherThanNotFittingReachTheCaller) {
  PagingSearch s = level_of(8, 10, 5);
  EXPECT_THROW(choose_paging_count(s,
                                   [](size_t, bool) -> std::optional<double> {
                                     throw std::runtime_error("host memory");
                                   }),
               std::runtime_error);
}

}  // namespace
}  // namespace pooch
