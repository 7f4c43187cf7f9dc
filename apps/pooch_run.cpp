// pooch-run: the command line tool. Built on the public C API alone
// (pooch.h), as dav1d's CLI uses only dav1d.h. One file per subcommand
// (cmd_*.cpp); docs/CLI.md is the reference.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "commands.h"
#include "pooch/pooch.h"

namespace {

// OpenBLAS starts a pool of worker threads when it is loaded, before main
// runs, sized by the cores unless OPENBLAS_NUM_THREADS says otherwise; each
// worker maps a buffer as it starts, and under a low address-space limit
// (ulimit -v) one that cannot spins for ever. pooch sets the count each
// session runs (--threads) and OpenBLAS grows its pool to that on demand, so
// this process starts with none: it runs itself again, once, with the
// variable set. A count the user set is left as it is.
void start_without_blas_pool(char** argv) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  if (::setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_NUM_THREADS");  // no /proc: go on with the pool
}

}  // namespace

int main(int argc, char** argv) {
  start_without_blas_pool(argv);
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
      cli::add_demo(app),     cli::add_synth(app), cli::add_train(app),
      cli::add_finetune(app), cli::add_eval(app),  cli::add_predict(app),
      cli::add_info(app),     cli::add_plan(app),  cli::add_profile(app),
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
