// Ctrl-C during a training run: while a SigintGuard lives, the first SIGINT
// only sets a flag that the run checks after each step (to stop cleanly);
// a second one kills the process (SA_RESETHAND restores the default action).
// Guards nest, also across threads: the outermost one decides.
#pragma once

namespace cli {

class SigintGuard {
 public:
  SigintGuard();
  ~SigintGuard();
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;
};

// True once SIGINT arrived under the current guard.
bool sigint_received();

}  // namespace cli
