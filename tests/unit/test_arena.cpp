#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/util.h"
#include "runtime/core/error.h"
#include "runtime/memory/arena_plan.h"

namespace pooch {
namespace {

BufferRequest req(size_t bytes, int first, int last, int inplace_of = -1,
                  Role role = Role::activation) {
  BufferRequest r;
  r.bytes = bytes;
  r.first = first;
  r.last = last;
  r.inplace_of = inplace_of;
  r.role = role;
  return r;
}

bool live_together(const BufferRequest& a, const BufferRequest& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Whether the planner gave request i the place of its in-place source: the
// only way two buffers live at one position may share bytes.
bool took_place(const std::vector<BufferRequest>& rs, const ArenaPlan& p, size_t i) {
  const BufferRequest& r = rs[i];
  if (r.inplace_of < 0 || r.bytes == 0) return false;
  const auto j = static_cast<size_t>(r.inplace_of);
  return rs[j].bytes != 0 && rs[j].last == r.first && p.offsets[i] == p.offsets[j];
}

// The request whose block `i` ultimately sits in, following in-place links.
size_t root_of(const std::vector<BufferRequest>& rs, const ArenaPlan& p, size_t i) {
  while (took_place(rs, p, i)) i = static_cast<size_t>(rs[i].inplace_of);
  return i;
}

// Checks every property a plan must have, independently of how it was made.
void check_plan(const std::vector<BufferRequest>& rs, const ArenaPlan& p, size_t alignment) {
  ASSERT_EQ(p.offsets.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(p.offsets[i] % alignment, 0u) << "request " << i;
    if (rs[i].bytes == 0) {
      EXPECT_EQ(p.offsets[i], 0u) << "zero-byte request " << i;
      continue;
    }
    EXPECT_LE(p.offsets[i] + rs[i].bytes, p.peak) << "request " << i;
  }
  for (size_t i = 0; i < rs.size(); ++i)
    for (size_t j = i + 1; j < rs.size(); ++j) {
      if (rs[i].bytes == 0 || rs[j].bytes == 0 || !live_together(rs[i], rs[j])) continue;
      const bool disjoint =
          p.offsets[i] + rs[i].bytes <= p.offsets[j] || p.offsets[j] + rs[j].bytes <= p.offsets[i];
      if (!disjoint) {
        EXPECT_EQ(root_of(rs, p, i), root_of(rs, p, j))
            << "requests " << i << " [" << rs[i].first << "," << rs[i].last << "] @" << p.offsets[i]
            << "+" << rs[i].bytes << " and " << j << " [" << rs[j].first << "," << rs[j].last
            << "] @" << p.offsets[j] << "+" << rs[j].bytes << " overlap";
      }
    }

  // The live-bytes bound, recomputed by brute force over every position.
  std::vector<int> positions;
  for (const BufferRequest& r : rs) positions.push_back(r.first);
  size_t live_peak = 0;
  for (int pos : positions) {
    size_t live = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      if (rs[i].bytes == 0 || rs[i].first > pos || rs[i].last < pos) continue;
      live += align_up(rs[i].bytes, alignment);
      if (rs[i].first == pos && took_place(rs, p, i)) live -= align_up(rs[i].bytes, alignment);
    }
    live_peak = std::max(live_peak, live);
  }
  EXPECT_EQ(p.live_peak, live_peak);
  EXPECT_GE(p.peak, p.live_peak);
  EXPECT_EQ(p.peak % alignment, 0u);

  size_t by_role[kNumRoles] = {};
  for (const BufferRequest& r : rs) by_role[static_cast<int>(r.role)] += r.bytes;
  for (int k = 0; k < kNumRoles; ++k) EXPECT_EQ(p.bytes_by_role[k], by_role[k]) << "role " << k;
}

std::vector<BufferRequest> random_requests(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> n_dist(1, 80);
  std::uniform_int_distribution<int> pos_dist(0, 40);
  std::uniform_int_distribution<int> len_dist(0, 8);
  std::uniform_int_distribution<int> pct(0, 99);
  std::uniform_int_distribution<size_t> bytes_dist(1, 5000);
  const int n = n_dist(rng);
  std::vector<BufferRequest> rs;
  for (int i = 0; i < n; ++i) {
    BufferRequest r;
    const int kind = pct(rng);
    r.bytes = kind < 5 ? 0 : (kind < 10 ? bytes_dist(rng) * 300 : bytes_dist(rng));
    r.first = pos_dist(rng);
    r.last = pct(rng) < 10 ? kLiveForever : r.first + len_dist(rng);
    r.role = static_cast<Role>(pct(rng) % kNumRoles);
    // Point at a request that dies where this one starts, when one does.
    if (pct(rng) < 40) {
      std::vector<int> candidates;
      for (int j = 0; j < i; ++j)
        if (rs[static_cast<size_t>(j)].last == r.first) candidates.push_back(j);
      if (!candidates.empty())
        r.inplace_of = candidates[static_cast<size_t>(pct(rng)) % candidates.size()];
    }
    r.name = "t";
    r.name += std::to_string(i);
    rs.push_back(r);
  }
  return rs;
}

TEST(ArenaPlan, RandomIntervalSetsKeepEveryProperty) {
  std::mt19937_64 rng(20240601);
  const size_t alignments[] = {1, 16, 64, 256, 4096};
  int inplace_seen = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const std::vector<BufferRequest> rs = random_requests(rng);
    const size_t alignment = alignments[static_cast<size_t>(trial) % std::size(alignments)];
    const ArenaPlan p = plan_arena(rs, alignment);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_plan(rs, p, alignment);
    for (size_t i = 0; i < rs.size(); ++i) inplace_seen += took_place(rs, p, i) ? 1 : 0;
    if (HasFailure()) break;
  }
  // The generator must exercise in-place reuse, or the test proves little.
  EXPECT_GT(inplace_seen, 100);
}

TEST(ArenaPlan, RandomPlansAreDeterministic) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<BufferRequest> rs = random_requests(rng);
    const std::vector<BufferRequest> copy = rs;
    const ArenaPlan a = plan_arena(rs, 256);
    const ArenaPlan b = plan_arena(copy, 256);
    EXPECT_EQ(a.offsets, b.offsets);
    EXPECT_EQ(a.peak, b.peak);
    EXPECT_EQ(a.live_peak, b.live_peak);
  }
}

TEST(ArenaPlan, ChainOfShortLivedBuffersReusesTwoSlots) {
  std::vector<BufferRequest> rs;
  for (int k = 0; k < 200; ++k) rs.push_back(req(1000, k, k + 1));
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.peak, 2 * align_up(1000, 256));
  EXPECT_EQ(p.live_peak, 2 * align_up(1000, 256));
}

TEST(ArenaPlan, BestFitPicksTheSmallestHoleThenTheLowest) {
  // Holes of 1024 bytes at 0 and 512 bytes at 1280 open at position 1.
  std::vector<BufferRequest> rs = {
      req(1024, 0, 0), req(256, 0, 5), req(512, 0, 0),
      req(256, 0, 5),  req(300, 1, 5),  // fits both holes; the 512-byte one is the better fit
      req(700, 1, 5),                   // fits only the 1024-byte hole
  };
  ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[4], 1280u);
  EXPECT_EQ(p.offsets[5], 0u);
  EXPECT_EQ(p.peak, 2048u);

  // Two equal holes: the lower one wins.
  rs = {req(512, 0, 0), req(256, 0, 5), req(512, 0, 0), req(256, 0, 5), req(512, 1, 5)};
  p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[4], 0u);
}

TEST(ArenaPlan, NeighbouringFreeBlocksMerge) {
  const std::vector<BufferRequest> rs = {req(256, 0, 0), req(256, 0, 0), req(256, 0, 0),
                                         req(256, 0, 4), req(768, 1, 4)};
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[4], 0u);
  EXPECT_EQ(p.peak, 1024u);
}

TEST(ArenaPlan, FreeBlockAtTheTopGrowsInsteadOfLeavingAHole) {
  const std::vector<BufferRequest> rs = {req(256, 0, 5), req(256, 0, 0), req(1024, 1, 5)};
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[2], 256u);
  EXPECT_EQ(p.peak, 1280u);
}

TEST(ArenaPlan, InPlaceTakesTheSourceOffset) {
  const std::vector<BufferRequest> rs = {req(4096, 0, 0), req(1000, 0, 1), req(1000, 1, 2, 1),
                                         req(900, 2, 3, 2)};
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[2], p.offsets[1]);
  EXPECT_EQ(p.offsets[3], p.offsets[1]);
  EXPECT_EQ(p.peak, 4096u + 1024u);
}

TEST(ArenaPlan, InPlaceNeedsTheSourceToDieThereAndBeBigEnough) {
  // Source lives past the new buffer's first position: not in place.
  std::vector<BufferRequest> rs = {req(1000, 0, 2), req(1000, 1, 3, 0)};
  ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_NE(p.offsets[0], p.offsets[1]);

  // Source smaller than the new buffer: not in place.
  rs = {req(1000, 0, 1), req(2000, 1, 3, 0)};
  p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_NE(p.offsets[0], p.offsets[1]);

  // Rounded up to the alignment the source's block is big enough.
  rs = {req(1000, 0, 1), req(1020, 1, 3, 0)};
  p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[0], p.offsets[1]);

  // Two requests for the same source: only the first gets it.
  rs = {req(1000, 0, 1), req(1000, 1, 3, 0), req(1000, 1, 3, 0)};
  p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[1], p.offsets[0]);
  EXPECT_NE(p.offsets[2], p.offsets[0]);
}

TEST(ArenaPlan, InPlaceRemainderFreesWhenTheSourceDies) {
  const std::vector<BufferRequest> rs = {req(2048, 0, 1), req(256, 1, 3, 0), req(1024, 2, 2)};
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[1], 0u);
  EXPECT_EQ(p.offsets[2], 256u);
  EXPECT_EQ(p.peak, 2048u);
}

TEST(ArenaPlan, PersistentBuffersAreNeverReused) {
  std::vector<BufferRequest> rs = {req(3000, 0, kLiveForever, -1, Role::weight)};
  for (int k = 0; k < 50; ++k) rs.push_back(req(500 + 10 * k, k, k + 1));
  rs.push_back(req(2000, 20, kLiveForever, -1, Role::optimizer_state));
  // Asking to run in place of a persistent buffer never succeeds: it never dies.
  rs.push_back(req(100, 30, 31, 0));
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  const size_t w_end = p.offsets[0] + 3000;
  for (size_t i = 1; i < rs.size(); ++i)
    EXPECT_TRUE(p.offsets[i] >= w_end || p.offsets[i] + rs[i].bytes <= p.offsets[0])
        << "request " << i << " overlaps the persistent weight";
  EXPECT_NE(p.offsets.back(), p.offsets[0]);
}

TEST(ArenaPlan, ZeroByteRequestsTakeNoSpace) {
  const std::vector<BufferRequest> rs = {req(0, 0, 3), req(512, 0, 3), req(0, 1, kLiveForever),
                                         req(0, 2, 2, 1)};
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.offsets[0], 0u);
  EXPECT_EQ(p.offsets[2], 0u);
  EXPECT_EQ(p.offsets[3], 0u);
  EXPECT_EQ(p.peak, 512u);

  const ArenaPlan empty = plan_arena({}, 256);
  EXPECT_EQ(empty.peak, 0u);
  EXPECT_EQ(empty.live_peak, 0u);
  EXPECT_TRUE(empty.offsets.empty());
}

TEST(ArenaPlan, BytesByRoleSumRequestedBytes) {
  const std::vector<BufferRequest> rs = {
      req(100, 0, kLiveForever, -1, Role::input),
      req(1000, 0, kLiveForever, -1, Role::weight),
      req(24, 0, kLiveForever, -1, Role::weight),
      req(300, 0, 1, -1, Role::activation),
      req(700, 1, 2, -1, Role::gradient),
      req(2000, 0, kLiveForever, -1, Role::optimizer_state),
  };
  const ArenaPlan p = plan_arena(rs, 256);
  check_plan(rs, p, 256);
  EXPECT_EQ(p.bytes_by_role[static_cast<int>(Role::input)], 100u);
  EXPECT_EQ(p.bytes_by_role[static_cast<int>(Role::weight)], 1024u);
  EXPECT_EQ(p.bytes_by_role[static_cast<int>(Role::activation)], 300u);
  EXPECT_EQ(p.bytes_by_role[static_cast<int>(Role::gradient)], 700u);
  EXPECT_EQ(p.bytes_by_role[static_cast<int>(Role::optimizer_state)], 2000u);
  const std::string report = p.report();
  EXPECT_NE(report.find("peak"), std::string::npos) << report;
  EXPECT_NE(report.find("MiB"), std::string::npos) << report;
}

TEST(ArenaPlan, CheckBudgetNamesTheMinimum) {
  std::vector<BufferRequest> rs;
  for (int k = 0; k < 3; ++k) rs.push_back(req(3u << 20, 0, kLiveForever, -1, Role::weight));
  rs.push_back(req(1000, 0, 0));
  const ArenaPlan p = plan_arena(rs, 256);
  ASSERT_EQ(p.peak, (9u << 20) + 1024u);

  EXPECT_NO_THROW(check_budget(p, p.peak));
  EXPECT_NO_THROW(check_budget(p, p.peak + 1));
  try {
    check_budget(p, 8u << 20);
    FAIL() << "a budget below the peak was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_OUT_OF_BUDGET);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(p.peak)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(8u << 20)), std::string::npos) << msg;
    // 9 MiB + 1 KiB rounds up: 10 MiB is the least whole-MiB budget that fits.
    EXPECT_NE(msg.find("a budget of at least 10 MiB"), std::string::npos) << msg;
    // Which flag sets the budget is pooch-run's to say, not the library's.
    EXPECT_EQ(msg.find("--"), std::string::npos) << msg;
  }
}

TEST(ArenaPlan, BadRequestsAreInvalidArguments) {
  const auto code_of = [](std::vector<BufferRequest> rs, size_t alignment = 256) {
    try {
      plan_arena(rs, alignment);
    } catch (const Error& e) {
      return e.code();
    }
    return POOCH_OK;
  };
  EXPECT_EQ(code_of({req(10, 3, 2)}), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of({req(10, -1, 2)}), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of({req(10, 0, 2, 5)}), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of({req(10, 0, 2, 0)}), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of({req(10, 0, 2)}, 0), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(code_of({req(10, 0, 2)}), POOCH_OK);
}

}  // namespace
}  // namespace pooch
