// pooch-run eval: P@k, nDCG@k and PSP@k of a model on a test set.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "dense.h"
#include "progress.h"
#include "training.h"

namespace cli {

namespace {

struct EvalOpts {
  std::string model;
  DataFlags data;
  int64_t batch = 0;
  std::string propensity;
  std::string targets;  // dense models: --data X.npy --targets Y.npy
  DeviceFlags device;
  Output output{"eval"};
};

int run_eval(EvalOpts& o) {
  Output& out = o.output;
  if (!o.targets.empty() || is_npy_path(o.data.dir)) {
    ModelHandle model;
    if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
      return out.fail(st, "--model " + o.model);
    if (!is_dense_model(model.p))
      return out.fail(kBadInput, "--model " + o.model + " is an " + pooch_model_family(model.p) +
                                     " model: evaluate it on bag-of-words data (--data DIR)");
    return run_dense_eval(model.p, o.model, o.data.dir, o.targets, o.batch, o.device, out);
  }
  Data data;
  if (int rc = load_data(o.data, DataUse::eval, data, out)) return rc;
  ModelHandle model;
  if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
    return out.fail(st, "--model " + o.model);
  out.result()["model"] = o.model;
  // The library evaluates only data exactly as wide as the model (as in training).
  if (int rc = check_data_fits(model.p, data.test.p, data.test_source, true, out)) return rc;
  if (o.batch > 0)
    if (pooch_status st = pooch_model_set_run_shape(model.p, o.batch, 0, 5))
      return out.fail(st, "--batch");
  if (int rc = fit_max_nnz(model.p, {data.test.p}, out)) return rc;
  TrainFlags tf;
  tf.propensity = o.propensity;
  float a = 0, b = 0;
  if (int rc = propensity(tf, data.name, &a, &b, out)) return rc;

  SessionHandle s;
  if (int rc = open_session(model.p, o.device, s, out)) return rc;
  const auto t0 = std::chrono::steady_clock::now();
  pooch_metrics m{};
  if (pooch_status st = pooch_evaluate(s.p, data.test.p, data.train.p, a, b, &m))
    return out.fail(st, "evaluating");
  const double secs = seconds_since(t0);
  std::printf("%lld rows in %.2f s%s\n", static_cast<long long>(m.rows), secs,
              m.has_psp ? "" : " (no training set: PSP@k needs its label frequencies)");
  print_metrics_table(m);
  out.result()["metrics"] = metrics_json(m);
  if (m.has_psp) out.result()["propensity"] = {tidy(a), tidy(b)};
  out.result()["seconds"] = secs;
  return kOk;
}

}  // namespace

Command add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOpts>();
  CLI::App* c = app.add_subcommand("eval", "Print P@k, nDCG@k and PSP@k of a model on a test set");
  c->add_option("--model", o->model, "Model or checkpoint")->type_name("M.pooch")->required();
  add_data_flags(c, o->data, DataUse::eval);
  c->add_option("--batch", o->batch, "Rows per step (default: the model's)")->check(batch_range());
  c->add_option("--propensity", o->propensity,
                "PSP@k propensity parameters A,B (default: by the data set's name)")
      ->type_name("A,B");
  c->add_option("--targets", o->targets,
                "Dense models: the targets of --data X.npy (floats or integer class ids)")
      ->type_name("Y.npy")
      ->group("Dense data");
  add_device_flags(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_eval(*o)); }};
}

}  // namespace cli
