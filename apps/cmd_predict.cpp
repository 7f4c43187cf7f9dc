// pooch-run predict: the top-k labels of each row of an input file, one line
// per row: "label:score label:score ...".
#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "data_args.h"
#include "training.h"

namespace cli {

namespace {

struct PredictOpts {
  std::string model;
  std::string input;
  std::string input_labels;
  int k = 5;
  std::string out;
  int64_t batch = 0;
  DeviceFlags device;
  Output output{"predict"};
};

int run_predict(PredictOpts& o) {
  Output& out = o.output;
  ModelHandle model;
  if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
    return out.fail(st, "--model " + o.model);
  DatasetHandle ds;
  // Nothing but predictions on stdout: the input is loaded without a progress line.
  if (pooch_status st =
          o.input_labels.empty()
              ? pooch_dataset_load(o.input.c_str(), &ds.p)
              : pooch_dataset_load_split(o.input.c_str(), o.input_labels.c_str(), &ds.p))
    return out.fail(st, "--input " + o.input);
  {
    const SpecShape spec = spec_shape(model.p);
    const Shape in = shape_of(ds.p);
    const bool dense = pooch_dataset_is_dense(ds.p) != 0;
    if (dense != spec.dense || in.features > spec.width)
      return out.fail(kBadInput, "--input: " + o.input + " has " + std::to_string(in.features) +
                                     (dense ? " dense" : "") + " features, but the model takes " +
                                     std::to_string(spec.width) +
                                     (spec.dense ? " dense" : " sparse") + " features");
  }
  if (pooch_status st = pooch_model_set_run_shape(model.p, o.batch, 0, o.k))
    return out.fail(st, "--k " + std::to_string(o.k));
  if (int rc = fit_max_nnz(model.p, {ds.p}, out)) return rc;

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.resume = 0;
  std::string err;
  if (!apply_device_flags(o.device, &sp, &err)) return out.fail(kUsage, err);
  SessionHandle s;
  if (pooch_status st = pooch_session_create(model.p, &sp, &s.p)) return out.fail(st, "session");

  FILE* f = stdout;
  if (!o.out.empty()) {
    f = std::fopen(o.out.c_str(), "w");
    if (!f) return out.fail(kBadInput, "--out: cannot open '" + o.out + "' for writing");
  }
  // With --json and no --out, the predictions go into the JSON object only.
  const bool into_json = out.json && o.out.empty();
  Json rows_json = Json::array();

  const Shape shape = shape_of(ds.p);
  int64_t batch = o.batch;
  if (batch <= 0) {
    const Json spec = Json::parse(pooch_model_spec_json(model.p), nullptr, false);
    batch = spec.is_object() ? spec.value("batch", int64_t{64}) : 64;
  }
  std::vector<int32_t> labels(static_cast<size_t>(batch * o.k));
  std::vector<float> scores(labels.size());
  const auto t0 = std::chrono::steady_clock::now();
  int rc = kOk;
  std::string line;
  for (int64_t first = 0; first < shape.rows; first += batch) {
    pooch_batch b{};
    if (pooch_status st = pooch_dataset_batch(ds.p, first, batch, &b)) {
      rc = out.fail(st, "reading rows");
      break;
    }
    if (pooch_status st = pooch_session_predict(s.p, &b, o.k, labels.data(), scores.data())) {
      rc = out.fail(st, "predicting");
      break;
    }
    for (int64_t r = 0; r < b.rows; ++r) {
      line.clear();
      Json row = Json::array();
      for (int j = 0; j < o.k; ++j) {
        const size_t at = static_cast<size_t>(r * o.k + j);
        if (labels[at] < 0) continue;
        if (into_json) {
          row.push_back({labels[at], tidy(scores[at])});
          continue;
        }
        char buf[48];
        std::snprintf(buf, sizeof buf, "%s%d:%.6g", line.empty() ? "" : " ", labels[at],
                      static_cast<double>(scores[at]));
        line += buf;
      }
      if (into_json)
        rows_json.push_back(std::move(row));
      else
        std::fprintf(f, "%s\n", line.c_str());
    }
  }
  if (f != stdout && std::fclose(f) != 0 && rc == kOk)
    rc = out.fail(kBadInput, "--out: writing '" + o.out + "' failed");
  if (rc != kOk) return rc;
  const double secs = seconds_since(t0);
  if (!o.out.empty())
    std::printf("predicted the top %d labels of %lld rows in %.2f s into %s\n", o.k,
                static_cast<long long>(shape.rows), secs, o.out.c_str());
  out.result()["rows"] = shape.rows;
  out.result()["k"] = o.k;
  out.result()["seconds"] = secs;
  if (!o.out.empty()) out.result()["out"] = o.out;
  if (into_json) out.result()["predictions"] = std::move(rows_json);
  return kOk;
}

}  // namespace

Command add_predict(CLI::App& app) {
  auto o = std::make_shared<PredictOpts>();
  CLI::App* c = app.add_subcommand(
      "predict", "Print the top-k labels with scores of each input row (\"l1:s1 l2:s2 ...\")");
  c->add_option("--model", o->model, "Model or checkpoint")->type_name("M.pooch")->required();
  c->add_option("--input", o->input,
                "Rows to predict: a bag-of-words file (labels, if any, are ignored), or split "
                "features with --input-labels")
      ->type_name("FILE")
      ->required();
  c->add_option("--input-labels", o->input_labels, "Labels file of split-form --input")
      ->type_name("FILE");
  c->add_option("--k", o->k, "Labels per row")->check(CLI::Range(1, 1000))->capture_default_str();
  c->add_option("--out", o->out, "Write the predictions here (default: stdout)")->type_name("FILE");
  c->add_option("--batch", o->batch, "Rows per step (default: the model's)")
      ->check(CLI::PositiveNumber);
  add_device_flags(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_predict(*o)); }};
}

}  // namespace cli
