// Lines on stdout from training runs that share the process: ensemble
// members training at once each print through say() under their own prefix
// ("member 2: "), and every line reaches stdout whole, never interleaved
// with another thread's.
#pragma once
#include <string>

namespace cli {

// printf to stdout; on a thread with a LinePrefix, each line goes out whole
// with the prefix in front (a line not yet ended waits for its end).
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Sets this thread's prefix while it lives; a partial line left at the end
// is written then.
class LinePrefix {
 public:
  explicit LinePrefix(std::string prefix);
  ~LinePrefix();
  LinePrefix(const LinePrefix&) = delete;
  LinePrefix& operator=(const LinePrefix&) = delete;
};

// Whether this thread prints under a prefix (a progress bar redrawn in
// place with \r would garble other threads' lines then).
bool lines_prefixed();

}  // namespace cli
