// What every pooch-run subcommand shares: exit codes, error messages, the
// --json result object, sizes (--device-memory 4G), the device flags and
// owning wrappers for the C API's handles. Built on pooch.h alone.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pooch/pooch.h"

namespace cli {

using Json = nlohmann::ordered_json;

// Exit codes (docs/CLI.md). kInterrupted (128 + SIGINT, as a shell reports
// it) is only used when Ctrl-C stopped a run after writing its checkpoint.
enum Exit {
  kOk = 0,
  kUsage = 1,
  kBadInput = 2,
  kOutOfBudget = 3,
  kInternal = 4,
  kInterrupted = 130
};

int exit_code(pooch_status st);

// One subcommand's run: its --json flag, the result object it fills, and the
// error (if any) that ended it.
class Output {
 public:
  explicit Output(std::string command) : command_(std::move(command)) {
    result_["command"] = command_;
  }
  bool json = false;  // --json
  Json& result() { return result_; }

  // "pooch-run: <what>: <pooch_last_error()>" on stderr; returns the exit code.
  int fail(pooch_status st, const std::string& what);
  // A message of our own (not from the library) with an explicit exit code.
  int fail(int code, const std::string& message);
  // Prints the JSON object (with --json) as the last line of stdout; returns rc.
  int finish(int rc);

 private:
  std::string command_;
  Json result_ = Json::object();
  std::string error_;
};

// "4096", "512K", "512M", "4G", "1.5G", "2GiB", "64MB" (binary units: K = 1024).
bool parse_size(const std::string& text, size_t* bytes);
std::string format_bytes(double bytes);  // "12.3 MiB"

// --threads, --device, --device-memory.
struct DeviceFlags {
  int threads = 0;
  std::string device = "auto";
  std::string device_memory;
};
void add_device_flags(CLI::App* app, DeviceFlags& f, const std::string& default_device = "auto");
// Fills the device part of session params; false (with the message in
// *error) for an unparsable --device-memory.
bool apply_device_flags(const DeviceFlags& f, pooch_session_params* p, std::string* error);

void add_json_flag(CLI::App* app, Output& out);

// Owning handles.
struct ModelHandle {
  pooch_model* p = nullptr;
  ModelHandle() = default;
  ModelHandle(const ModelHandle&) = delete;
  ModelHandle& operator=(const ModelHandle&) = delete;
  ~ModelHandle() { pooch_model_free(&p); }
};
struct SessionHandle {
  pooch_session* p = nullptr;
  SessionHandle() = default;
  SessionHandle(const SessionHandle&) = delete;
  SessionHandle& operator=(const SessionHandle&) = delete;
  ~SessionHandle() { pooch_session_free(&p); }
};
struct DatasetHandle {
  pooch_dataset* p = nullptr;
  DatasetHandle() = default;
  DatasetHandle(const DatasetHandle&) = delete;
  DatasetHandle& operator=(const DatasetHandle&) = delete;
  ~DatasetHandle() { pooch_dataset_free(&p); }
};

// The memory report of a session as one printed line and as JSON.
void print_memory(const pooch_session* s, Output& out);

// A subcommand: its CLI11 app and what runs when it was chosen.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// The command line as typed (for "resume with: ..." hints).
void set_argv(int argc, char** argv);
const std::vector<std::string>& argv_words();
std::string shell_quote(const std::string& word);

// A float as the shortest double that prints the same (0.1f -> 0.1, not
// 0.10000000149011612), for JSON output.
double tidy(float x);

double seconds_since(const std::chrono::steady_clock::time_point& t0);

}  // namespace cli
