// pooch-run: the command line tool. Built on the public C API alone
// (pooch.h), as dav1d's CLI uses only dav1d.h. One file per subcommand
// (cmd_*.cpp); docs/CLI.md is the reference.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "commands.h"
#include "pooch/pooch.h"

namespace {

// Settings the libraries pooch calls read once, when they are loaded, so
// this process runs itself again, once, with them in its environment. A
// value the user set is left as it is.
//
// OPENBLAS_NUM_THREADS=1: OpenBLAS starts a pool of worker threads when it
// is loaded, before main runs, sized by the cores; each worker maps a buffer
// as it starts, and under a low address-space limit (ulimit -v) one that
// cannot spins for ever. pooch sets the count each session runs (--threads)
// and OpenBLAS grows its pool to that on demand, so this process starts with
// none.
//
// No spinning: OpenMP's (libgomp's) threads busy-wait about 3 ms for the
// next parallel region by default, and OpenBLAS's about 0.1 s (2^28 cycles)
// for the next call, before they sleep. On a loaded machine those spins take
// the cores the other threads of the step need; in an idle process they burn
// CPU for nothing. OMP_WAIT_POLICY=passive and OPENBLAS_THREAD_TIMEOUT=4
// (2^4 cycles) make both sleep at once (docs/BENCHMARKS.md, "Idle CPU").
// The library cannot set these for a host program: libgomp and OpenBLAS read
// them before any pooch code runs (docs/RELIABILITY.md).
void start_with_library_settings(char** argv) {
  static const char* const settings[][2] = {
      {"OPENBLAS_NUM_THREADS", "1"},
      {"OMP_WAIT_POLICY", "passive"},
      {"OPENBLAS_THREAD_TIMEOUT", "4"},
  };
  bool set[std::size(settings)] = {};
  bool changed = false;
  for (size_t i = 0; i < std::size(settings); ++i)
    if (std::getenv(settings[i][0]) == nullptr) {
      set[i] = ::setenv(settings[i][0], settings[i][1], 1) == 0;
      changed = changed || set[i];
    }
  if (!changed) return;
  ::execv("/proc/self/exe", argv);
  // No /proc: go on as loaded (the settings would not reach the libraries now).
  for (size_t i = 0; i < std::size(settings); ++i)
    if (set[i]) ::unsetenv(settings[i][0]);
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) the kernel sends SIGXFSZ, whose default
  // kills the process without a word; ignored, the write fails with EFBIG and
  // the writer reports it (exit 2) and keeps the previous file. The library
  // installs no handlers: this is the program's choice (docs/RELIABILITY.md).
  std::signal(SIGXFSZ, SIG_IGN);
  start_with_library_settings(argv);
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
      cli::add_demo(app),    cli::add_synth(app),   cli::add_train(app),  cli::add_finetune(app),
      cli::add_eval(app),    cli::add_predict(app), cli::add_info(app),   cli::add_plan(app),
      cli::add_profile(app), cli::add_import(app),  cli::add_export(app), cli::add_tokenize(app),
      cli::add_generate(app),
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
