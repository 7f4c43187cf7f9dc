// Dynamic sparse training for a fixed fan-in layer (DESIGN.md "Sparse label
// spaces"): every N steps, in each output row, the fraction f of connections
// with the smallest |w| is pruned and regrown at random inputs the row does
// not use yet, so the fan-in stays exactly K. Regrown weights start at 0 and
// their Adam moments are reset. The draws depend only on (seed, step), so a
// resumed run rewires exactly as an uninterrupted one.
#pragma once
#include <cstdint>
#include <string>

#include "../session/session.h"

namespace pooch {

struct RewireResult {
  int64_t rows = 0;
  int64_t rewired = 0;  // connections pruned and regrown in all
};

// Rewires the fixed fan-in layer whose index tensor is `index_name` and whose
// weights are `weight_name` (their optimizer states "<weight>.m", "<weight>.v"
// or "<weight>.momentum", where present, are reset at the rewired slots).
// Throws Error(POOCH_ERR_INVALID_ARG) when the tensors are not a fixed fan-in
// layer's or `fraction` is outside [0, 1].
RewireResult rewire_fixed_fan_in(Session& s, const std::string& index_name,
                                 const std::string& weight_name, double fraction, uint64_t seed,
                                 uint64_t step);

}  // namespace pooch
