// The kernel checker's driver: what main() hands it and what it returns.
#pragma once
#include <cstdint>
#include <string>

namespace pooch::opcheck {

struct Options {
  std::string op;  // empty: every op; else this op and the backward ops derived from it
  std::string backend = "all";  // "cpu", "cuda" or "all"
  uint64_t seed = 20240611;     // fixed by default so that a run is reproducible
  int threads = 2;              // KernelContext::threads and the CPU backend's pool
  bool verbose = false;
  bool list = false;
  bool bench = false;
  size_t arena_mib = 1024;  // one device arena and one host pool of this size per backend
};

// Exit status for the process: 0 all passed, 1 some check failed, 2 a usage
// error (unknown op or backend), 77 (automake's "skipped") when the backend
// asked for by name is not available on this machine.
int run_opcheck(const Options& opt);

}  // namespace pooch::opcheck
