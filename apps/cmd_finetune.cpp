// pooch-run finetune: a trained model (or checkpoint) trained further, on a
// new label set when its output layer is replaced (--new-head).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "dense.h"
#include "lm_training.h"
#include "training.h"

namespace cli {

namespace {

struct FinetuneOpts {
  std::string model;
  int64_t new_head = -1;  // -1: the data's label count when it differs; 0: keep
  DataFlags data;
  TrainFlags train;
  DeviceFlags device;
  DenseTrainFlags dense;  // --valid-fraction too
  LmFlags lm;
  int64_t lora_rank = 0;  // --lora-rank: 0 trains every weight
  double lora_alpha = 0;  // --lora-alpha: 0 means the rank
  std::string lora_targets = "attn";
  const CLI::App* app = nullptr;
  Output output{"finetune"};
};

int run_finetune(FinetuneOpts& o) {
  Output& out = o.output;
  const bool lora = o.lora_rank > 0;
  if (!lora && o.app && (o.app->count("--lora-alpha") || o.app->count("--lora-targets")))
    return out.fail(kUsage, "finetune: --lora-alpha and --lora-targets go with --lora-rank");
  if (lora && !o.train.resume.empty())
    return out.fail(kUsage,
                    "finetune: --lora-rank starts adapters; a resumed run continues the "
                    "checkpoint's own (drop --lora-rank)");
  if (!o.dense.targets.empty()) {
    if (lora) return out.fail(kUsage, "finetune: --lora-rank is for gpt models");
    if (o.model.empty()) return out.fail(kUsage, "finetune: --model is required");
    o.train.resolve(false);
    return run_dense_finetune(o.model, o.new_head, o.data.dir, o.dense, o.train, o.device, o.app,
                              out);
  }
  const bool resume = !o.train.resume.empty();
  if (o.model.empty() && !resume)
    return out.fail(kUsage, "finetune: --model is required (or --resume CKPT)");
  if (int rc = check_output_paths(
          {{"--out", o.train.out}, {"--checkpoint", o.train.checkpoint}, {"--log", o.train.log}},
          out))
    return rc;
  // The model first: its family says what the data are (a gpt model trains
  // on a token stream, the others on a data set).
  ModelHandle model;
  const std::string path = resume ? o.train.resume : o.model;
  if (pooch_status st = pooch_model_load(path.c_str(), &model.p))
    return out.fail(st, (resume ? "--resume " : "--model ") + path);
  out.result()["model"] = path;
  if (resume) {
    if (!pooch_model_is_checkpoint(model.p))
      return out.fail(kBadInput, "--resume: " + path + " is a model file, not a checkpoint");
    std::printf("resuming from %s\n", path.c_str());
    out.result()["resumed_from"] = path;
  }
  if (std::string(pooch_model_family(model.p)) == "gpt") {
    if (o.new_head >= 0)
      return out.fail(kUsage,
                      "finetune: --new-head is for classifiers; a gpt model keeps its "
                      "vocabulary");
    if (lora) {
      // The rank's bound is the model's width: bad input for this model (2).
      const Json spec = Json::parse(pooch_model_spec_json(model.p), nullptr, false);
      const int64_t width = spec.is_object() ? spec.value("n_embd", int64_t{0}) : 0;
      if (o.lora_rank > width)
        return out.fail(kBadInput, "--lora-rank " + std::to_string(o.lora_rank) +
                                       " is more than the model's width (n_embd " +
                                       std::to_string(width) + "); use 1 to " +
                                       std::to_string(width));
      if (pooch_status st =
              pooch_model_add_lora(model.p, o.lora_rank, o.lora_alpha, o.lora_targets.c_str()))
        return out.fail(st, "--lora-rank");
      std::printf("LoRA: rank %lld, alpha %g, on %s; every other weight frozen\n",
                  static_cast<long long>(o.lora_rank),
                  o.lora_alpha > 0 ? o.lora_alpha : static_cast<double>(o.lora_rank),
                  o.lora_targets.c_str());
      out.result()["lora"] = {
          {"rank", o.lora_rank}, {"alpha", o.lora_alpha}, {"targets", o.lora_targets}};
    }
    o.train.resolve_gpt();
    o.lm.val_fraction = o.dense.valid_fraction;  // --valid-fraction: the stream's tail
    return run_lm_training(model.p, resume, o.data.dir, o.lm, o.train, o.device, o.app, out);
  }
  if (lora)
    return out.fail(kUsage, std::string("finetune: --lora-rank is for gpt models; ") + path +
                                " is of family " + pooch_model_family(model.p));
  Data data;
  if (int rc = load_data(o.data, DataUse::train, data, out)) return rc;
  const Shape shape = shape_of(data.train.p);
  o.train.resolve(false, false, auto_fan_in_head(shape.features, shape.labels));
  if (int rc = hold_out_validation(o.train, o.dense.valid_fraction, data, out)) return rc;
  if (!resume) {
    const SpecShape spec = spec_shape(model.p);
    const Shape train = shape_of(data.train.p), test = shape_of(data.test.p);
    const int64_t data_labels = std::max(train.labels, test.labels);
    if (train.features != spec.width)
      return out.fail(kBadInput, "data: " + data.train_source + " has " +
                                     std::to_string(train.features) + " features, but the model " +
                                     o.model + " takes " + std::to_string(spec.width) +
                                     " (finetuning keeps the input layer)");
    int64_t head = o.new_head;
    if (head < 0) head = data_labels != spec.labels ? data_labels : 0;
    if (head > 0) {
      if (head < data_labels)
        return out.fail(kBadInput, "finetune: --new-head " + std::to_string(head) +
                                       " is fewer labels than the data has (" +
                                       std::to_string(data_labels) + ")");
      if (pooch_status st = pooch_model_replace_head(model.p, head))
        return out.fail(st, "replacing the output layer");
      std::printf("new output layer: %lld labels (was %lld); every other weight kept\n",
                  static_cast<long long>(head), static_cast<long long>(spec.labels));
      out.result()["new_head"] = head;
    }
    if (o.train.batch > 0)
      if (pooch_status st = pooch_model_set_run_shape(model.p, o.train.batch, 0, 0))
        return out.fail(st, "--batch");
  }
  return run_training(model.p, resume, data, o.train, o.device, true, out);
}

}  // namespace

Command add_finetune(CLI::App& app) {
  auto o = std::make_shared<FinetuneOpts>();
  CLI::App* c =
      app.add_subcommand("finetune", "Train a model further, on a new label set with --new-head");
  c->add_option("--model", o->model, "The model or checkpoint to start from (its weights)")
      ->type_name("M.pooch");
  c->add_option("--new-head", o->new_head,
                "Replace the output layer by a fresh one over L labels (default: the data's "
                "label count when it differs from the model's; 0: keep the head)")
      ->type_name("L")
      ->check(non_negative());
  add_data_flags(c, o->data, DataUse::train);
  add_train_flags(c, o->train, true);
  add_dense_train_flags(c, o->dense);
  add_device_flags(c, o->device);
  add_lm_flags(c, o->lm);
  const char* g = "LoRA (gpt)";
  c->add_option("--lora-rank", o->lora_rank,
                "gpt: train rank-R adapters on the --lora-targets linears, every base weight "
                "frozen (pooch-run merge-lora folds them in afterwards)")
      ->type_name("R")
      ->check(in_range(1, 65536, true))
      ->group(g);
  c->add_option("--lora-alpha", o->lora_alpha,
                "gpt: the adapters' scale is alpha/rank (default: alpha = the rank)")
      ->type_name("A")
      ->check(in_range(0, 1e6, false, true))
      ->group(g);
  c->add_option("--lora-targets", o->lora_targets,
                "gpt: attn (attn.c_attn, attn.c_proj; default), mlp (mlp.c_fc, mlp.c_proj) or "
                "attn,mlp")
      ->type_name("LIST")
      ->group(g);
  add_json_flag(c, o->output);
  o->app = c;
  return {c, [o] { return o->output.finish(run_finetune(*o)); }};
}

}  // namespace cli
