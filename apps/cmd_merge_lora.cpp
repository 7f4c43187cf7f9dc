// pooch-run merge-lora: a LoRA-finetuned gpt model (or checkpoint) written as
// the plain model it computes, its adapters folded into the weights, so that
// it generates without the adapters' work and exports to Hugging Face.
#include <cstdio>
#include <memory>

#include "commands.h"

namespace cli {

namespace {

struct MergeOpts {
  std::string model, out;
  Output output{"merge-lora"};
};

int run_merge(MergeOpts& o) {
  Output& out = o.output;
  if (int rc = check_output_paths({{"--out", o.out}}, out)) return rc;
  if (pooch_status st = pooch_lora_merge(o.model.c_str(), o.out.c_str()))
    return out.fail(st, "merge-lora --model " + o.model);
  std::printf("merged the LoRA adapters of %s into its weights -> %s\n", o.model.c_str(),
              o.out.c_str());
  out.result()["model"] = o.model;
  out.result()["out"] = o.out;
  return kOk;
}

}  // namespace

Command add_merge_lora(CLI::App& app) {
  auto o = std::make_shared<MergeOpts>();
  CLI::App* c = app.add_subcommand(
      "merge-lora",
      "Fold a LoRA-finetuned gpt model's adapters into its weights (W + alpha/rank * B A)");
  c->add_option("--model", o->model, "The model or checkpoint finetuned with --lora-rank")
      ->type_name("M.pooch")
      ->required();
  c->add_option("--out", o->out, "The merged model file to write")
      ->type_name("OUT.pooch")
      ->required();
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_merge(*o)); }};
}

}  // namespace cli
