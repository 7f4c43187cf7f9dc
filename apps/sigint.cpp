#include "sigint.h"

#include <atomic>
#include <csignal>

namespace cli {

namespace {

std::atomic<bool> g_interrupted{false};
struct sigaction g_old {};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

}  // namespace

SigintGuard::SigintGuard() {
  g_interrupted.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &g_old);
}

SigintGuard::~SigintGuard() {
  sigaction(SIGINT, &g_old, nullptr);
}

bool sigint_received() {
  return g_interrupted.load();
}

}  // namespace cli
