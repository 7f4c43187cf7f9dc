// Small helpers every layer uses: rounding to an alignment, MiB figures for
// messages, the thread count a "0: all cores" setting stands for, and
// matching names a user types without regard to case. Low
// enough in the tree (kernels/common includes nothing above it) that
// kernels, runtime, formats and tests may all include it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>

namespace pooch {

// x rounded up to the next multiple of a (a > 0; any a, not only powers of two).
constexpr uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

// Bytes in MiB, for "{:.2f} MiB" in messages.
constexpr double to_mib(uint64_t bytes) {
  return static_cast<double>(bytes) / kMiB;
}

// Whole MiB, rounded up, so that "at least N MiB" is always enough.
constexpr uint64_t mib_ceil(uint64_t bytes) {
  return bytes / kMiB + (bytes % kMiB != 0 ? 1 : 0);
}

// The CPU thread count a setting asks for: a positive count as given, 0 (or
// less) for every core the machine reports, at least 1.
inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Names a user types (presets, losses, layer types, ...) match without
// regard to ASCII case; what is printed back is the canonical spelling.
constexpr char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

constexpr bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  return true;
}

// True when `prefix` begins `s`, ignoring case.
constexpr bool istarts_with(std::string_view s, std::string_view prefix) {
  return prefix.size() <= s.size() && iequals(s.substr(0, prefix.size()), prefix);
}

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

}  // namespace pooch
