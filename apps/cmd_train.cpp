// pooch-run train: a new model (from --spec or the model flags) trained on a
// data set, or a run continued from its checkpoint (--resume).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "dense.h"
#include "ensemble.h"
#include "lm_training.h"
#include "training.h"

namespace cli {

namespace {

struct TrainOpts {
  DataFlags data;
  ModelFlags model;
  TrainFlags train;
  DeviceFlags device;
  DenseTrainFlags dense;
  LmFlags lm;
  const CLI::App* app = nullptr;
  Output output{"train"};
};

// The models the tuning on Debtags was done for: bag-of-words data, a model
// from the flags with a dense output layer and no bottleneck. They get its
// ensemble and its optimizer (SGD) when those are left to auto. `a`: the
// training set's shape.
bool debtags_tuned(const TrainOpts& o, const Data& data, const Shape& a) {
  const bool small = !auto_fan_in_head(a.features, a.labels);
  const bool dense_head = o.model.fan_in == 0 || (o.model.fan_in == ModelFlags::kAuto && small);
  const bool bow = data.train.p && !pooch_dataset_is_dense(data.train.p);
  return o.model.spec.empty() && bow && dense_head && o.model.bottleneck == 0;
}

int run_train(TrainOpts& o) {
  Output& out = o.output;
  // An ensemble averages bag-of-words models' scores; elsewhere it is
  // refused rather than ignored.
  auto refuse_ensemble = [&](const char* what) {
    return out.fail(kUsage, "--ensemble " + std::to_string(o.train.ensemble) +
                                ": ensembles train bag-of-words models only, not " + what);
  };
  if (o.dense.targets.empty() && (!o.train.resume.empty() || !o.model.spec.empty())) {
    // A gpt run (a spec of family gpt, or a checkpoint of one) trains on a token stream.
    ModelHandle model;
    if (!o.train.resume.empty()) {
      if (pooch_status st = pooch_model_load(o.train.resume.c_str(), &model.p))
        return out.fail(st, "--resume " + o.train.resume);
      if (std::string(pooch_model_family(model.p)) == "gpt") {
        if (!pooch_model_is_checkpoint(model.p))
          return out.fail(kBadInput, "--resume: " + o.train.resume +
                                         " is a model file, not a checkpoint (to train a model "
                                         "further, use: pooch-run finetune --model " +
                                         o.train.resume + ")");
        std::printf("resuming from %s\n", o.train.resume.c_str());
        out.result()["resumed_from"] = o.train.resume;
        o.train.resolve_gpt();
        o.lm.val_fraction = o.dense.valid_fraction;  // --valid-fraction: the stream's tail
        return run_lm_training(model.p, true, o.data.dir, o.lm, o.train, o.device, o.app, out);
      }
    } else {
      // Read once: a spec may come through a pipe.
      if (!read_spec_file(o.model.spec, &o.model.spec_text))
        return out.fail(kBadInput, "--spec: cannot read '" + o.model.spec +
                                       "' (or it is larger than 16 MiB, which no spec is)");
      if (spec_is_gpt(o.model.spec_text)) {
        if (o.train.ensemble > 1) return refuse_ensemble("a gpt model");
        if (int rc = make_gpt_model(o.model.spec_text, o.model.spec, o.train, o.lm, model, out))
          return rc;
        o.train.resolve_gpt();
        o.lm.val_fraction = o.dense.valid_fraction;  // --valid-fraction: the stream's tail
        return run_lm_training(model.p, false, o.data.dir, o.lm, o.train, o.device, o.app, out);
      }
    }
  }
  if (!o.dense.targets.empty()) {
    if (o.train.ensemble > 1) return refuse_ensemble("dense rows or images (--targets)");
    o.train.resolve(false);
    return run_dense_train(o.data.dir, o.dense, o.model, o.train, o.device, o.app, out);
  }
  if (is_npy_path(o.data.dir))
    return out.fail(kUsage, "--data " + o.data.dir +
                                ": dense rows train an mlp model; give their targets with "
                                "--targets Y.npy");
  if (int rc = check_output_paths(
          {{"--out", o.train.out}, {"--checkpoint", o.train.checkpoint}, {"--log", o.train.log}},
          out))
    return rc;
  if (!o.train.resume.empty() && o.train.ensemble > 1)
    return out.fail(kUsage, "--resume with --ensemble " + std::to_string(o.train.ensemble) +
                                ": an ensemble writes no checkpoint to resume from; run it again");
  float psp_a = 0, psp_b = 0;  // checked before the data is loaded; set again for the run
  if (int rc = propensity(o.train, "", &psp_a, &psp_b, out)) return rc;
  Data data;
  if (int rc = load_data(o.data, DataUse::train, data, out)) return rc;
  const Shape shape = shape_of(data.train.p);
  const bool tuned = debtags_tuned(o, data, shape);
  o.train.resolve(true, tuned, auto_fan_in_head(shape.features, shape.labels));  // bag-of-words
  if (int rc = hold_out_validation(o.train, o.dense.valid_fraction, data, out)) return rc;
  ModelHandle model;
  const bool resume = !o.train.resume.empty();
  if (resume) {
    if (pooch_status st = pooch_model_load(o.train.resume.c_str(), &model.p))
      return out.fail(st, "--resume " + o.train.resume);
    if (!pooch_model_is_checkpoint(model.p))
      return out.fail(kBadInput, "--resume: " + o.train.resume +
                                     " is a model file, not a checkpoint (to train a model "
                                     "further, use: pooch-run finetune --model " +
                                     o.train.resume + ")");
    std::printf("resuming from %s\n", o.train.resume.c_str());
    out.result()["resumed_from"] = o.train.resume;
  } else {
    // --ensemble, or where it is left to auto: kBowEnsemble members for the
    // models tuned on Debtags, else one.
    const int members = o.train.ensemble > 0 ? o.train.ensemble : (tuned ? kBowEnsemble : 1);
    if (members > 1) return run_ensemble_training(o.model, o.train, data, o.device, members, out);
    if (int rc =
            make_model(o.model, o.train, data.train.p, data.test.p, model, out, data.train_source))
      return rc;
  }
  return run_training(model.p, resume, data, o.train, o.device, true, out);
}

}  // namespace

Command add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOpts>();
  CLI::App* c = app.add_subcommand("train", "Train a model on a data set");
  add_data_flags(c, o->data, DataUse::train);
  add_model_flags(c, o->model);
  add_train_flags(c, o->train, true);
  c->add_option("--ensemble", o->train.ensemble,
                "Train this many models alike but for their seeds (--seed, --seed + 1, ...) and "
                "write one model that averages their scores (default: " +
                    std::to_string(kBowEnsemble) +
                    " for a bag-of-words model from the flags with a dense output layer, else "
                    "1; bag-of-words data only)")
      ->check(in_range(1, 64, true))
      ->default_str("auto")
      ->group("Training");
  add_dense_train_flags(c, o->dense);
  add_device_flags(c, o->device);
  add_machine_flag(c, o->device);
  add_lm_flags(c, o->lm);
  add_json_flag(c, o->output);
  o->app = c;
  return {c, [o] { return o->output.finish(run_train(*o)); }};
}

}  // namespace cli
