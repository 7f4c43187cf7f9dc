// A device description (`--machine FILE`): what the planner needs to know
// about a card we do not have, so that the simulator can answer "will this
// train on that card, how fast, with how much host memory" without
// profiling it. Figures come from vendor spec sheets; the fractions of them
// that are achievable are assumptions, kept apart so a reader sees which is
// which (machines/*.json cite both).
#pragma once
#include <string>

#include "ooc.h"

namespace pooch {

struct Machine {
  std::string name;
  std::string file;             // where it was read from (for messages)
  double memory = 0;            // device memory, bytes
  double reserved_memory = 0;   // what the driver, context and libraries keep, bytes
  double flops = 0;             // peak f32 rate, FLOP/s
  double memory_bandwidth = 0;  // peak device memory bandwidth, bytes/s
  double h2d_bandwidth = 0;     // host to device link, bytes/s (one direction)
  double d2h_bandwidth = 0;     // device to host
  double link_latency = 0;      // seconds per copy
  double launch_overhead = 0;   // seconds per kernel launch
  // Achievable fractions of the peaks above (assumptions).
  double compute_efficiency = 1, memory_efficiency = 1, link_efficiency = 1;

  // The budget a plan may use: memory less what is reserved.
  size_t usable_memory() const;
};

// Parses a description. Every field is required and no other is allowed;
// each figure has a "source" entry. Throws Error(POOCH_ERR_BAD_INPUT) naming
// `where` and the field for a missing, unknown, mistyped, negative or zero
// figure (or a fraction above 1).
Machine parse_machine(const std::string& text, const std::string& where);
// The same from a file; Error(POOCH_ERR_IO) naming it when it cannot be read.
Machine read_machine(const std::string& path);

// Each node's time by the roofline of the card: the slower of its FLOPs at
// the achievable compute rate and its bytes at the achievable memory
// bandwidth, plus the launch overhead; the link at its achievable bandwidth.
Profile machine_profile(const Graph& g, const Machine& m);

}  // namespace pooch
