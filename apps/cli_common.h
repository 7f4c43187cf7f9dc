// What every pooch-run subcommand shares: exit codes, error messages, the
// --json result object, sizes (--device-memory 4G), the device flags and
// owning wrappers for the C API's handles. Built on pooch.h alone.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
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

// The advice naming our flags that follows a library error with this status
// ("raise --device-memory to at least 12 MiB"); empty when there is none.
std::string flag_advice(pooch_status st, const std::string& message);

// One subcommand's run: its --json flag, the result object it fills, and the
// error (if any) that ended it.
class Output {
 public:
  explicit Output(std::string command) : command_(std::move(command)) {
    result_["command"] = command_;
  }
  bool json = false;  // --json
  Json& result() { return result_; }

  // "pooch-run: <what>: <pooch_last_error()>[; <flag_advice>]" on stderr;
  // returns the exit code.
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

// --threads, --device, --device-memory, --strategy, --host-memory, --link-*.
struct DeviceFlags {
  int threads = 0;
  std::string device = "auto";
  std::string device_memory;
  std::string strategy = "auto";
  std::string host_memory;
  std::string link_bandwidth;
  double link_latency = 0;
  std::string machine;     // --machine FILE (plan, train): a card's description
  bool plan_only = false;  // plan: the session plans and takes no memory
};
void add_device_flags(CLI::App* app, DeviceFlags& f, const std::string& default_device = "auto");
// --machine FILE: plan for a described card instead of this device.
void add_machine_flag(CLI::App* app, DeviceFlags& f);
// Fills the device part of session params; false (with the message in
// *error) for an unparsable --device-memory.
bool apply_device_flags(const DeviceFlags& f, pooch_session_params* p, std::string* error);

void add_json_flag(CLI::App* app, Output& out);

// Number checks whose messages read well and name the range ("--lr: 1e30 is
// out of range: use a number above 0 and at most 1000000"); CLI11's
// PositiveNumber prints "not in range 0.000000 to 1.8e308" and lets NaN
// through. A value out of its range makes the parse fail with exit 2
// (range_error_seen()); text that is not a number is a usage error (exit 1).
// `lo_open`: lo itself is out. Integers: `integer`.
CLI::Validator in_range(double lo, double hi, bool integer, bool lo_open = false);
// The integer flags' bound unless a flag has its own: i32 counts.
constexpr double kMaxFlagInt = 2147483647;
CLI::Validator positive();      // an integer in [1, kMaxFlagInt]
CLI::Validator non_negative();  // an integer in [0, kMaxFlagInt]
CLI::Validator seed_range();    // any uint64, no sign
// Ranges of flags that several commands share (docs/CLI.md).
constexpr double kMaxBatch = 33554431;  // (2^31-1)/64: a batch's nonzero budget is i32
constexpr double kMaxLr = 1e6;
constexpr double kMaxWeightDecay = 1e6;
constexpr double kMaxThreads = 1024;
constexpr double kMaxScale = 100;
CLI::Validator batch_range();  // an integer in [1, kMaxBatch]
CLI::Validator lr_range();     // a number in (0, kMaxLr]
bool range_error_seen();

// A name from `names`, matched without regard to case ("ADAM", "Cpu"), or,
// with `by_prefix`, also by the start of the one name that begins so
// ("eurlex" for EURLex-4K). Add it with ->transform(): the option's value
// becomes the canonical spelling, so that is what every message prints.
CLI::Validator one_of(std::vector<std::string> names, bool by_prefix = false);
// "a, b or c"
std::string list_names(const std::vector<std::string>& names);

// The synthetic data set presets (pooch_dataset_create_synth).
const std::vector<std::string>& synth_preset_names();

// Owning handles: the C API's object, freed when the handle goes.
template <typename T, void (*Free)(T**)>
struct Handle {
  T* p = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { Free(&p); }
};
using ModelHandle = Handle<pooch_model, pooch_model_free>;
using SessionHandle = Handle<pooch_session, pooch_session_free>;
using DatasetHandle = Handle<pooch_dataset, pooch_dataset_free>;
using TokenizerHandle = Handle<pooch_tokenizer, pooch_tokenizer_free>;
using TokensHandle = Handle<int32_t, pooch_tokens_free>;

// Prints rows as aligned columns (UTF-8 aware: × is one column), each line
// starting with `indent`; `right` marks right-aligned columns.
void print_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                 const char* indent = "  ");

// A session that runs `model` where the device flags say, with `base`'s
// other parameters (the optimizer, clipping: plan's train step) or the
// defaults. Exit code.
int open_session(pooch_model* model, const DeviceFlags& f, SessionHandle& s, Output& out,
                 const pooch_session_params* base = nullptr);

// Exit 2 (naming the flag and the path) unless the directory that is to hold
// each output file exists and the path is not itself a directory: checked
// before a run spends time, not when it writes at the end. Empty paths
// (flags not given) are skipped.
struct OutputPath {
  const char* flag;
  const std::string& path;
};
int check_output_paths(std::initializer_list<OutputPath> paths, Output& out);

// The memory report of a session as one printed line and as JSON.
void print_memory(const pooch_session* s, Output& out);

// The JSON-lines log of --log, closed when it goes out of scope.
struct LogFile {
  FILE* f = nullptr;
  LogFile() = default;
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  ~LogFile();
};
// Opens --log's file (nothing when `path` is empty); a failure is exit 2 (kBadInput).
int open_log(const std::string& path, bool append, LogFile& log, Output& out);

// A file of this process's own in the system's temporary directory,
// removed when this goes out of scope (an ensemble member's best epoch).
struct TemporaryFile {
  std::string path;  // empty until create() succeeds
  TemporaryFile() = default;
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile();
  // Makes an empty file named after `stem`; a failure is exit 2 (kBadInput).
  int create(const std::string& stem, Output& out);
};

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
