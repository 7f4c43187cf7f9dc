// pooch-run demo (what `./pooch.sh demo` runs): a synthetic data set shaped
// like EURLex-4K, a model with a fixed fan-in output layer trained on it,
// the loss and P@1/3/5 of every epoch and the total time.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "training.h"

namespace cli {

namespace {

struct DemoOpts {
  std::string preset = "EURLex-4K";
  double scale = 1;
  ModelFlags model;
  TrainFlags train;
  DeviceFlags device;
  Output output{"demo"};
};

int run_demo(DemoOpts& o) {
  Output& out = o.output;
  const auto t0 = std::chrono::steady_clock::now();
  Data data;
  data.name = o.preset;
  if (pooch_status st = pooch_dataset_create_synth(o.preset.c_str(), o.scale, o.train.seed,
                                                   &data.train.p, &data.test.p))
    return out.fail(st, "generating the data set");
  data.train_source = o.preset + " (synthetic train)";
  data.test_source = o.preset + " (synthetic test)";
  const Shape tr = shape_of(data.train.p), te = shape_of(data.test.p);
  std::printf(
      "demo: synthetic %s at scale %g: %lld train and %lld test rows, %lld features, %lld labels "
      "(%.1f s)\n",
      o.preset.c_str(), o.scale, static_cast<long long>(tr.rows), static_cast<long long>(te.rows),
      static_cast<long long>(std::max(tr.features, te.features)),
      static_cast<long long>(std::max(tr.labels, te.labels)), seconds_since(t0));
  out.result()["train"] = shape_json(data.train.p, data.train_source);
  out.result()["test"] = shape_json(data.test.p, data.test_source);

  ModelHandle model;
  if (int rc = make_model(o.model, o.train, data.train.p, data.test.p, model, out)) return rc;
  std::printf(
      "model: hidden %lld, %s, %s loss, batch %lld; %d epochs, %s lr %g\n",
      static_cast<long long>(o.model.hidden),
      o.model.fan_in > 0
          ? ("fixed fan-in head (" + std::to_string(o.model.fan_in) + " inputs per label)").c_str()
          : "dense head",
      o.model.loss.c_str(), static_cast<long long>(o.train.batch), o.train.epochs,
      o.train.optimizer.c_str(), static_cast<double>(o.train.lr));
  // A fixed number of epochs: nothing decides on the test set, whose
  // figures each epoch are a report only (no plateau, no early stop).
  o.train.plateau_patience = 0;
  o.train.early_stop = 0;
  const int rc = run_training(model.p, false, data, o.train, o.device, false, out);
  const double secs = seconds_since(t0);
  std::printf("demo: total %.1f s\n", secs);
  out.result()["total_seconds"] = secs;
  return rc;
}

}  // namespace

Command add_demo(CLI::App& app) {
  auto o = std::make_shared<DemoOpts>();
  // Defaults measured to finish in well under two minutes on two CPU cores.
  o->train.batch = 128;
  o->train.epochs = 5;
  o->train.lr = 8e-3f;
  o->train.optimizer = "adam";
  // The demo shows the fixed fan-in head (fused with its loss): its own model
  // flags, not pooch-run train's defaults for bag-of-words data.
  o->model.hidden = 256;
  o->model.fan_in = 32;
  o->model.skip = "off";
  o->model.dropout = 0;
  CLI::App* c = app.add_subcommand(
      "demo", "Train a fixed fan-in model on a synthetic EURLex-4K-shaped set; print each epoch");
  c->add_option("--preset", o->preset, "Synthetic data set shape (see synth)")
      ->transform(one_of(synth_preset_names(), true))
      ->capture_default_str();
  c->add_option("--scale", o->scale, "Rows and labels relative to the real data set")
      ->check(in_range(0, kMaxScale, false, true))
      ->capture_default_str();
  c->add_option("--hidden", o->model.hidden, "Hidden width")
      ->check(positive())
      ->capture_default_str();
  c->add_option("--fan-in", o->model.fan_in, "Inputs per label (0: dense head)")
      ->check(non_negative())
      ->capture_default_str();
  c->add_option("--loss", o->model.loss, "squared-hinge, bce or softmax")
      ->transform(one_of({"squared-hinge", "bce", "softmax"}))
      ->capture_default_str();
  c->add_option("--batch", o->train.batch, "Rows per step")
      ->check(batch_range())
      ->capture_default_str();
  c->add_option("--epochs", o->train.epochs, "Passes over the data")
      ->check(positive())
      ->capture_default_str();
  c->add_option("--lr", o->train.lr, "Learning rate (Adam)")
      ->check(lr_range())
      ->capture_default_str();
  c->add_option("--seed", o->train.seed, "Data and weight seed")
      ->check(seed_range())
      ->capture_default_str();
  add_device_flags(c, o->device, "cpu");
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_demo(*o)); }};
}

}  // namespace cli
