// What the out-of-core tests count in a planned train step: the swapped
// activations whose copy is mostly the link's latency (bytes / bandwidth
// below it, with the link of the session's profile, as the planner sees it).
#pragma once
#include <algorithm>

#include "runtime/session/session.h"

namespace pooch {

inline int latency_bound_swaps(const Session& s) {
  const Schedule& sc = *s.schedule(ProgramKind::train_step);
  const LinkModel& link = s.profile().link;
  const double bw = std::min(link.h2d_bandwidth, link.d2h_bandwidth);
  int n = 0;
  for (const SavedActivation& sa : saved_activations(s.graph(), s.train_request()))
    if (sc.residency[static_cast<size_t>(sa.tensor)] == Residency::swap &&
        static_cast<double>(sa.bytes) / bw < link.latency)
      ++n;
  return n;
}

}  // namespace pooch
