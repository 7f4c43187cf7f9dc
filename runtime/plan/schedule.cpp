#include "schedule.h"

#include <fmt/format.h>

namespace pooch {

const char* residency_name(Residency r) {
  switch (r) {
    case Residency::keep:
      return "keep";
    case Residency::swap:
      return "swap";
    case Residency::recompute:
      return "recompute";
  }
  return "?";
}

std::string Schedule::describe(const Graph& g) const {
  std::string out;
  for (const ScheduleStep& st : steps) {
    const char* stream = st.stream == Stream::compute ? "compute"
                         : st.stream == Stream::h2d   ? "h2d"
                                                      : "d2h";
    switch (st.kind) {
      case StepKind::launch: {
        const Launch& l = launches[static_cast<size_t>(st.index)];
        out += fmt::format("{:8} launch {} ({}, node {})\n", stream, l.kernel->op,
                           l.kernel->variant, l.node);
        break;
      }
      case StepKind::copy_in: {
        const ScheduledCopy& c = copies[static_cast<size_t>(st.index)];
        out +=
            fmt::format("{:8} copy in  {} ({} bytes)\n", stream, g.tensor(c.tensor).name, c.bytes);
        break;
      }
      case StepKind::copy_out: {
        const ScheduledCopy& c = copies[static_cast<size_t>(st.index)];
        out +=
            fmt::format("{:8} copy out {} ({} bytes)\n", stream, g.tensor(c.tensor).name, c.bytes);
        break;
      }
      case StepKind::record:
        out += fmt::format("{:8} record event {}\n", stream, st.index);
        break;
      case StepKind::wait:
        out += fmt::format("{:8} wait for event {}\n", stream, st.index);
        break;
    }
  }
  return out;
}

}  // namespace pooch
