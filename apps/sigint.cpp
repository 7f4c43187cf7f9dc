#include "sigint.h"

#include <atomic>
#include <csignal>
#include <mutex>

namespace cli {

namespace {

std::atomic<bool> g_interrupted{false};
// Guards nest (an ensemble's, and each member's run inside it, on several
// threads): the outermost installs the handler and restores the old one.
std::mutex g_mutex;
int g_depth = 0;
struct sigaction g_old {};

extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

}  // namespace

SigintGuard::SigintGuard() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_depth++ > 0) return;
  g_interrupted.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &g_old);
}

SigintGuard::~SigintGuard() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_depth > 0) return;
  sigaction(SIGINT, &g_old, nullptr);
}

bool sigint_received() {
  return g_interrupted.load();
}

}  // namespace cli
