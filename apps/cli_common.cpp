#include "cli_common.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "console.h"

namespace cli {

int exit_code(pooch_status st) {
  switch (st) {
    case POOCH_OK:
      return kOk;
    case POOCH_ERR_INVALID_ARG:
    case POOCH_ERR_NO_DEVICE:
    case POOCH_ERR_UNSUPPORTED:
      return kUsage;
    case POOCH_ERR_BAD_INPUT:
    case POOCH_ERR_IO:
      return kBadInput;
    case POOCH_ERR_OUT_OF_BUDGET:
    case POOCH_ERR_OUT_OF_MEMORY:
      return kOutOfBudget;
    case POOCH_ERR_CANCELLED:
      return kInterrupted;
    default:
      return kInternal;
  }
}

namespace {

bool flag_given(const std::string& flag) {
  for (const std::string& w : argv_words())
    if (w == flag || w.rfind(flag + "=", 0) == 0) return true;
  return false;
}

}  // namespace

// The library states what happened and the figures; which of our flags
// changes them is ours to say. Empty when there is nothing to add (or the
// message already names a flag).
std::string flag_advice(pooch_status st, const std::string& msg) {
  switch (st) {
    case POOCH_ERR_OUT_OF_BUDGET:
    case POOCH_ERR_OUT_OF_MEMORY: {
      if (msg.find("--device-memory") != std::string::npos) return {};
      // The least budget that fits, when the library found one (read at
      // once: the next call clears it).
      const size_t least = pooch_last_error_budget();
      if (st == POOCH_ERR_OUT_OF_BUDGET && least) {
        if (flag_given("--device-memory"))
          return "raise --device-memory to at least " +
                 std::to_string((least + (1u << 20) - 1) >> 20) + " MiB, or use a smaller --batch";
        return "use a smaller --batch, or --device cpu";  // the budget was all the device had free
      }
      // The budget fitted but memory ran out, and the library says a smaller budget helps.
      if (msg.find("device budget") != std::string::npos)
        return "--device-memory sets the device budget";
      return {};
    }
    case POOCH_ERR_NO_DEVICE:
      if (msg.find("--device") != std::string::npos) return {};
      return "use --device cpu or auto";
    default:
      return {};
  }
}

int Output::fail(pooch_status st, const std::string& what) {
  const char* text = pooch_last_error();
  if (!text || !*text) text = pooch_status_str(st);
  std::string msg = text;
  if (const std::string advice = flag_advice(st, msg); !advice.empty()) msg += "; " + advice;
  std::fprintf(stderr, "pooch-run: %s: %s\n", what.c_str(), msg.c_str());
  std::fflush(stderr);
  error_ = what + ": " + msg;
  result_["status"] = pooch_status_str(st);
  return exit_code(st);
}

int Output::fail(int code, const std::string& message) {
  std::fprintf(stderr, "pooch-run: %s\n", message.c_str());
  std::fflush(stderr);
  error_ = message;
  return code;
}

int Output::finish(int rc) {
  if (json) {
    result_["ok"] = rc == kOk;
    result_["exit_code"] = rc;
    if (!error_.empty()) result_["error"] = error_;
    std::fflush(stderr);
    std::printf("%s\n", result_.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  }
  std::fflush(stdout);
  return rc;
}

bool parse_size(const std::string& text, size_t* bytes) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == start) return false;
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(text.substr(start, i - start), &used);
    if (used != i - start) return false;
  } catch (...) {
    return false;
  }
  std::string unit;
  for (; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  double mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else {
    const char p = unit[0];
    const std::string rest = unit.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") return false;
    switch (p) {
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      case 'T':
        mult = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        return false;
    }
  }
  const double b = v * mult;
  if (!std::isfinite(b) || b < 0 || b > 1.8e19) return false;
  if (unit.empty() && std::floor(v) != v) return false;  // fractional bytes
  *bytes = static_cast<size_t>(std::llround(b));
  return true;
}

std::string format_bytes(double b) {
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

namespace {
// What is wrong with a --device-memory value; empty for a size above 0.
std::string device_memory_error(const std::string& v) {
  size_t b = 0;
  if (!parse_size(v, &b))
    return "'" + v + "' is not a size (use bytes or a number with K, M, G or T, e.g. 512M or 4G)";
  if (b == 0) return "'" + v + "' is no memory; leave the flag out to use all the device offers";
  return {};
}
}  // namespace

void add_device_flags(CLI::App* app, DeviceFlags& f, const std::string& default_device) {
  f.device = default_device;
  app->add_option("--threads", f.threads, "CPU threads (0: all cores)")
      ->group("Device")
      ->check(in_range(0, kMaxThreads, true))
      ->capture_default_str();
  app->add_option("--device", f.device, "Where to run: cpu, cuda or auto (CUDA when present)")
      ->group("Device")
      ->transform(one_of({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app->add_option("--device-memory", f.device_memory,
                  "Device memory budget: bytes or with a unit (512M, 4G); default: all the "
                  "device offers")
      ->type_name("SIZE")
      ->group("Device")
      ->check(CLI::Validator([](std::string& v) { return device_memory_error(v); }, ""));
  app->add_option("--strategy", f.strategy,
                  "How a train step that does not fit --device-memory is made to fit: keep "
                  "(refuse), swap-all, recompute-all, checkpoint-sqrt, pooch-greedy, auto")
      ->group("Device")
      ->transform(
          one_of({"keep", "swap-all", "recompute-all", "checkpoint-sqrt", "pooch-greedy", "auto"}))
      ->capture_default_str();
  app->add_option("--host-memory", f.host_memory,
                  "Cap on the host pool (staging and swapped activations); default: none")
      ->type_name("SIZE")
      ->group("Device")
      ->check(CLI::Validator([](std::string& v) { return device_memory_error(v); }, ""));
  app->add_option("--link-bandwidth", f.link_bandwidth,
                  "CPU device only: emulate a device link of this many bytes per second (e.g. "
                  "12G), so copies take the time a PCIe link would")
      ->type_name("SIZE")
      ->group("Device")
      ->check(CLI::Validator([](std::string& v) { return device_memory_error(v); }, ""));
  app->add_option("--link-latency", f.link_latency,
                  "The emulated link's latency per copy, seconds (e.g. 0.00001)")
      ->group("Device")
      ->check(in_range(0, 1, false));
}

bool apply_device_flags(const DeviceFlags& f, pooch_session_params* p, std::string* error) {
  p->threads = f.threads;
  p->device = f.device == "cpu"    ? POOCH_DEVICE_CPU
              : f.device == "cuda" ? POOCH_DEVICE_CUDA
                                   : POOCH_DEVICE_AUTO;
  p->device_memory = 0;
  if (!f.device_memory.empty()) {
    const std::string e = device_memory_error(f.device_memory);
    if (!e.empty()) {
      *error = "--device-memory: " + e;
      return false;
    }
    parse_size(f.device_memory, &p->device_memory);
  }
  static const char* const strategies[] = {
      "keep", "swap-all", "recompute-all", "checkpoint-sqrt", "pooch-greedy", "auto"};
  for (int i = 0; i < 6; ++i)
    if (f.strategy == strategies[i]) p->strategy = i;
  size_t v = 0;
  if (!f.host_memory.empty() && parse_size(f.host_memory, &v)) p->host_memory = v;
  if (!f.link_bandwidth.empty() && parse_size(f.link_bandwidth, &v))
    p->link_bandwidth = static_cast<double>(v);
  p->link_latency = f.link_latency;
  p->machine_file = f.machine.empty() ? nullptr : f.machine.c_str();
  p->plan_only = f.plan_only ? 1 : 0;
  return true;
}

void add_machine_flag(CLI::App* app, DeviceFlags& f) {
  app->add_option("--machine", f.machine,
                  "Plan for the card this file describes (machines/*.json: memory, compute "
                  "rate, memory bandwidth, link) instead of this device; its memory is the "
                  "budget unless --device-memory is given")
      ->type_name("FILE.json")
      ->group("Device");
}

int open_session(pooch_model* model, const DeviceFlags& f, SessionHandle& s, Output& out,
                 const pooch_session_params* base) {
  pooch_session_params sp;
  if (base)
    sp = *base;
  else
    pooch_session_default_params(&sp);
  sp.resume = 0;
  std::string err;
  if (!apply_device_flags(f, &sp, &err)) return out.fail(kUsage, err);
  if (pooch_status st = pooch_session_create(model, &sp, &s.p)) return out.fail(st, "session");
  return kOk;
}

int check_output_paths(std::initializer_list<OutputPath> paths, Output& out) {
  namespace fs = std::filesystem;
  for (const OutputPath& o : paths) {
    if (o.path.empty()) continue;
    const std::string flag = o.flag;
    std::error_code ec;
    if (fs::is_directory(o.path, ec))
      return out.fail(kBadInput, flag + ": '" + o.path + "' is a directory; give a file name");
    const fs::path dir = fs::path(o.path).parent_path();
    if (!dir.empty() && !fs::is_directory(dir, ec))
      return out.fail(kBadInput, flag + ": the directory '" + dir.string() + "' (of '" + o.path +
                                     "') does not exist; create it first");
  }
  return kOk;
}

namespace {

bool g_range_error = false;

// "1e+30" and "0.001" as a person would write them in a range.
std::string show(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", x);
  return buf;
}

}  // namespace

CLI::Validator in_range(double lo, double hi, bool integer, bool lo_open) {
  const std::string range = integer   ? "an integer from " + show(lo) + " to " + show(hi)
                            : lo_open ? "a number above " + show(lo) + " and at most " + show(hi)
                                      : "a number from " + show(lo) + " to " + show(hi);
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        double x = 0;
        try {
          size_t used = 0;
          x = std::stod(v, &used);
          if (used != v.size()) return "'" + v + "' is not a number";
        } catch (const std::out_of_range&) {
          x = v.find('-') == 0 ? -HUGE_VAL : HUGE_VAL;  // beyond double: out of any range
        } catch (...) {
          return "'" + v + "' is not a number";
        }
        const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi &&
                        (!integer || std::floor(x) == x);
        if (ok) return {};
        g_range_error = true;
        return v + " is out of range: use " + range;
      },
      integer ? "INT" : "NUMBER");
}

CLI::Validator positive() {
  return in_range(0, kMaxFlagInt, true, true);
}

namespace {

bool same_letters(char a, char b) {
  return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
}

}  // namespace

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

CLI::Validator one_of(std::vector<std::string> names, bool by_prefix) {
  const std::string desc = list_names(names);
  return CLI::Validator(
      [names = std::move(names), by_prefix](std::string& v) -> std::string {
        std::vector<std::string> starts;
        for (const std::string& n : names) {
          if (n.size() == v.size() && std::equal(n.begin(), n.end(), v.begin(), same_letters)) {
            v = n;
            return {};
          }
          if (by_prefix && !v.empty() && v.size() < n.size() &&
              std::equal(v.begin(), v.end(), n.begin(), same_letters))
            starts.push_back(n);
        }
        if (starts.size() == 1) {
          v = starts[0];
          return {};
        }
        if (starts.size() > 1) return "'" + v + "' could be " + list_names(starts);
        return "'" + v + "' is not " + list_names(names);
      },
      desc);
}

const std::vector<std::string>& synth_preset_names() {
  static const std::vector<std::string> names = {"EURLex-4K", "Wiki10-31K",  "AmazonCat-13K",
                                                 "Wiki-500K", "Amazon-670K", "Amazon-3M"};
  return names;
}

namespace {

// Display width of UTF-8 text: each code point is one column (× included).
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace

void print_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                 const char* indent) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], columns(r[i]));
    }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string pad(w[i] - columns(r[i]), ' ');
      const bool last = i + 1 == r.size();
      line += i < right.size() && right[i] ? pad + r[i] : r[i] + (last ? "" : pad);
      if (!last) line += "  ";
    }
    std::printf("%s\n", line.c_str());
  }
}

CLI::Validator non_negative() {
  return in_range(0, kMaxFlagInt, true);
}

CLI::Validator seed_range() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        // Any 64-bit unsigned integer, written without a sign.
        const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        if (digits) std::strtoull(v.c_str(), nullptr, 10);
        if (digits && errno == 0) return {};
        g_range_error = true;
        return v + " is out of range: use an integer from 0 to 18446744073709551615";
      },
      "UINT64");
}

CLI::Validator batch_range() {
  return in_range(1, kMaxBatch, true);
}

CLI::Validator lr_range() {
  return in_range(0, kMaxLr, false, true);
}

bool range_error_seen() {
  return g_range_error;
}

void add_json_flag(CLI::App* app, Output& out) {
  app->add_flag("--json", out.json,
                "Print one JSON object with the results as the last line of stdout");
}

LogFile::~LogFile() {
  if (f) std::fclose(f);
}

int open_log(const std::string& path, bool append, LogFile& log, Output& out) {
  if (path.empty()) return kOk;
  log.f = std::fopen(path.c_str(), append ? "a" : "w");
  if (!log.f) return out.fail(kBadInput, "--log: cannot open '" + path + "' for writing");
  return kOk;
}

TemporaryFile::~TemporaryFile() {
  if (!path.empty()) std::remove(path.c_str());
}

int TemporaryFile::create(const std::string& stem, Output& out) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  std::string name = ((ec ? std::filesystem::path("/tmp") : dir) / (stem + "-XXXXXX")).string();
  const int fd = mkstemp(name.data());
  if (fd < 0)
    return out.fail(kBadInput, "cannot make a temporary file '" + name + "': " +
                                   std::strerror(errno) + " (set TMPDIR to a writable folder)");
  close(fd);
  path = name;
  return kOk;
}

void print_memory(const pooch_session* s, Output& out) {
  pooch_memory_report m{};
  if (pooch_session_memory(s, &m) != POOCH_OK) return;
  say("memory: arena %s on the %s backend (weights %s, activations %s, gradients %s, optimizer "
      "%s)%s\n",
      format_bytes(static_cast<double>(m.arena_bytes)).c_str(), m.backend ? m.backend : "?",
      format_bytes(static_cast<double>(m.by_role[1])).c_str(),
      format_bytes(static_cast<double>(m.by_role[2])).c_str(),
      format_bytes(static_cast<double>(m.by_role[3])).c_str(),
      format_bytes(static_cast<double>(m.by_role[4])).c_str(),
      m.budget ? (", budget " + format_bytes(static_cast<double>(m.budget))).c_str() : "");
  // Paging, host updates and what the backend keeps are in the plan's JSON,
  // not in the report.
  Json plan;
  char* text = nullptr;
  if (pooch_session_plan_json(s, &text) == POOCH_OK && text)
    plan = Json::parse(text, nullptr, false);
  pooch_string_free(&text);
  if (!plan.is_object()) plan = Json::object();
  Json j;
  j["backend"] = m.backend ? m.backend : "";
  j["arena_bytes"] = m.arena_bytes;
  j["budget"] = m.budget;
  j["input_bytes"] = m.by_role[0];
  j["weight_bytes"] = m.by_role[1];
  j["activation_bytes"] = m.by_role[2];
  j["gradient_bytes"] = m.by_role[3];
  j["optimizer_bytes"] = m.by_role[4];
  j["host_bytes"] = m.host_bytes;
  j["backend_kept_bytes"] = plan.value("backend_kept", uint64_t{0});
  j["out_of_core"] = m.out_of_core != 0;
  if (m.out_of_core) {
    static const char* const names[] = {
        "keep", "swap-all", "recompute-all", "checkpoint-sqrt", "pooch-greedy", "auto"};
    const char* strategy = m.strategy >= 0 && m.strategy <= 5 ? names[m.strategy] : "?";
    const double paged = plan.value("paged_bytes", 0.0);
    const int host_updates = plan.value("host_updates", 0);
    const int host_launches = plan.value("host_launches", 0);
    say("out of core: the step needs %s in core; %s swapped to host memory, %s recomputed, "
        "%s of weights and optimizer state paged (plan from %s); predicted step %.3g ms (%.3g "
        "ms in core)\n",
        format_bytes(static_cast<double>(m.in_core_bytes)).c_str(),
        format_bytes(static_cast<double>(m.swapped_bytes)).c_str(),
        format_bytes(static_cast<double>(m.recomputed_bytes)).c_str(), format_bytes(paged).c_str(),
        strategy, m.predicted_step_seconds * 1e3, m.predicted_in_core_seconds * 1e3);
    j["strategy"] = strategy;
    j["in_core_bytes"] = m.in_core_bytes;
    j["swapped_bytes"] = m.swapped_bytes;
    j["recomputed_bytes"] = m.recomputed_bytes;
    j["paged_bytes"] = paged;
    j["host_updates"] = host_updates;
    j["host_launches"] = host_launches;
    if (host_updates)
      say("out of core: %d optimizer updates run on the host, where their weights and "
          "state live, and %d other ops that read those weights' rows or make their "
          "gradients\n",
          host_updates, host_launches - host_updates);
    j["predicted_step_seconds"] = m.predicted_step_seconds;
    j["predicted_in_core_seconds"] = m.predicted_in_core_seconds;
  }
  out.result()["memory"] = j;
}

namespace {
std::vector<std::string>& words() {
  static std::vector<std::string> w;
  return w;
}
}  // namespace

void set_argv(int argc, char** argv) {
  words().assign(argv, argv + argc);
  if (!words().empty()) words()[0] = "pooch-run";
}

const std::vector<std::string>& argv_words() {
  return words();
}

std::string shell_quote(const std::string& w) {
  bool plain = !w.empty();
  for (char c : w)
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string("-_./=:,@%+").find(c) != std::string::npos))
      plain = false;
  if (plain) return w;
  std::string q = "'";
  for (char c : w) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

double tidy(float x) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) break;
  }
  return std::strtod(buf, nullptr);
}

double seconds_since(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cli
