// The subcommands of pooch-run, one file each (cmd_<name>.cpp). Each adds its
// CLI11 subcommand with its flags to `app` and returns what runs it.
#pragma once
#include "cli_common.h"

namespace cli {

Command add_synth(CLI::App& app);
Command add_train(CLI::App& app);
Command add_finetune(CLI::App& app);
Command add_eval(CLI::App& app);
Command add_predict(CLI::App& app);
Command add_info(CLI::App& app);
Command add_demo(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_profile(CLI::App& app);
Command add_import(CLI::App& app);
Command add_export(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_generate(CLI::App& app);
Command add_merge_lora(CLI::App& app);

}  // namespace cli
