// pooch-run plan --svg: one train step drawn from the plan JSON
// (pooch_session_plan_json): the arena's occupancy over the simulated step as
// stacked areas (the persistent region, then the transient region's bytes by
// kind), the budget as a line, and the compute, device-to-host and
// host-to-device streams as lanes of labelled boxes. Plain text, no
// dependencies.
#pragma once
#include <string>

#include "cli_common.h"

namespace cli {

// The SVG document; `title` heads it.
std::string plan_svg(const Json& plan, const std::string& title);

// Writes `text` to `path` atomically (a temporary beside it, then rename).
// False with the reason in *error.
bool write_file_atomic(const std::string& path, const std::string& text, std::string* error);

}  // namespace cli
