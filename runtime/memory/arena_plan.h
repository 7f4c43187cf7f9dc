// Offsets in the one device buffer for every buffer a step needs, planned
// once from exact live intervals over the schedule (ggml-alloc in spirit, but
// with the whole schedule known up front).
//
// A request is a live interval, not a tensor: the out-of-core planner will
// ask for a tensor twice (before its swap-out and after its prefetch) or for
// recompute slots, and this planner places them the same way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/graph.h"

namespace pooch {

inline constexpr int kLiveForever = INT32_MAX;

struct BufferRequest {
  size_t bytes = 0;
  int first = 0;  // schedule position of the first write
  int last = 0;   // last position that reads it (inclusive); kLiveForever: persistent
  Role role = Role::activation;
  // This buffer may take the place of request `inplace_of` when that one's
  // last use is exactly `first` (an op that may run in place); -1: none.
  int inplace_of = -1;
  std::string name;  // for reports and errors
};

struct ArenaPlan {
  std::vector<size_t> offsets;  // one per request
  size_t peak = 0;              // bytes the arena needs (the top of the highest buffer)
  size_t live_peak = 0;  // most bytes live at once: the lower bound any placement could reach
  size_t bytes_by_role[kNumRoles] = {};
  std::string report() const;  // human-readable summary
};

// Deterministic: the same requests always give the same offsets.
ArenaPlan plan_arena(std::span<const BufferRequest> requests, size_t alignment = 256);

// Throws Error(POOCH_ERR_OUT_OF_BUDGET) naming the minimum budget (plan.peak)
// when the plan does not fit; `what` names the plan ("the plan" by default,
// "the forward program" from a session).
void check_budget(const ArenaPlan& plan, size_t budget, std::string_view what = "the plan");

}  // namespace pooch
