// pooch-run: the command line tool. Built on the public C API alone
// (pooch.h), as dav1d's CLI uses only dav1d.h. One file per subcommand
// (cmd_*.cpp); docs/CLI.md is the reference.
#include <alloca.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "commands.h"
#include "pooch/pooch.h"

namespace {

// Settings the libraries pooch calls read once, in their initialisers, which
// the loader runs before main. A value the user set is left as it is.
//
// OPENBLAS_NUM_THREADS=1: OpenBLAS starts a pool of worker threads in its
// initialiser, sized by the cores; each worker maps a buffer as it starts.
// Under a low address-space limit (ulimit -v) that start fails before main
// (OpenBLAS prints why and exits), or a worker that cannot map spins for ever.
// pooch sets the count each session runs (--threads) and OpenBLAS grows its
// pool to that on demand, so this process starts with none.
//
// No spinning: OpenMP's (libgomp's) threads busy-wait about 3 ms for the
// next parallel region by default, and OpenBLAS's about 0.1 s (2^28 cycles)
// for the next call, before they sleep. On a loaded machine those spins take
// the cores the other threads of the step need; in an idle process they burn
// CPU for nothing. OMP_WAIT_POLICY=passive and OPENBLAS_THREAD_TIMEOUT=4
// (2^4 cycles) make both sleep at once (docs/BENCHMARKS.md, "Idle CPU").
// The library cannot set these for a host program: libgomp and OpenBLAS read
// them before any pooch code runs (docs/RELIABILITY.md).
constexpr const char* kLibrarySettings[] = {
    "OPENBLAS_NUM_THREADS=1",
    "OMP_WAIT_POLICY=passive",
    "OPENBLAS_THREAD_TIMEOUT=4",
};

bool has_variable(char** env, const char* setting) {
  const size_t name_len = std::strchr(setting, '=') - setting + 1;  // "NAME="
  for (char** e = env; *e != nullptr; ++e)
    if (std::strncmp(*e, setting, name_len) == 0) return true;
  return false;
}

// Runs from the executable's DT_PREINIT_ARRAY: before any shared library's
// initialiser, OpenBLAS's and libgomp's included (a constructor would run
// after them). libc is not initialised yet either, and its initialiser resets
// the environment to the one the process started with, so setenv() here
// would be lost: the process runs itself again, once, with the settings in
// the environment it starts with. No malloc, no getenv: only the arguments.
void start_with_library_settings(int, char** argv, char** env) {
  size_t count = 0;
  while (env[count] != nullptr) ++count;
  char** with =
      static_cast<char**>(alloca((count + std::size(kLibrarySettings) + 1) * sizeof(char*)));
  size_t n = 0;
  for (; n < count; ++n) with[n] = env[n];
  for (const char* setting : kLibrarySettings)
    if (!has_variable(env, setting)) with[n++] = const_cast<char*>(setting);
  if (n == count) return;  // all set: this is the second start, or the user set them
  with[n] = nullptr;
  ::execve("/proc/self/exe", argv, with);
  // No /proc: go on as loaded (the settings would not reach the libraries).
}

[[gnu::used, gnu::section(".preinit_array")]] void (*preinit_library_settings)(
    int, char**, char**) = start_with_library_settings;

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) the kernel sends SIGXFSZ, whose default
  // kills the process without a word; ignored, the write fails with EFBIG and
  // the writer reports it (exit 2) and keeps the previous file. The library
  // installs no handlers: this is the program's choice (docs/RELIABILITY.md).
  std::signal(SIGXFSZ, SIG_IGN);
  cli::set_argv(argc, argv);
  CLI::App app{"pooch-run: train, finetune, evaluate and run pooch models", "pooch-run"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(pooch_version_str()));
  // Flag errors in the form of every other error: "pooch-run: <what>".
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "pooch-run: " + std::string(e.what()) +
           "\n`pooch-run --help` lists the commands, `pooch-run <command> --help` their flags.\n";
  });
  app.footer(
      "Exit codes: 0 success, 1 usage, 2 bad input, 3 out of memory budget, 4 internal "
      "error. `pooch-run <command> --help` lists a command's flags; docs/CLI.md has more.");

  const std::vector<cli::Command> commands = {
      cli::add_demo(app),     cli::add_synth(app),      cli::add_train(app),
      cli::add_finetune(app), cli::add_eval(app),       cli::add_predict(app),
      cli::add_info(app),     cli::add_plan(app),       cli::add_profile(app),
      cli::add_import(app),   cli::add_export(app),     cli::add_tokenize(app),
      cli::add_generate(app), cli::add_merge_lora(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // A number out of its range is bad input (2); anything else a usage error (1).
    return rc == 0 ? cli::kOk : cli::range_error_seen() ? cli::kBadInput : cli::kUsage;
  }
  for (const cli::Command& c : commands)
    if (*c.app) return c.run();
  return cli::kUsage;
}
