// pooch-run predict: the top-k labels of each row of an input file, one line
// per row: "label:score label:score ...".
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "commands.h"
#include "data_args.h"
#include "dense.h"
#include "training.h"

namespace cli {

namespace {

struct PredictOpts {
  std::string model;
  std::string input;
  std::string input_labels;
  std::string data;  // dense models: X.npy
  int k = 5;
  CLI::Option* k_option = nullptr;  // to tell a given --k from the default
  std::string out;
  int64_t batch = 0;
  DeviceFlags device;
  Output output{"predict"};
};

// The --out file, written as <out>.tmp-<pid> and renamed into place once
// every row is written: a failed run leaves no partial file behind.
class OutFile {
 public:
  ~OutFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  bool open(const std::string& path) {
    path_ = path;
    tmp_ = path + ".tmp-" + std::to_string(getpid());
    f_ = std::fopen(tmp_.c_str(), "w");
    return f_ != nullptr;
  }
  FILE* get() const { return f_; }
  bool commit() {
    const bool ok = std::fclose(f_) == 0 && std::rename(tmp_.c_str(), path_.c_str()) == 0;
    f_ = nullptr;
    if (!ok) {
      const int e = errno;  // for the message, past remove()
      std::remove(tmp_.c_str());
      errno = e;
    }
    return ok;
  }

 private:
  FILE* f_ = nullptr;
  std::string path_, tmp_;
};

int run_predict(PredictOpts& o) {
  Output& out = o.output;
  if (int rc = check_output_paths({{"--out", o.out}}, out)) return rc;
  ModelHandle model;
  if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
    return out.fail(st, "--model " + o.model);
  if (is_dense_model(model.p))
    return run_dense_predict(model.p, o.model, o.data.empty() ? o.input : o.data, o.out, o.batch,
                             o.device, out);
  if (!o.data.empty())
    return out.fail(kUsage, "--data: " + o.model + " is an " + pooch_model_family(model.p) +
                                " model; give the rows to predict with --input FILE");
  if (o.input.empty()) return out.fail(kUsage, "--input: the rows to predict are required");
  DatasetHandle ds;
  // Nothing but predictions on stdout: the input is loaded without a progress line.
  if (pooch_status st =
          o.input_labels.empty()
              ? pooch_dataset_load(o.input.c_str(), &ds.p)
              : pooch_dataset_load_split(o.input.c_str(), o.input_labels.c_str(), &ds.p))
    return out.fail(st, "--input " + o.input);
  const SpecShape spec = spec_shape(model.p);
  const Shape in = shape_of(ds.p);
  const bool dense = pooch_dataset_is_dense(ds.p) != 0;
  if (dense != spec.dense)
    return out.fail(kBadInput, "--input: " + o.input + " holds " +
                                   (dense ? "dense (.npy)" : "sparse") + " rows, but the model " +
                                   o.model + " takes " + (spec.dense ? "dense" : "sparse") +
                                   " input");
  if (in.features > spec.width)
    return out.fail(kBadInput, "--input: " + o.input + " has " + std::to_string(in.features) +
                                   " features, but the model " + o.model + " takes " +
                                   std::to_string(spec.width));
  // The default k shrinks to a model with fewer labels; a --k given does not.
  int k = o.k;
  if (k > spec.labels) {
    if (o.k_option->count() > 0)
      return out.fail(kUsage, "--k " + std::to_string(k) + ": the model " + o.model + " has only " +
                                  std::to_string(spec.labels) + " labels; use --k " +
                                  std::to_string(spec.labels) + " or less");
    k = static_cast<int>(spec.labels);
  }
  if (pooch_status st = pooch_model_set_run_shape(model.p, o.batch, 0, k))
    return out.fail(st, "--k " + std::to_string(k));
  if (int rc = fit_max_nnz(model.p, {ds.p}, out)) return rc;

  SessionHandle s;
  if (int rc = open_session(model.p, o.device, s, out)) return rc;

  OutFile file;
  if (!o.out.empty() && !file.open(o.out))
    return out.fail(kBadInput, "--out: cannot write '" + o.out + "': " + std::strerror(errno));
  FILE* f = o.out.empty() ? stdout : file.get();
  // With --json and no --out, the predictions go into the JSON object only.
  const bool into_json = out.json && o.out.empty();
  Json rows_json = Json::array();

  int64_t batch = o.batch;
  if (batch <= 0) {
    const Json j = Json::parse(pooch_model_spec_json(model.p), nullptr, false);
    batch = j.is_object() ? j.value("batch", int64_t{64}) : 64;
  }
  std::vector<int32_t> labels(static_cast<size_t>(batch * k));
  std::vector<float> scores(labels.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::string line;
  for (int64_t first = 0; first < in.rows; first += batch) {
    pooch_batch b{};
    if (pooch_status st = pooch_dataset_batch(ds.p, first, batch, &b))
      return out.fail(st, "reading rows");
    if (pooch_status st = pooch_session_predict(s.p, &b, k, labels.data(), scores.data()))
      return out.fail(st, "predicting");
    for (int64_t r = 0; r < b.rows; ++r) {
      line.clear();
      Json row = Json::array();
      for (int j = 0; j < k; ++j) {
        const size_t at = static_cast<size_t>(r * k + j);
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
  if (!o.out.empty() && !file.commit())
    return out.fail(kBadInput, "--out: writing '" + o.out + "' failed: " + std::strerror(errno));
  const double secs = seconds_since(t0);
  if (!o.out.empty())
    std::printf("predicted the top %d labels of %lld rows in %.2f s into %s\n", k,
                static_cast<long long>(in.rows), secs, o.out.c_str());
  out.result()["rows"] = in.rows;
  out.result()["k"] = k;
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
      ->type_name("FILE");
  c->add_option("--data", o->data,
                "Dense models: the rows to predict (X.npy); --out writes the predictions as .npy")
      ->type_name("X.npy");
  c->add_option("--input-labels", o->input_labels, "Labels file of split-form --input")
      ->type_name("FILE");
  o->k_option =
      c->add_option("--k", o->k, "Labels per row (the default shrinks to the model's labels)")
          ->check(in_range(1, 1000, true))
          ->capture_default_str();
  c->add_option("--out", o->out, "Write the predictions here (default: stdout)")->type_name("FILE");
  c->add_option("--batch", o->batch, "Rows per step (default: the model's)")->check(batch_range());
  add_device_flags(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_predict(*o)); }};
}

}  // namespace cli
