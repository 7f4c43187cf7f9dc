// What train, finetune and demo share: the model flags (or --spec), the
// training flags, and the run itself (session, pooch_train with progress,
// the JSONL log, Ctrl-C, the checkpoint, the final model).
#pragma once
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "cli_common.h"
#include "data_args.h"
#include "progress.h"

namespace cli {

// Flags left at kAuto take the defaults of the model family they build: for
// bag-of-words data what tuning on the Debtags validation split chose
// (docs/BENCHMARKS.md, "Accuracy on Debtags": kBowHidden, kBowDropout, and the
// output layer by the data's size), for dense rows (mlp) hidden 256 and no
// dropout.
struct ModelFlags {
  static constexpr int64_t kAuto = -1;
  std::string spec;  // --spec model.json
  // The spec's text when it was read already (a pipe reads once); else read from `spec`.
  std::string spec_text;
  int64_t hidden = kAuto;
  int64_t bottleneck = 0;
  int64_t fan_in = kAuto;     // kAuto: a dense head where it is small, else 32
  std::string skip = "auto";  // linear input -> labels path: auto, on, off
  std::string loss = "bce";
  double dropout = kAuto;

  int64_t hidden_or(int64_t fallback) const { return hidden == kAuto ? fallback : hidden; }
  double dropout_or(double fallback) const { return dropout < 0 ? fallback : dropout; }
};
inline constexpr int64_t kBowHidden = 512;
inline constexpr double kBowDropout = 0.3;
inline constexpr int64_t kBowBatch = 32;  // rows per step of a model from flags
// The bag-of-words training defaults (TrainFlags::resolve, cmd_train.cpp):
// SGD with momentum 0.9, which beat Adam on the Debtags validation rows (P@1
// 85.48 against 84.25, docs/BENCHMARKS.md, "Round 4"); with --optimizer adam
// or adamw, Adam's own tuned rate and epochs. Two members, not three: three
// were ahead by 0.2 P@1 on those rows, at 1.5 times the training time
// ("Round 5").
inline constexpr int kBowEnsemble = 2;    // members of pooch-run train's ensemble
inline constexpr int kBowEpochs = 10;     // over which the cosine schedule decays (SGD)
inline constexpr float kBowLr = 0.15f;    // the cosine schedule's peak (SGD)
inline constexpr int kBowAdamEpochs = 6;  // the same for Adam
inline constexpr float kBowAdamLr = 2e-3f;
// Below this many input x label weights (2^26: 256 MiB of f32, three times
// that with Adam's moments) a set gets a dense output layer when the flags
// leave it to auto; above it, a fixed fan-in head of 32 inputs per label.
inline constexpr int64_t kAutoDenseWeights = int64_t{1} << 26;
// Whether a set of this shape is one kAutoDenseWeights gives a fixed fan-in
// head: the large label spaces.
bool auto_fan_in_head(int64_t features, int64_t labels);
// Adam's epsilon for training on those large label spaces.
// With BCE every absent label's logit gets a gradient of about 1/(labels x
// batch) at every step; against Adam's usual 1e-8 that tiny but steady pull
// is normalised into full-size steps, so every label's bias and weights
// slide down and the rare positives cannot hold them up (on the full-size
// Amazon-670K shape the loss rose for a whole epoch). An epsilon well above
// those gradients lets only the positives' gradients take Adam's
// normalised steps (docs/BENCHMARKS.md, "Adam's epsilon on large label
// spaces").
inline constexpr float kManyLabelsAdamEps = 1e-4f;
inline constexpr float kAdamEps = 1e-8f;  // everywhere else (Adam's own default)
void add_model_flags(CLI::App* app, ModelFlags& f);

// Flags left at kAuto ("auto") take the defaults of the data they train on
// (resolve): for bag-of-words data what tuning on the Debtags validation split
// chose (kBow*: SGD, a cosine schedule from kBowLr over kBowEpochs, no
// plateau or early stopping), else Adam for 10 epochs at a constant rate of
// 0.001 with reduce-on-plateau and early stopping.
struct TrainFlags {
  static constexpr int kAuto = -1;
  int epochs = kAuto;
  int64_t batch = 0;  // 0: the spec's or model's (64 for a model from flags)
  float lr = kAuto;
  std::string optimizer = "auto";  // auto: resolve's choice
  float weight_decay = 0;
  float clip_norm = kAuto;  // --clip-norm: 1 for gpt models, else 0 (none)
  int64_t warmup_steps = 0;
  std::string lr_schedule = "auto";  // constant or cosine (over the run's steps)
  double lr_min_ratio = kAuto;       // where cosine ends, as a share of --lr
  int ensemble = 0;        // --ensemble: models averaged into one (0: by the model family)
  float adam_eps = kAuto;  // --adam-eps
  int64_t rewire_every = 0;
  double rewire_fraction = 0.1;
  int plateau_patience = kAuto;
  float plateau_factor = 0.5f;
  int early_stop = kAuto;
  uint64_t seed = 1;
  CLI::Option* seed_option = nullptr;  // to tell a given --seed from the default
  std::string propensity;              // "A,B"
  std::string out = "model.pooch";
  std::string checkpoint;  // default <out>.ckpt
  std::string resume;
  bool force = false;  // --force: resume on data other than the checkpoint's
  std::string log;
  int64_t max_steps = 0;  // hidden: stop (as Ctrl-C does) after this many steps of the run
  // Evaluate the test set after every epoch (not a flag: ensemble members
  // clear it, as their per-epoch figures decide nothing unless
  // reduce-on-plateau or early stopping reads them; the test set is then
  // evaluated once, after the last epoch).
  bool eval_each_epoch = true;
  // An ensemble member (not flags): its number from 1 (0: not a member),
  // which tags its --log lines, and the log file the ensemble opened once
  // for all its members (nullptr: the run opens `log` itself).
  int member = 0;
  FILE* log_file = nullptr;
  // Whether reduce-on-plateau or early stopping reads the per-epoch figures.
  bool evaluation_decides() const { return plateau_patience > 0 || early_stop > 0; }

  // Fills in what was left to auto: the bag-of-words defaults (`bow`) or the
  // general ones; the optimizer is SGD on bag-of-words data where
  // `sgd_by_default` (the models tuned on Debtags), else Adam, whose epsilon
  // is kManyLabelsAdamEps for data with `many_labels` (auto_fan_in_head:
  // train and finetune on a large label space). Idempotent; run_training
  // resolves what is left with bow false.
  void resolve(bool bow, bool sgd_by_default = false, bool many_labels = false);
  // The same for a gpt model: a cosine schedule down to 0.1 of --lr and
  // gradients clipped to norm 1 (GPT-2's recipe, as nanoGPT and llm.c), then
  // the general defaults.
  void resolve_gpt();
};
// The resolved optimizer flags (--lr, --adam-eps, --weight-decay,
// --clip-norm) into session parameters; `kind` is adam, adamw or sgd.
void apply_optimizer_flags(const TrainFlags& f, const std::string& kind, pooch_session_params* sp);
// The session parameters of the train step that train would run for a model
// of `family` with these flags (plan, profile: no data to tune by): the
// general defaults resolved (gpt's for gpt models), then the optimizer's.
pooch_session_params train_step_params(TrainFlags& f, const std::string& family);
// --optimizer for plan and profile: the step of adam, adamw or sgd.
void add_step_optimizer_flag(CLI::App* app, TrainFlags& f);
// `with_output`: --out/--checkpoint/--resume/--log (not for demo).
void add_train_flags(CLI::App* app, TrainFlags& f, bool with_output);

// A model from --spec (input width, labels and kind filled in from the data
// when the file leaves them out) or from the flags. Exit code.
// `data_source` names the data for messages about sizes taken from it.
int make_model(const ModelFlags& mf, const TrainFlags& tf, const pooch_dataset* train,
               const pooch_dataset* test, ModelHandle& model, Output& out,
               const std::string& data_source = "the data");

// The spec's input width and labels (from pooch_model_spec_json).
struct SpecShape {
  int64_t width = 0, labels = 0;
  bool dense = false;
};
SpecShape spec_shape(const pooch_model* m);

// Raises the model's max_nnz (nonzeros a batch may hold) to what the
// fullest `batch` rows of each data set need (rows are shuffled, so any rows
// can meet in a batch). Exit code.
int fit_max_nnz(pooch_model* m, std::initializer_list<const pooch_dataset*> sets, Output& out);

// Checks that the data fits the model (exit 2 with both shapes otherwise).
int check_data_fits(const pooch_model* m, const pooch_dataset* ds, const std::string& source,
                    bool training, Output& out);

// Propensity A,B: from --propensity or the data set's name.
int propensity(const TrainFlags& f, const std::string& data_name, float* a, float* b, Output& out);

// Reduce-on-plateau and early stopping (f, resolved) decide on rows held out
// of the training set: `fraction` of them, drawn by f.seed (a resumed run
// holds out the same rows), moved from data.train to data.valid; never on
// the test set. Without either, nothing is held out and the test set is
// evaluated after each epoch as a report. Exit code.
int hold_out_validation(const TrainFlags& f, double fraction, Data& data, Output& out);
// What the step and epoch callbacks of a pooch-run training run keep
// (tp.user points at it): the progress line, the --log file, the steps of
// this run (the hidden --max-steps stops it as Ctrl-C does), where it
// stopped, and the epochs' JSON.
struct RunState {
  Progress* progress = nullptr;
  FILE* log = nullptr;
  int64_t steps = 0;  // of this run
  int64_t max_steps = 0;
  bool stopped_by_max = false;
  int64_t last_step = 0;
  int last_epoch = 0;
  int64_t last_batch = 0, batches = 0;
  int member = 0;  // an ensemble member's number: its --log lines say it
  Json epochs = Json::array();
  // When the last step ended (the first: when the run began): a --log step
  // line's "seconds" is the wall time from it, what a step costs as seen
  // from the host (the loss is read back, so the device has finished it).
  std::chrono::steady_clock::time_point last_step_end = std::chrono::steady_clock::now();
  // After each epoch's report (empty: nothing): run_training's keep-best.
  std::function<void(const pooch_epoch_report&)> after_epoch;
};
// pooch_train_params.on_step for a RunState: progress, a --log line, and
// stop on Ctrl-C or the step cap.
int run_on_step(void* user, int64_t step, float loss, int epoch, int64_t batch, int64_t batches);
// One JSON line to the --log file (none: nothing).
void log_line(FILE* log, const Json& j);

// A spec file's text (at most 16 MiB); false when it cannot be read or is larger.
bool read_spec_file(const std::string& path, std::string* text);

// A spec's family in lower case: "xmc" when it names none, "" when the text
// is not a JSON object.
std::string spec_family(const std::string& spec_text);

// A model from a spec that is complete as it is (gpt, mlp, resnet, vgg: no
// data set gives it a width or a label count), after `fill` (may be empty)
// and with --batch and --seed applied. Exit code.
int make_complete_model(const std::string& spec_text, const std::string& spec_path,
                        const TrainFlags& tf, ModelHandle& model, Output& out,
                        const std::function<void(Json&)>& fill = {});

// The command line as typed without --resume and --max-steps, then
// "--resume CKPT": what continues an interrupted run.
std::string resume_command(const std::string& ckpt);

// Trains `model` (from a checkpoint with resume set: continues it). Saves the
// final model to f.out unless `save` is false (then no checkpoint either).
// `trained`, if set, sees the session once training has finished (an exit
// code: not kOk stops there). Exit code.
int run_training(pooch_model* model, bool resume, const Data& data, const TrainFlags& f,
                 const DeviceFlags& dev, bool save, Output& out,
                 const std::function<int(pooch_session*)>& trained = {});

}  // namespace cli
