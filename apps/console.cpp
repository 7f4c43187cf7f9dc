#include "console.h"

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <vector>

namespace cli {

namespace {

std::mutex g_stdout;
thread_local std::string t_prefix;   // empty: none
thread_local std::string t_pending;  // the current line's text until its '\n'

void write_lines() {
  std::lock_guard<std::mutex> lock(g_stdout);
  size_t start = 0;
  for (size_t nl; (nl = t_pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fputs(t_prefix.c_str(), stdout);
    std::fwrite(t_pending.data() + start, 1, nl + 1 - start, stdout);
  }
  std::fflush(stdout);
  t_pending.erase(0, start);
}

}  // namespace

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (t_prefix.empty()) {
    std::vprintf(fmt, ap);
    va_end(ap);
    return;
  }
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    std::vector<char> buf(static_cast<size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    t_pending.append(buf.data(), static_cast<size_t>(n));
    write_lines();
  }
  va_end(ap2);
}

LinePrefix::LinePrefix(std::string prefix) {
  t_prefix = prefix.empty() ? std::string(" ") : std::move(prefix);
  t_pending.clear();
}

LinePrefix::~LinePrefix() {
  if (!t_pending.empty()) {
    t_pending += '\n';
    write_lines();
  }
  t_prefix.clear();
}

bool lines_prefixed() {
  return !t_prefix.empty();
}

}  // namespace cli
