#include "training.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>

#include "console.h"
#include "progress.h"
#include "sigint.h"

namespace cli {

namespace {

void on_epoch(void* user, const pooch_epoch_report* rep) {
  auto* r = static_cast<RunState*>(user);
  r->progress->epoch(*rep);
  Json j = epoch_json(*rep);
  r->epochs.push_back(j);
  Json l = {{"type", "epoch"}};
  if (r->member > 0) l["member"] = r->member;
  for (auto& [k, v] : j.items()) l[k] = v;
  log_line(r->log, l);
  if (r->after_epoch) r->after_epoch(*rep);
}

// At most `limit` bytes: /dev/zero as a spec must not fill the memory.
bool read_file_limited(const std::string& path, std::string* text,
                       size_t limit = size_t{16} << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  text->clear();
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text->append(buf, static_cast<size_t>(in.gcount()));
    if (text->size() > limit) return false;
  }
  return true;
}

// The first key that appears twice in one object of `text` ("" if none, or
// if the text is not JSON: the library says what is wrong with it then).
// The library's readers have the same check (runtime/core/strict_json.h),
// which pooch-run, built on the C API alone, does not link.
std::string repeated_key(const std::string& text) {
  std::vector<std::set<std::string>> keys;
  std::string repeated;
  const Json::parser_callback_t cb = [&](int, Json::parse_event_t ev, Json& parsed) {
    if (ev == Json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == Json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == Json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
               !keys.back().insert(parsed.get<std::string>()).second && repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  const Json parsed = Json::parse(text, cb, false);  // only the callback matters
  (void)parsed;
  return repeated;
}

}  // namespace

int run_on_step(void* user, int64_t step, float loss, int epoch, int64_t batch, int64_t batches) {
  auto* r = static_cast<RunState*>(user);
  ++r->steps;
  r->last_step = step;
  r->last_epoch = epoch;
  r->last_batch = batch;
  r->batches = batches;
  r->progress->step(step, loss, epoch, batch, batches);
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - r->last_step_end).count();
  r->last_step_end = now;
  if (r->log) {
    Json j;
    j["type"] = "step";
    if (r->member > 0) j["member"] = r->member;
    j["step"] = step;
    j["epoch"] = epoch;
    j["batch"] = batch;
    j["batches"] = batches;
    j["loss"] = tidy(loss);
    j["seconds"] = seconds;
    std::fprintf(r->log, "%s\n", j.dump().c_str());
  }
  if (sigint_received()) return 0;
  if (r->max_steps > 0 && r->steps >= r->max_steps) {
    r->stopped_by_max = true;
    return 0;
  }
  return 1;
}

void log_line(FILE* log, const Json& j) {
  if (!log) return;
  std::fprintf(log, "%s\n", j.dump().c_str());
  std::fflush(log);
}

bool read_spec_file(const std::string& path, std::string* text) {
  return read_file_limited(path, text);
}

std::string spec_family(const std::string& spec_text) {
  const Json j = Json::parse(spec_text, nullptr, false);
  if (!j.is_object()) return {};
  if (!j.contains("family") || !j["family"].is_string()) return "xmc";
  std::string f = j["family"].get<std::string>();
  // As the library reads it: without regard to case.
  for (char& c : f) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return f;
}

int make_complete_model(const std::string& spec_text, const std::string& spec_path,
                        const TrainFlags& tf, ModelHandle& model, Output& out,
                        const std::function<void(Json&)>& fill) {
  // The spec is written out again below, which would keep only the last of
  // a repeated key: the library refuses those, so look now.
  if (const std::string key = repeated_key(spec_text); !key.empty())
    return out.fail(kBadInput, spec_path + ": the key \"" + key +
                                   "\" appears twice in one object; give each field once");
  Json j = Json::parse(spec_text, nullptr, false);
  if (!j.is_object()) return out.fail(kBadInput, "--spec " + spec_path + ": not a JSON object");
  if (fill) fill(j);
  if (tf.batch > 0) j["batch"] = tf.batch;
  if (tf.seed_option && tf.seed_option->count() > 0) j["seed"] = tf.seed;
  const std::string text = j.dump();
  if (pooch_status st = pooch_model_create_from_spec(text.c_str(), spec_path.c_str(), &model.p))
    return out.fail(st, "--spec " + spec_path);
  return kOk;
}

std::string resume_command(const std::string& ckpt) {
  const auto& w = argv_words();
  std::string cmd;
  for (size_t i = 0; i < w.size(); ++i) {
    const std::string& a = w[i];
    if (a == "--resume" || a == "--max-steps") {
      ++i;
      continue;
    }
    if (a.rfind("--resume=", 0) == 0 || a.rfind("--max-steps=", 0) == 0) continue;
    if (!cmd.empty()) cmd += ' ';
    cmd += shell_quote(a);
  }
  return cmd + " --resume " + shell_quote(ckpt);
}

bool auto_fan_in_head(int64_t features, int64_t labels) {
  return static_cast<double>(features) * static_cast<double>(labels) >=
         static_cast<double>(kAutoDenseWeights);
}

void TrainFlags::resolve(bool bow, bool sgd_by_default, bool many_labels) {
  if (optimizer == "auto") optimizer = bow && sgd_by_default ? "sgd" : "adam";
  const bool sgd = optimizer == "sgd";
  if (adam_eps < 0) adam_eps = many_labels ? kManyLabelsAdamEps : kAdamEps;
  if (epochs == kAuto) epochs = bow ? (sgd ? kBowEpochs : kBowAdamEpochs) : 10;
  if (lr < 0) lr = bow ? (sgd ? kBowLr : kBowAdamLr) : 1e-3f;
  if (lr_schedule == "auto") lr_schedule = bow ? "cosine" : "constant";
  if (lr_min_ratio < 0) lr_min_ratio = 0;
  if (plateau_patience == kAuto) plateau_patience = bow ? 0 : 2;
  if (early_stop == kAuto) early_stop = bow ? 0 : 4;
  if (clip_norm < 0) clip_norm = 0;
}

void apply_optimizer_flags(const TrainFlags& f, const std::string& kind, pooch_session_params* sp) {
  sp->optimizer = kind == "adamw" ? POOCH_OPT_ADAMW
                  : kind == "sgd" ? POOCH_OPT_SGD
                                  : POOCH_OPT_ADAM;
  sp->learning_rate = f.lr;
  sp->eps = f.adam_eps;
  sp->weight_decay = f.weight_decay;
  sp->clip_norm = f.clip_norm < 0 ? 0.0f : f.clip_norm;
}

pooch_session_params train_step_params(TrainFlags& f, const std::string& family) {
  if (family == "gpt")
    f.resolve_gpt();
  else
    f.resolve(false);
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  apply_optimizer_flags(f, f.optimizer, &sp);
  return sp;
}

void add_step_optimizer_flag(CLI::App* app, TrainFlags& f) {
  app->add_option("--optimizer", f.optimizer,
                  "The step of adam, adamw or sgd (with momentum), as train --optimizer; "
                  "default: the one train takes for the model (adamw for gpt, else adam)")
      ->transform(one_of({"auto", "adam", "adamw", "sgd"}))
      ->default_str("auto");
}

void TrainFlags::resolve_gpt() {
  if (optimizer == "auto") optimizer = "adamw";  // GPT-2 trains with AdamW
  if (lr_schedule == "auto") lr_schedule = "cosine";
  if (lr_min_ratio < 0) lr_min_ratio = 0.1;  // as GPT-2 and nanoGPT train
  if (clip_norm < 0) clip_norm = 1.0f;
  resolve(false);
}

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("--spec", f.spec,
                  "Model spec (JSON, docs/CLI.md); input width and labels default to the data's")
      ->type_name("FILE")
      ->group("Model");
  app->add_option("--hidden", f.hidden,
                  "Width of the first (linear, relu) layer (default: 512 for bag-of-words "
                  "data, 256 for dense rows)")
      ->check(positive())
      ->default_str("auto")
      ->group("Model");
  app->add_option("--bottleneck", f.bottleneck, "Width of a second linear layer (0: none)")
      ->check(non_negative())
      ->capture_default_str()
      ->group("Model");
  app->add_option("--fan-in", f.fan_in,
                  "Inputs per label of the fixed fan-in head (0: dense head; default: a dense "
                  "head when input width x labels is below 2^26, else 32)")
      ->check(non_negative())
      ->default_str("auto")
      ->group("Model");
  app->add_option("--skip", f.skip,
                  "A linear path from the sparse input straight to the labels, beside the "
                  "network: on, off, or auto (off: on the Debtags validation rows it added no "
                  "precision and doubled the training time)")
      ->transform(one_of({"auto", "on", "off"}))
      ->capture_default_str()
      ->group("Model");
  app->add_option("--loss", f.loss, "Loss: squared-hinge, bce or softmax")
      ->transform(one_of({"squared-hinge", "bce", "softmax"}))
      ->capture_default_str()
      ->group("Model");
  app->add_option("--dropout", f.dropout,
                  "Dropout after the hidden layers (0: none; default: 0.3 for bag-of-words "
                  "data, 0 for dense rows)")
      ->check(in_range(0, 0.999, false))
      ->default_str("auto")
      ->group("Model");
}

void add_train_flags(CLI::App* app, TrainFlags& f, bool with_output) {
  app->add_option("--epochs", f.epochs,
                  "Passes over the training set (default: " + std::to_string(kBowEpochs) +
                      " with SGD and " + std::to_string(kBowAdamEpochs) +
                      " with Adam for train on bag-of-words data, else 10)")
      ->check(positive())
      ->default_str(f.epochs == TrainFlags::kAuto ? "auto" : std::to_string(f.epochs))
      ->group("Training");
  app->add_option("--batch", f.batch,
                  "Rows per step (default: the spec's or model's; from the model flags 32, "
                  "64 for dense rows)")
      ->check(batch_range())
      ->group("Training");
  app->add_option("--lr", f.lr,
                  "Learning rate (the peak of the cosine schedule; default for train on "
                  "bag-of-words data: 0.15 with SGD, 0.002 with Adam; else 0.001)")
      ->check(lr_range())
      ->default_str("auto")
      ->group("Training");
  app->add_option("--optimizer", f.optimizer,
                  "adam, adamw or sgd (with momentum 0.9); default: sgd for train on "
                  "bag-of-words data with a model from the flags with a dense output layer "
                  "(the ensemble's models), else adam")
      ->transform(one_of({"auto", "adam", "adamw", "sgd"}))
      ->capture_default_str()
      ->group("Training");
  app->add_option("--adam-eps", f.adam_eps,
                  "Adam's epsilon (default: 1e-4 for train and finetune on data with more input x "
                  "label weights than a dense output layer gets, where the smaller default let "
                  "every label's logit slide down; else 1e-8)")
      ->check(in_range(0, 1, false, true))
      ->default_str("auto")
      ->group("Training");
  app->add_option("--weight-decay", f.weight_decay, "Weight decay (AdamW: decoupled)")
      ->check(in_range(0, kMaxWeightDecay, false))
      ->capture_default_str()
      ->group("Training");
  app->add_option("--clip-norm", f.clip_norm,
                  "Clip the gradients to this global norm, as torch's clip_grad_norm_ (0: none; "
                  "default 1 for gpt models, none otherwise)")
      ->check(in_range(0, 1e6, false))
      ->default_str("auto")
      ->group("Training");
  app->add_option("--warmup-steps,--warmup", f.warmup_steps, "Linear learning-rate warm-up steps")
      ->check(non_negative())
      ->capture_default_str()
      ->group("Training");
  app->add_option("--lr-schedule", f.lr_schedule,
                  "constant, or cosine: half a cosine from --lr down to --lr-min-ratio x --lr "
                  "over the run's steps (after the warm-up); default: cosine for train on "
                  "bag-of-words data and for gpt models, else constant")
      ->transform(one_of({"constant", "cosine"}))
      ->capture_default_str()
      ->group("Training");
  app->add_option("--lr-min-ratio", f.lr_min_ratio,
                  "Where the cosine schedule ends, as a share of --lr (default: 0.1 for gpt "
                  "models, else 0)")
      ->check(in_range(0, 1, false))
      ->group("Training");
  app->add_option("--rewire-every", f.rewire_every,
                  "Dynamic sparse training of the fixed fan-in head: rewire every N steps (0: "
                  "never)")
      ->check(non_negative())
      ->capture_default_str()
      ->group("Training");
  app->add_option("--rewire-fraction", f.rewire_fraction,
                  "The share of each label's connections pruned and regrown at a rewire")
      ->check(in_range(0, 1, false))
      ->capture_default_str()
      ->group("Training");
  app->add_option("--plateau-patience", f.plateau_patience,
                  "Epochs without improvement before the learning rate is reduced (0: never; "
                  "default: 0 for train on bag-of-words data, else 2)")
      ->check(non_negative())
      ->default_str("auto")
      ->group("Training");
  app->add_option("--plateau-factor", f.plateau_factor, "Factor of each reduction")
      ->check(in_range(0, 1, false))
      ->capture_default_str()
      ->group("Training");
  app->add_option("--early-stop", f.early_stop,
                  "Epochs without improvement before stopping (0: never; default: 0 for train "
                  "on bag-of-words data, else 4); on bag-of-words data it and "
                  "--plateau-patience decide on rows held out of the training set "
                  "(--valid-fraction), never on --test")
      ->check(non_negative())
      ->default_str("auto")
      ->group("Training");
  f.seed_option =
      app->add_option("--seed", f.seed, "Seed of the weights, dropout, wiring and data order")
          ->check(seed_range())
          ->capture_default_str()
          ->group("Training");
  app->add_option("--propensity", f.propensity,
                  "PSP@k propensity parameters A,B (default: by the data set's name)")
      ->type_name("A,B")
      ->group("Training");
  if (!with_output) return;
  app->add_option("--out", f.out, "The final model")
      ->type_name("MODEL.pooch")
      ->capture_default_str()
      ->group("Output");
  app->add_option("--checkpoint", f.checkpoint,
                  "Checkpoint written after each epoch and on Ctrl-C (default: <out>.ckpt)")
      ->type_name("FILE")
      ->group("Output");
  app->add_option("--resume", f.resume, "Continue the run saved in this checkpoint")
      ->type_name("CKPT")
      ->group("Output");
  app->add_flag("--force", f.force,
                "With --resume: go on even when the training data differ from the data the "
                "checkpoint was trained on (their fingerprints differ)")
      ->group("Output");
  app->add_option("--log", f.log, "Write one JSON object per step and per epoch here")
      ->type_name("FILE.jsonl")
      ->group("Output");
  // Stops as Ctrl-C does after this many steps (tests of resuming).
  app->add_option("--max-steps", f.max_steps)->group("")->check(non_negative());
}

SpecShape spec_shape(const pooch_model* m) {
  SpecShape s;
  const char* text = pooch_model_spec_json(m);
  if (!text) return s;
  const Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return s;
  if (j.contains("input") && j["input"].is_object()) {
    s.width = j["input"].value("width", int64_t{0});
    s.dense = j["input"].value("kind", std::string("sparse")) == "dense";
  }
  s.labels = j.value("labels", int64_t{0});
  return s;
}

int check_data_fits(const pooch_model* m, const pooch_dataset* ds, const std::string& source,
                    bool training, Output& out) {
  if (!ds) return kOk;
  const SpecShape s = spec_shape(m);
  const Shape d = shape_of(ds);
  const bool dense = pooch_dataset_is_dense(ds) != 0;
  std::string why;
  if (dense != s.dense)
    why = std::string("the model takes ") + (s.dense ? "dense" : "sparse") + " input";
  else if (training ? d.features != s.width : d.features > s.width)
    why = "the model takes " + std::to_string(s.width) + " features";
  else if (d.labels > s.labels)
    why = "the model has " + std::to_string(s.labels) + " labels" +
          (training ? " (finetune --new-head replaces the output layer)" : "");
  if (why.empty()) return kOk;
  return out.fail(kBadInput, "data: " + source + " has " + std::to_string(d.features) +
                                 (dense ? " dense" : "") + " features and " +
                                 std::to_string(d.labels) + " labels, but " + why);
}

int fit_max_nnz(pooch_model* m, std::initializer_list<const pooch_dataset*> sets, Output& out) {
  const Json spec = Json::parse(pooch_model_spec_json(m), nullptr, false);
  if (!spec.is_object()) return kOk;
  const int64_t batch = spec.value("batch", int64_t{64});
  int64_t have = spec.value("max_nnz", int64_t{0});
  if (have == 0) have = batch * 64;
  int64_t need = 0;
  for (const pooch_dataset* ds : sets)
    if (ds && !pooch_dataset_is_dense(ds))
      need = std::max(need, pooch_dataset_max_batch_nnz(ds, batch));
  if (need <= have) return kOk;
  if (pooch_status st = pooch_model_set_run_shape(m, 0, need, 0))
    return out.fail(st, "setting max_nnz to " + std::to_string(need));
  return kOk;
}

namespace {

// Raises the model's max_labels (positive labels a training batch may hold)
// to what the `batch` rows with the most labels of each data set hold, as
// fit_max_nnz does for the nonzeros. Exit code.
int fit_max_labels(pooch_model* m, std::initializer_list<const pooch_dataset*> sets, Output& out) {
  const Json spec = Json::parse(pooch_model_spec_json(m), nullptr, false);
  if (!spec.is_object()) return kOk;
  const int64_t batch = spec.value("batch", int64_t{64});
  int64_t have = spec.value("max_labels", int64_t{0});
  if (have == 0) have = batch * 32;
  int64_t need = 0;
  for (const pooch_dataset* ds : sets)
    if (ds) need = std::max(need, pooch_dataset_max_batch_labels(ds, batch));
  if (need <= have) return kOk;
  if (pooch_status st = pooch_model_set_max_labels(m, need))
    return out.fail(st, "setting max_labels to " + std::to_string(need));
  return kOk;
}

}  // namespace

int make_model(const ModelFlags& mf, const TrainFlags& tf, const pooch_dataset* train,
               const pooch_dataset* test, ModelHandle& model, Output& out,
               const std::string& data_source) {
  const Shape a = shape_of(train), b = shape_of(test);
  const int64_t features = std::max(a.features, b.features);
  const int64_t labels = std::max(a.labels, b.labels);
  const bool dense = train && pooch_dataset_is_dense(train);
  std::string text, source;
  if (!mf.spec.empty()) {
    source = mf.spec;
    if (!mf.spec_text.empty())
      text = mf.spec_text;
    else if (!read_spec_file(mf.spec, &text))
      return out.fail(kBadInput, "--spec: cannot read '" + mf.spec +
                                     "' (or it is larger than 16 MiB, which no spec is)");
    // The spec is filled in and written out again below, which would keep
    // only the last of a repeated key: the library refuses those, so look now.
    if (const std::string key = repeated_key(text); !key.empty())
      return out.fail(kBadInput, mf.spec + ": the key \"" + key +
                                     "\" appears twice in one object; give each field once");
    Json j = Json::parse(text, nullptr, false);
    if (j.is_object()) {  // else the library reports what is wrong with it
      if (!j.contains("input")) j["input"] = Json::object();
      if (j["input"].is_object()) {
        if (!j["input"].contains("kind")) j["input"]["kind"] = dense ? "dense" : "sparse";
        if (!j["input"].contains("width")) j["input"]["width"] = features;
      }
      if (!j.contains("labels")) j["labels"] = labels;
      if (tf.batch > 0) j["batch"] = tf.batch;
      if (tf.seed_option && tf.seed_option->count() > 0) j["seed"] = tf.seed;
      text = j.dump();
    }
  } else {
    source = "model flags (input width and labels from " + data_source + ")";
    Json j;
    j["input"] = {{"kind", dense ? "dense" : "sparse"}, {"width", features}};
    j["labels"] = labels;
    Json layers = Json::array();
    const int64_t hidden = mf.hidden_or(kBowHidden);
    const double dropout = mf.dropout_or(kBowDropout);
    layers.push_back({{"type", "linear"}, {"width", hidden}, {"activation", "relu"}});
    if (mf.bottleneck > 0)
      layers.push_back({{"type", "linear"}, {"width", mf.bottleneck}, {"activation", "relu"}});
    if (dropout > 0) layers.push_back({{"type", "dropout"}, {"p", dropout}});
    // Left to auto: a dense head where input width x labels is small enough,
    // else a fixed fan-in head.
    const bool small = !auto_fan_in_head(features, labels);
    const int64_t fan_in = mf.fan_in != ModelFlags::kAuto ? mf.fan_in
                           : small                        ? 0
                                                          : std::min<int64_t>(32, hidden);
    if (fan_in > 0)
      layers.push_back({{"type", "ffi"}, {"fan_in", fan_in}});
    else
      layers.push_back({{"type", "dense"}});
    j["layers"] = layers;
    j["loss"] = mf.loss;
    // The skip path only when asked for: with the network beside it it gave
    // the same precision on the Debtags validation rows at twice the
    // training time (docs/BENCHMARKS.md, "Round 3").
    if (!dense && mf.skip == "on") j["skip"] = true;
    j["batch"] = tf.batch > 0 ? tf.batch : kBowBatch;
    j["seed"] = tf.seed;
    text = j.dump();
  }
  if (pooch_status st = pooch_model_create_from_spec(text.c_str(), source.c_str(), &model.p))
    return out.fail(st, "model");
  if (int rc = fit_max_labels(model.p, {train}, out)) return rc;
  return fit_max_nnz(model.p, {train, test}, out);
}

int propensity(const TrainFlags& f, const std::string& data_name, float* a, float* b, Output& out) {
  if (f.propensity.empty()) {
    pooch_propensity_defaults(data_name.c_str(), a, b);
    return kOk;
  }
  const size_t comma = f.propensity.find(',');
  try {
    if (comma == std::string::npos) throw 0;
    size_t u1 = 0, u2 = 0;
    const std::string s1 = f.propensity.substr(0, comma), s2 = f.propensity.substr(comma + 1);
    *a = std::stof(s1, &u1);
    *b = std::stof(s2, &u2);
    if (u1 != s1.size() || u2 != s2.size()) throw 0;
  } catch (...) {
    return out.fail(kUsage,
                    "--propensity: '" + f.propensity + "' is not two numbers A,B (e.g. 0.55,1.5)");
  }
  // Propensity 1 / (1 + C e^{-A log(N + B)}) needs A >= 0 and N + B > 0 for every N >= 0.
  if (!std::isfinite(*a) || !std::isfinite(*b) || *a < 0 || *a > 1e6 || *b <= -1 || *b > 1e6)
    return out.fail(kBadInput, "--propensity: '" + f.propensity +
                                   "' is out of range: use A from 0 to 1000000 and B above -1 "
                                   "and at most 1000000");
  return kOk;
}

int hold_out_validation(const TrainFlags& f, double fraction, Data& data, Output& out) {
  if (!f.evaluation_decides() || fraction <= 0 || !data.train.p) return kOk;
  const Shape sh = shape_of(data.train.p);
  const int64_t held = std::max<int64_t>(1, std::llround(fraction * static_cast<double>(sh.rows)));
  if (held >= sh.rows)
    return out.fail(kBadInput, "--valid-fraction " + std::to_string(fraction) + ": holding out " +
                                   std::to_string(held) + " of " + data.train_source + "'s " +
                                   std::to_string(sh.rows) + " rows leaves none to train on");
  DatasetHandle rest, valid;
  if (pooch_status st = pooch_dataset_split(data.train.p, held, f.seed, &rest.p, &valid.p))
    return out.fail(st, "--valid-fraction");
  std::swap(data.train.p, rest.p);  // `rest` frees the whole set
  std::swap(data.valid.p, valid.p);
  say("validation: %lld of %lld training rows held out (--valid-fraction %g) for "
      "reduce-on-plateau and early stopping\n",
      static_cast<long long>(held), static_cast<long long>(sh.rows), fraction);
  out.result()["valid"] = {{"rows", held}, {"fraction", fraction}};
  return kOk;
}

int run_training(pooch_model* model, bool resume, const Data& data, const TrainFlags& flags,
                 const DeviceFlags& dev, bool save, Output& out,
                 const std::function<int(pooch_session*)>& trained) {
  TrainFlags f = flags;
  f.resolve(false);  // finetune and demo: the general defaults
  Json& res = out.result();
  if (int rc = check_data_fits(model, data.train.p, data.train_source, true, out)) return rc;
  if (int rc = check_data_fits(model, data.test.p, data.test_source, false, out)) return rc;
  if (int rc = fit_max_nnz(model, {data.train.p, data.test.p}, out)) return rc;
  if (int rc = fit_max_labels(model, {data.train.p}, out)) return rc;

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  std::string err;
  if (!apply_device_flags(dev, &sp, &err)) return out.fail(kUsage, err);
  apply_optimizer_flags(f, f.optimizer, &sp);
  sp.resume = resume ? 1 : 0;

  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = f.epochs;
  tp.warmup_steps = f.warmup_steps;
  tp.lr_schedule = f.lr_schedule == "cosine" ? POOCH_LR_COSINE : POOCH_LR_PLATEAU;
  tp.min_lr_ratio = static_cast<float>(f.lr_min_ratio);
  tp.rewire_every = f.rewire_every;
  tp.rewire_fraction = static_cast<float>(f.rewire_fraction);
  tp.plateau_factor = f.plateau_factor;
  tp.plateau_patience = f.plateau_patience;
  tp.early_stop_patience = f.early_stop;
  tp.data_seed = f.seed;
  tp.allow_other_data = f.force ? 1 : 0;
  if (int rc = propensity(f, data.name, &tp.psp_a, &tp.psp_b, out)) return rc;
  const std::string ckpt =
      !save ? std::string() : (!f.checkpoint.empty() ? f.checkpoint : f.out + ".ckpt");
  tp.checkpoint_path = ckpt.empty() ? nullptr : ckpt.c_str();

  LogFile log_file;
  if (!f.log_file)
    if (int rc = open_log(f.log, resume, log_file, out)) return rc;
  FILE* log = f.log_file ? f.log_file : log_file.f;

  ModelHandle best_model;  // before s: a session made from it must go first
  SessionHandle s;
  if (pooch_status st = pooch_session_create(model, &sp, &s.p)) return out.fail(st, "session");
  print_memory(s.p, out);

  if (const char* spec = pooch_model_spec_json(model))
    res["model_spec"] = Json::parse(spec, nullptr, false);
  res["propensity"] = {tidy(tp.psp_a), tidy(tp.psp_b)};
  res["optimizer"] = {{"kind", f.optimizer}, {"lr", tidy(f.lr)}, {"epochs", f.epochs}};
  if (f.optimizer != "sgd") res["optimizer"]["eps"] = tidy(f.adam_eps);

  Progress progress(isatty(STDOUT_FILENO) != 0 && !lines_prefixed(), f.epochs);
  RunState state;
  state.progress = &progress;
  state.log = log;
  state.member = f.member;
  state.max_steps = f.max_steps;
  tp.on_step = run_on_step;
  tp.on_epoch = on_epoch;
  tp.user = &state;

  const pooch_dataset* epoch_eval =
      data.valid.p ? data.valid.p
                   : (f.eval_each_epoch || f.evaluation_decides() ? data.test.p : nullptr);

  // With early stopping on evaluated epochs, each new best epoch is written
  // to --out as it is reached, and the model written is that epoch's: the
  // epochs after it only waited for an improvement that did not come. An
  // ensemble member (no --out of its own: `trained` merges it) keeps its
  // best epoch in a temporary file instead, so what is merged is that
  // epoch's too.
  TemporaryFile member_best;
  if (!save && trained && f.early_stop > 0 && epoch_eval != nullptr)
    if (int rc = member_best.create("pooch-best-epoch", out)) return rc;
  const std::string best_path = save ? f.out : member_best.path;
  const bool keep_best = !best_path.empty() && f.early_stop > 0 && epoch_eval != nullptr;
  int best_epoch = 0, last_epoch = 0;  // best_epoch: the epoch --out holds (0: none yet)
  pooch_status best_status = POOCH_OK;
  std::string best_error;
  if (keep_best)
    state.after_epoch = [&](const pooch_epoch_report& rep) {
      last_epoch = rep.epoch;
      if (!rep.improved || best_status != POOCH_OK) return;
      best_status = pooch_session_save(s.p, best_path.c_str());
      if (best_status == POOCH_OK)
        best_epoch = rep.epoch;
      else
        best_error = pooch_last_error();
    };

  const auto t0 = std::chrono::steady_clock::now();
  pooch_status st;
  {
    SigintGuard guard;
    st = pooch_train(s.p, data.train.p, epoch_eval, &tp);
  }
  progress.clear();
  const double secs = seconds_since(t0);
  res["epochs"] = state.epochs;
  res["steps"] = state.steps;
  res["seconds"] = secs;
  if (!state.epochs.empty() && state.epochs.back().contains("eval") && epoch_eval == data.test.p)
    res["final"] = state.epochs.back()["eval"];

  if (st == POOCH_ERR_CANCELLED) {
    const bool by_signal = !state.stopped_by_max;
    res["interrupted"] = true;
    say("%s at step %lld (epoch %d, batch %lld of %lld) after %.1f s\n",
        by_signal ? "interrupted" : "stopped (--max-steps)",
        static_cast<long long>(state.last_step), state.last_epoch,
        static_cast<long long>(state.last_batch), static_cast<long long>(state.batches), secs);
    if (!ckpt.empty()) {
      res["checkpoint"] = ckpt;
      say("checkpoint written to %s\nresume with: %s\n", ckpt.c_str(),
          resume_command(ckpt).c_str());
      res["resume_command"] = resume_command(ckpt);
    }
    return by_signal ? kInterrupted : kOk;
  }
  if (st != POOCH_OK)
    return out.fail(st, resume ? "training on " + data.train_source : std::string("training"));
  res["interrupted"] = false;
  say("trained %lld steps in %.1f s\n", static_cast<long long>(state.steps), secs);
  if (best_status != POOCH_OK)
    return out.fail(exit_code(best_status),
                    "saving the best epoch to " + best_path + ": " + best_error);
  // An earlier epoch was the best: --out (or the member's file) holds it,
  // and it is what the test set judges and a member merges (a session of its
  // own, made once this one is gone).
  const bool earlier_best = keep_best && best_epoch > 0 && best_epoch != last_epoch;
  if (earlier_best) {
    pooch_session_free(&s.p);
    if (pooch_status st2 = pooch_model_load(best_path.c_str(), &best_model.p))
      return out.fail(st2, "loading the best epoch from " + best_path);
    if (pooch_status st2 = pooch_session_create(best_model.p, &sp, &s.p))
      return out.fail(st2, "session");
    if (epoch_eval == data.test.p)
      for (const Json& e : state.epochs)
        if (e.value("epoch", 0) == best_epoch && e.contains("eval")) res["final"] = e["eval"];
  }
  if (data.test.p && epoch_eval != data.test.p) {  // the epochs did not see it: once, now
    pooch_metrics m{};
    if (pooch_status st2 = pooch_evaluate(s.p, data.test.p, data.train.p, tp.psp_a, tp.psp_b, &m))
      return out.fail(st2, "evaluating on " + data.test_source);
    if (earlier_best)
      say("test (%s), the weights of epoch %d:\n", data.test_source.c_str(), best_epoch);
    else
      say("test (%s), after the last epoch:\n", data.test_source.c_str());
    print_metrics_table(m);
    res["final"] = metrics_json(m);
  }
  if (keep_best)
    res[save ? "written_epoch" : "kept_epoch"] = earlier_best ? best_epoch : last_epoch;
  if (trained)
    if (int rc = trained(s.p)) return rc;
  if (save) {
    if (earlier_best) {
      say("model written to %s: the weights of epoch %d, whose validation score was the best "
          "(the %d epochs after it did not improve on it; checkpoint of the last: %s)\n",
          f.out.c_str(), best_epoch, last_epoch - best_epoch, ckpt.c_str());
    } else {
      if (pooch_status st2 = pooch_session_save(s.p, f.out.c_str()))
        return out.fail(st2, "saving " + f.out);
      say("model written to %s (checkpoint: %s)\n", f.out.c_str(), ckpt.c_str());
    }
    res["out"] = f.out;
    res["checkpoint"] = ckpt;
  }
  return kOk;
}

}  // namespace cli
