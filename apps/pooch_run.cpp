// pooch-run: the command line tool. Built on the public C API alone
// (pooch.h), as dav1d's CLI uses only dav1d.h. One file per subcommand
// (cmd_*.cpp); docs/CLI.md is the reference.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "pooch/pooch.h"

int main(int argc, char** argv) {
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
      cli::add_demo(app), cli::add_synth(app),   cli::add_train(app), cli::add_finetune(app),
      cli::add_eval(app), cli::add_predict(app), cli::add_info(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? cli::kOk : cli::kUsage;
  }
  for (const cli::Command& c : commands)
    if (*c.app) return c.run();
  return cli::kUsage;
}
