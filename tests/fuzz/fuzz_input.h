// What the fuzz targets share: the bytes of one input as a file (for the
// readers that take a path), and the rule for what counts as a finding.
//
// A reader may refuse any input, but only with pooch::Error (a clear
// message, a documented status). A crash, a sanitizer report, any other
// exception (std::bad_alloc from a count it trusted, std::out_of_range, a
// JSON library's exception leaking) or a broken invariant is a finding:
// libFuzzer stops and saves the input.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace pooch_fuzz {

// A file of this process's own that holds the input (in /dev/shm when it
// exists: a path reader is fuzzed at memory speed). Rewritten each run.
inline std::string input_path(const char* suffix) {
  static const std::string prefix = [] {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/pooch-fuzz-" + std::to_string(::getpid());
  }();
  return prefix + suffix;
}

inline void write_input(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();  // the harness itself is broken: not a finding in pooch
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A broken invariant in what a reader accepted: report and stop.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "pooch fuzz finding: %s\n", what.c_str());
  std::abort();
}

}  // namespace pooch_fuzz
