// pooch-run import / export: GPT-2 checkpoints of other programs in and out
// of pooch model files. import reads a Hugging Face directory (config.json +
// model.safetensors) or an llm.c gpt2_*.bin; export writes a gpt model as a
// Hugging Face directory that GPT2LMHeadModel.from_pretrained loads.
#include <cstdio>
#include <memory>

#include "commands.h"

namespace cli {

namespace {

struct ImportOpts {
  std::string from, out;
  Output output{"import"};
};

int run_import(ImportOpts& o) {
  Output& out = o.output;
  if (int rc = check_output_paths({{"--out", o.out}}, out)) return rc;
  if (pooch_status st = pooch_gpt_import(o.from.c_str(), o.out.c_str()))
    return out.fail(st, "import --from " + o.from);
  std::printf("imported %s -> %s\n", o.from.c_str(), o.out.c_str());
  out.result()["from"] = o.from;
  out.result()["out"] = o.out;
  return kOk;
}

struct ExportOpts {
  std::string model, to;
  Output output{"export"};
};

int run_export(ExportOpts& o) {
  Output& out = o.output;
  if (pooch_status st = pooch_gpt_export(o.model.c_str(), o.to.c_str()))
    return out.fail(st, "export --model " + o.model);
  std::printf("exported %s -> %s/config.json, %s/model.safetensors\n", o.model.c_str(),
              o.to.c_str(), o.to.c_str());
  out.result()["model"] = o.model;
  out.result()["to"] = o.to;
  return kOk;
}

}  // namespace

Command add_import(CLI::App& app) {
  auto o = std::make_shared<ImportOpts>();
  CLI::App* c = app.add_subcommand(
      "import", "Read a GPT-2 checkpoint (Hugging Face directory or llm.c .bin) into a model file");
  c->add_option("--from", o->from,
                "A Hugging Face directory (config.json + model.safetensors) or an llm.c "
                "gpt2_*.bin")
      ->type_name("DIR|FILE")
      ->required();
  c->add_option("--out", o->out, "The model file to write")->type_name("M.pooch")->required();
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_import(*o)); }};
}

Command add_export(CLI::App& app) {
  auto o = std::make_shared<ExportOpts>();
  CLI::App* c = app.add_subcommand(
      "export", "Write a gpt model as a Hugging Face directory (config.json + model.safetensors)");
  c->add_option("--model", o->model, "The gpt model file")->type_name("M.pooch")->required();
  c->add_option("--to", o->to, "The directory to write (created if missing)")
      ->type_name("DIR")
      ->required();
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_export(*o)); }};
}

}  // namespace cli
