#include "machine.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/error.h"

namespace pooch {

namespace {

struct Field {
  const char* key;
  double Machine::*member;
  bool fraction;     // in (0, 1]
  bool may_be_zero;  // reserved memory, latency and launch overhead may be 0
};

// Every figure of a description, in the order the files list them.
constexpr Field kFields[] = {
    {"memory", &Machine::memory, false, false},
    {"reserved_memory", &Machine::reserved_memory, false, true},
    {"flops", &Machine::flops, false, false},
    {"memory_bandwidth", &Machine::memory_bandwidth, false, false},
    {"h2d_bandwidth", &Machine::h2d_bandwidth, false, false},
    {"d2h_bandwidth", &Machine::d2h_bandwidth, false, false},
    {"link_latency", &Machine::link_latency, false, true},
    {"launch_overhead", &Machine::launch_overhead, false, true},
    {"compute_efficiency", &Machine::compute_efficiency, true, false},
    {"memory_efficiency", &Machine::memory_efficiency, true, false},
    {"link_efficiency", &Machine::link_efficiency, true, false},
};

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("machine description {}: {}", where, what));
}

std::string known_fields() {
  std::string s = "name, source";
  for (const Field& f : kFields) s += fmt::format(", {}", f.key);
  return s;
}

}  // namespace

size_t Machine::usable_memory() const {
  return static_cast<size_t>(std::max(0.0, memory - reserved_memory));
}

Machine parse_machine(const std::string& text, const std::string& where) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) bad(where, "not valid JSON");
  if (!doc.is_object()) bad(where, "expected a JSON object of figures");
  for (const auto& [key, value] : doc.items()) {
    bool known = key == "name" || key == "source";
    for (const Field& f : kFields) known = known || key == f.key;
    if (!known)
      bad(where, fmt::format("unknown field '{}' (the fields are {})", key, known_fields()));
  }
  Machine m;
  m.file = where;
  if (!doc.contains("name")) bad(where, "missing field 'name'");
  if (!doc["name"].is_string() || doc["name"].get<std::string>().empty())
    bad(where, "field 'name' must be a non-empty string");
  m.name = doc["name"].get<std::string>();
  if (!doc.contains("source")) bad(where, "missing field 'source' (where each figure comes from)");
  const nlohmann::json& src = doc["source"];
  if (!src.is_object()) bad(where, "field 'source' must be an object: one string per figure");
  for (const auto& [key, value] : src.items()) {
    bool known = false;
    for (const Field& f : kFields) known = known || key == f.key;
    if (!known) bad(where, fmt::format("unknown field 'source.{}' (a source names a figure)", key));
  }
  for (const Field& f : kFields) {
    if (!doc.contains(f.key)) bad(where, fmt::format("missing field '{}'", f.key));
    const nlohmann::json& v = doc[f.key];
    if (!v.is_number()) bad(where, fmt::format("field '{}' must be a number", f.key));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0)
      bad(where, fmt::format("field '{}' is {}: it must not be negative", f.key, v.dump()));
    if (x == 0 && !f.may_be_zero)
      bad(where, fmt::format("field '{}' is 0: it must be above 0", f.key));
    if (f.fraction && x > 1)
      bad(where, fmt::format("field '{}' is {}: a fraction is at most 1", f.key, v.dump()));
    m.*f.member = x;
    if (!src.contains(f.key))
      bad(where, fmt::format("missing field 'source.{}' (where '{}' comes from)", f.key, f.key));
    if (!src[f.key].is_string() || src[f.key].get<std::string>().empty())
      bad(where, fmt::format("field 'source.{}' must be a non-empty string", f.key));
  }
  if (m.reserved_memory >= m.memory)
    bad(where, fmt::format("field 'reserved_memory' ({}) leaves nothing of 'memory' ({})",
                           m.reserved_memory, m.memory));
  return m;
}

Machine read_machine(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(POOCH_ERR_IO, fmt::format("machine description {}: is a directory", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(POOCH_ERR_IO, fmt::format("machine description {}: cannot be read", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(POOCH_ERR_IO, fmt::format("machine description {}: read failed", path));
  return parse_machine(text.str(), path);
}

Profile machine_profile(const Graph& g, const Machine& m) {
  LinkModel link;
  link.h2d_bandwidth = m.h2d_bandwidth * m.link_efficiency;
  link.d2h_bandwidth = m.d2h_bandwidth * m.link_efficiency;
  link.latency = m.link_latency;
  Profile p = estimate_profile(g, m.flops * m.compute_efficiency,
                               m.memory_bandwidth * m.memory_efficiency, link, m.launch_overhead);
  // A host update (an optimizer update where its state lives) streams its
  // operands through host memory: at kHostBytesPerSecond, an assumption (a
  // desktop's dual-channel DDR4 sustains about that for a streaming update;
  // the description is of the card, not of its host).
  constexpr double kHostBytesPerSecond = 10e9;
  p.host_node_seconds = estimate_profile(g, 100e9, kHostBytesPerSecond, link, 0).node_seconds;
  return p;
}

}  // namespace pooch
