// train, eval and predict for dense models, over the tensor-level C API.
#include "dense.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "npy.h"
#include "progress.h"
#include "sigint.h"

namespace cli {

namespace {

// The mlp family's tensors (docs/CLI.md, "Dense models").
constexpr const char* kX = "batch.x";
constexpr const char* kY = "batch.y";
constexpr const char* kClass = "batch.class";
constexpr const char* kPrediction = "prediction";
constexpr const char* kLoss = "loss";

// Where a model's dense inputs and outputs are. The names point into the
// model: valid until it is freed or changed (pooch_model_set_run_shape).
struct DenseIo {
  bool x = false, y = false, cls = false, prediction = false, loss = false;
  int64_t rows = 0;     // planned rows per run (batch.x's batch dimension)
  int64_t width = 0;    // batch.x's row width
  int64_t outputs = 0;  // prediction's row width
  size_t prediction_bytes = 0;
};

int64_t row_elements(const pooch_tensor_info& t) {
  int64_t n = 1;
  for (int d = 1; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

DenseIo dense_io(const pooch_model* m) {
  DenseIo io;
  pooch_tensor_info t;
  for (int i = 0; i < pooch_model_input_count(m); ++i) {
    if (pooch_model_input_info(m, i, &t) != POOCH_OK) continue;
    const std::string name = t.name;
    if (name == kX && t.dtype == POOCH_DTYPE_F32 && t.max_rows > 0) {
      io.x = true;
      io.rows = t.max_rows;
      io.width = row_elements(t);
    } else if (name == kY && t.dtype == POOCH_DTYPE_F32) {
      io.y = true;
    } else if (name == kClass && t.dtype == POOCH_DTYPE_I32) {
      io.cls = true;
    }
  }
  for (int i = 0; i < pooch_model_output_count(m); ++i) {
    if (pooch_model_output_info(m, i, &t) != POOCH_OK) continue;
    const std::string name = t.name;
    if (name == kPrediction && t.dtype == POOCH_DTYPE_F32 && t.max_rows > 0) {
      io.prediction = true;
      io.outputs = row_elements(t);
      io.prediction_bytes = t.bytes;
    } else if (name == kLoss) {
      io.loss = true;
    }
  }
  return io;
}

// Exit 2 unless X is as wide as the model's batch.x.
int check_width(const DenseIo& io, const DenseData& d, const std::string& model_name, Output& out) {
  if (d.width == io.width) return kOk;
  return out.fail(kBadInput, "data: " + d.x_path + " has " + std::to_string(d.width) +
                                 " features, but " + model_name + " takes " +
                                 std::to_string(io.width));
}

// Exit 2 unless Y fits the model: float targets as wide as its outputs for
// a regression model, class ids below its outputs for a classifier.
int check_targets(const DenseIo& io, const DenseData& d, const std::string& model_name,
                  Output& out) {
  if (d.classes && !io.cls)
    return out.fail(kBadInput, "--targets: " + d.y_path + " holds class ids, but " + model_name +
                                   " is a regression model (it takes float targets; a " +
                                   "classifier has \"loss\": \"softmax\")");
  if (!d.classes && !io.y)
    return out.fail(kBadInput, "--targets: " + d.y_path + " holds float targets, but " +
                                   model_name + " is a classifier (it takes integer class ids)");
  if (!d.classes && d.outputs != io.outputs)
    return out.fail(kBadInput, "--targets: " + d.y_path + " has " + std::to_string(d.outputs) +
                                   " outputs per row, but " + model_name + " predicts " +
                                   std::to_string(io.outputs));
  if (d.classes && d.outputs > io.outputs) {
    const auto at =
        std::find_if(d.cls.begin(), d.cls.end(), [&](int32_t c) { return c >= io.outputs; }) -
        d.cls.begin();
    return out.fail(kBadInput, "--targets: " + d.y_path + ": row " + std::to_string(at) +
                                   " holds the class id " + std::to_string(d.cls[size_t(at)]) +
                                   ", but " + model_name + " has " + std::to_string(io.outputs) +
                                   " classes");
  }
  return kOk;
}

// Runs batches of rows of a dense data set through a session. A batch is
// prepared on the host (rows copied, training images augmented) into one of
// two buffers; prefetch() prepares the next batch on a thread of its own
// while the session runs the current one, so augmentation overlaps the step.
// The draws depend on (seed, epoch, row) alone: a prefetched batch holds the
// same bits as one staged in place.
class Batches {
 public:
  Batches(pooch_session* s, const DenseData& d, const DenseIo& io) : s_(s), d_(d), io_(io) {
    for (Host& b : buf_) {
      b.x.resize(static_cast<size_t>(io.rows * io.width));
      if (d.has_y && d.classes)
        b.c.resize(static_cast<size_t>(io.rows));
      else if (d.has_y)
        b.y.resize(static_cast<size_t>(io.rows * d.outputs));
    }
    if (io.prediction) p_.resize(io.prediction_bytes / sizeof(float));
  }
  ~Batches() { drop_prefetch(); }
  Batches(const Batches&) = delete;
  Batches& operator=(const Batches&) = delete;

  // Sets the inputs to rows idx[0..n) (n <= the planned rows), with their
  // targets when `targets`. Returns the status of the first failing call.
  pooch_status stage(const int64_t* idx, int64_t n, bool targets) {
    drop_prefetch();
    const auto t0 = std::chrono::steady_clock::now();
    fill(buf_[cur_], idx, n, targets);
    wait_seconds_ += seconds_since(t0);  // nothing hid this preparation
    return submit(buf_[cur_], n, targets);
  }

  // Starts preparing rows idx[0..n) in the other buffer on a thread; the
  // next stage_prefetched() sets them. `idx` must stay valid until then.
  void prefetch(const int64_t* idx, int64_t n, bool targets) {
    drop_prefetch();
    Host& b = buf_[1 - cur_];
    pending_ = std::thread([this, &b, idx, n, targets] { fill(b, idx, n, targets); });
    pending_n_ = n;
    pending_targets_ = targets;
  }
  bool prefetched() const { return pending_.joinable(); }

  // Waits for the prefetched batch and sets it as the inputs.
  pooch_status stage_prefetched() {
    const auto t0 = std::chrono::steady_clock::now();
    pending_.join();
    wait_seconds_ += seconds_since(t0);
    cur_ = 1 - cur_;
    return submit(buf_[cur_], pending_n_, pending_targets_);
  }

  // Training images staged from now on are augmented with the draws of
  // (seed, epoch, row); epoch 0 stages them as they are (evaluation).
  void set_augment(const Augment& a, uint64_t seed, uint64_t epoch) {
    drop_prefetch();  // a pending batch was drawn with the old settings
    augment_ = a;
    seed_ = seed;
    epoch_ = d_.image.c && a.enabled() ? epoch : 0;
  }

  // Runs `program` on the staged rows; *loss gets the batch's mean loss.
  pooch_status run(pooch_program program, float* loss) {
    if (pooch_status st = pooch_session_run(s_, program)) return st;
    return pooch_session_get_output(s_, kLoss, loss, sizeof *loss);
  }

  // The prediction of the last run (all the planned rows).
  pooch_status prediction(const float** p) {
    *p = p_.data();
    return pooch_session_get_output(s_, kPrediction, p_.data(), p_.size() * sizeof(float));
  }

  // Seconds spent preparing batches in all (on either thread), and of them
  // the seconds the caller waited (the part no step hid).
  double prepare_seconds() const { return prepare_seconds_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Host {
    std::vector<float> x, y, scratch;
    std::vector<int32_t> c;
  };

  // Host work alone (no session call): safe on the prefetch thread.
  void fill(Host& b, const int64_t* idx, int64_t n, bool targets) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto w = static_cast<size_t>(io_.width);
    for (int64_t i = 0; i < n; ++i) {
      float* row = b.x.data() + static_cast<size_t>(i) * w;
      std::memcpy(row, d_.x.data() + static_cast<size_t>(idx[i]) * w, w * sizeof(float));
      if (epoch_ > 0)
        augment_image(row, d_.image, augment_, seed_, epoch_, static_cast<uint64_t>(idx[i]),
                      b.scratch);
    }
    if (targets && d_.classes) {
      for (int64_t i = 0; i < n; ++i)
        b.c[static_cast<size_t>(i)] = d_.cls[static_cast<size_t>(idx[i])];
    } else if (targets) {
      const auto o = static_cast<size_t>(d_.outputs);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(b.y.data() + static_cast<size_t>(i) * o,
                    d_.y.data() + static_cast<size_t>(idx[i]) * o, o * sizeof(float));
    }
    prepare_seconds_ += seconds_since(t0);
  }

  pooch_status submit(const Host& b, int64_t n, bool targets) {
    const auto w = static_cast<size_t>(io_.width);
    if (pooch_status st =
            pooch_session_set_input(s_, kX, b.x.data(), static_cast<size_t>(n) * w * sizeof(float)))
      return st;
    if (!targets) return POOCH_OK;
    if (d_.classes)
      return pooch_session_set_input(s_, kClass, b.c.data(),
                                     static_cast<size_t>(n) * sizeof(int32_t));
    const auto o = static_cast<size_t>(d_.outputs);
    return pooch_session_set_input(s_, kY, b.y.data(), static_cast<size_t>(n) * o * sizeof(float));
  }

  void drop_prefetch() {
    if (pending_.joinable()) pending_.join();
  }

  pooch_session* s_;
  const DenseData& d_;
  const DenseIo& io_;
  Host buf_[2];
  int cur_ = 0;  // the buffer the inputs were last set from
  std::thread pending_;
  int64_t pending_n_ = 0;
  bool pending_targets_ = false;
  std::vector<float> p_;
  Augment augment_;
  uint64_t seed_ = 0, epoch_ = 0;
  double prepare_seconds_ = 0, wait_seconds_ = 0;
};

struct EvalResult {
  int64_t rows = 0;
  double loss = 0;      // mean over rows
  double accuracy = 0;  // classification: the fraction of rows whose best score is their class
  double top5 = 0;      // ... whose class is among the five best scores (ties: lower ids first)
};

Json eval_json(const EvalResult& e, bool classes) {
  Json j;
  j["rows"] = e.rows;
  j["loss"] = e.loss;
  if (classes) j["accuracy"] = e.accuracy;
  if (classes) j["top5"] = e.top5;
  return j;
}

std::string eval_str(const EvalResult& e, bool classes) {
  char buf[96];
  if (classes)
    std::snprintf(buf, sizeof buf, "loss %.5f  accuracy %.2f%%  top-5 %.2f%%", e.loss,
                  100 * e.accuracy, 100 * e.top5);
  else
    std::snprintf(buf, sizeof buf, "loss %.5f", e.loss);
  return buf;
}

// The mean loss (and accuracy) over rows idx[0..n) with POOCH_PROGRAM_EVALUATE.
pooch_status evaluate(Batches& b, const DenseData& d, const DenseIo& io,
                      const std::vector<int64_t>& idx, EvalResult* r) {
  double loss_sum = 0;
  int64_t right = 0, right5 = 0;
  const auto n = static_cast<int64_t>(idx.size());
  for (int64_t first = 0; first < n; first += io.rows) {
    const int64_t rows = std::min(io.rows, n - first);
    float loss = 0;
    if (pooch_status st = b.stage(idx.data() + first, rows, true)) return st;
    if (pooch_status st = b.run(POOCH_PROGRAM_EVALUATE, &loss)) return st;
    loss_sum += static_cast<double>(loss) * static_cast<double>(rows);
    if (d.classes) {
      const float* p = nullptr;
      if (pooch_status st = b.prediction(&p)) return st;
      const auto o = static_cast<size_t>(io.outputs);
      for (int64_t i = 0; i < rows; ++i) {
        const float* row = p + static_cast<size_t>(i) * o;
        const auto best = std::max_element(row, row + o) - row;
        const int32_t c = d.cls[static_cast<size_t>(idx[static_cast<size_t>(first + i)])];
        right += best == c;
        // The class's rank: the scores above it, and the equal ones of lower ids.
        int64_t above = 0;
        for (size_t k = 0; k < o; ++k)
          above += row[k] > row[c] || (row[k] == row[c] && static_cast<int64_t>(k) < c);
        right5 += above < 5;
      }
    }
  }
  r->rows = n;
  r->loss = n ? loss_sum / static_cast<double>(n) : 0;
  r->accuracy = n ? static_cast<double>(right) / static_cast<double>(n) : 0;
  r->top5 = n ? static_cast<double>(right5) / static_cast<double>(n) : 0;
  return POOCH_OK;
}

bool read_text(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

// Prepares an image set as the model's images were: normalised with the
// per-channel statistics its spec records (nothing for other data).
void prepare_images(const pooch_model* model, DenseData& d) {
  if (!d.image.c) return;
  const Json j = Json::parse(pooch_model_spec_json(model), nullptr, false);
  if (!j.is_object() || !j.contains("normalize")) return;
  const std::vector<double> mean = j["normalize"]["mean"].get<std::vector<double>>();
  const std::vector<double> sd = j["normalize"]["std"].get<std::vector<double>>();
  if (static_cast<int64_t>(mean.size()) == d.image.c) normalize_images(d.x, d.image, mean, sd);
}

// Fisher-Yates over a standard engine: the same order on every platform
// (std::shuffle's algorithm is the library's own).
void shuffle(std::vector<int64_t>& v, std::mt19937_64& gen) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[gen() % i]);
}

// A convolutional spec completed from an image set: the input's shape, the
// classes, the run shape and the per-channel statistics of --data (the
// training file: the test set is never read for them).
int fill_image_spec(Json& j, const ModelFlags& mf, const TrainFlags& tf, const DenseData& d,
                    Output& out) {
  if (!d.image.c)
    return out.fail(kBadInput, "--spec: " + mf.spec + " is a " + j["family"].get<std::string>() +
                                   " model; its --data must be images (uint8 N×H×W×C or "
                                   "float32 N×C×H×W), not " +
                                   d.x_path + "'s 2-D rows");
  if (!d.classes)
    return out.fail(kBadInput, "--targets: " + d.y_path + " holds float targets; a " +
                                   j["family"].get<std::string>() +
                                   " model classifies (integer class ids)");
  if (!j.contains("input")) j["input"] = Json::object();
  if (j["input"].is_object()) {
    if (!j["input"].contains("channels")) j["input"]["channels"] = d.image.c;
    if (!j["input"].contains("height")) j["input"]["height"] = d.image.h;
    if (!j["input"].contains("width")) j["input"]["width"] = d.image.w;
  }
  if (!j.contains("classes")) j["classes"] = d.outputs;
  if (tf.batch > 0) j["batch"] = tf.batch;
  if (tf.seed_option && tf.seed_option->count() > 0) j["seed"] = tf.seed;
  if (!j.contains("normalize")) {
    std::vector<double> mean, sd;
    channel_stats(d.x, d.image, &mean, &sd);
    j["normalize"] = {{"mean", mean}, {"std", sd}};
  }
  return kOk;
}

// The model of a dense training run: --spec (family, input, outputs and loss
// filled in from the data when the file leaves them out) or the model flags
// (linear(hidden, relu) [-> linear(bottleneck, relu)] [-> dropout] -> dense).
int make_dense_model(const ModelFlags& mf, const TrainFlags& tf, const DenseData& d,
                     ModelHandle& model, Output& out) {
  std::string text, source;
  const char* loss = d.classes ? "softmax" : "mse";
  if (!mf.spec.empty()) {
    source = mf.spec;
    if (!read_text(mf.spec, &text))
      return out.fail(kBadInput, "--spec: cannot read '" + mf.spec + "'");
    Json j = Json::parse(text, nullptr, false);
    if (j.is_object()) {  // else the library reports what is wrong with it
      if (!j.contains("family")) j["family"] = "mlp";
      if (j["family"] == "resnet" || j["family"] == "vgg") {
        if (int rc = fill_image_spec(j, mf, tf, d, out)) return rc;
        text = j.dump();
        if (pooch_status st = pooch_model_create_from_spec(text.c_str(), source.c_str(), &model.p))
          return out.fail(st, "model");
        return kOk;
      }
      if (j["family"] != "mlp")
        return out.fail(kBadInput, "--spec: " + mf.spec + " is a " + j["family"].dump() +
                                       " model; dense data (--targets) trains an mlp model " +
                                       "(\"family\": \"mlp\")");
      if (!j.contains("input")) j["input"] = Json::object();
      if (j["input"].is_object()) {
        if (!j["input"].contains("kind")) j["input"]["kind"] = "dense";
        if (!j["input"].contains("width")) j["input"]["width"] = d.width;
      }
      if (!j.contains("outputs")) j["outputs"] = d.outputs;
      if (!j.contains("loss")) j["loss"] = loss;
      if (tf.batch > 0) j["batch"] = tf.batch;
      if (tf.seed_option && tf.seed_option->count() > 0) j["seed"] = tf.seed;
      text = j.dump();
    }
  } else {
    source = "model flags";
    Json layers = Json::array();
    layers.push_back({{"type", "linear"}, {"width", mf.hidden_or(256)}, {"activation", "relu"}});
    if (mf.bottleneck > 0)
      layers.push_back({{"type", "linear"}, {"width", mf.bottleneck}, {"activation", "relu"}});
    if (mf.dropout_or(0) > 0) layers.push_back({{"type", "dropout"}, {"p", mf.dropout_or(0)}});
    layers.push_back({{"type", "dense"}});
    Json j;
    j["family"] = "mlp";
    j["input"] = {{"kind", "dense"}, {"width", d.width}};
    j["outputs"] = d.outputs;
    j["layers"] = layers;
    j["loss"] = loss;
    j["batch"] = tf.batch > 0 ? tf.batch : 64;
    j["seed"] = tf.seed;
    text = j.dump();
  }
  if (pooch_status st = pooch_model_create_from_spec(text.c_str(), source.c_str(), &model.p))
    return out.fail(st, "model");
  return kOk;
}

// Exit 1 for a flag of XMC training given with dense data.
int refuse_xmc_flags(const CLI::App* app, Output& out) {
  if (!app) return kOk;
  for (const char* flag :
       {"--train", "--test", "--train-features", "--train-labels", "--test-features",
        "--test-labels", "--fan-in", "--loss", "--warmup-steps", "--plateau-patience",
        "--plateau-factor", "--propensity", "--checkpoint", "--resume", "--rewire-every",
        "--rewire-fraction"}) {
    const CLI::Option* o = app->get_option_no_throw(flag);
    if (!o || o->count() == 0) continue;
    std::string why = "applies to XMC models, not to dense data (--data X.npy --targets Y.npy)";
    if (std::strcmp(flag, "--loss") == 0)
      why =
          "a dense model's loss follows the targets (mse for floats, softmax for class ids); "
          "a --spec may set it";
    else if (std::strcmp(flag, "--checkpoint") == 0 || std::strcmp(flag, "--resume") == 0)
      why =
          "dense models are trained without checkpoints (an interrupted run writes the model "
          "so far to --out)";
    return out.fail(kUsage, std::string(flag) + ": " + why);
  }
  return kOk;
}

Json data_json(const DenseData& d) {
  Json j;
  j["path"] = d.x_path;
  j["rows"] = d.rows;
  j["features"] = d.width;
  if (d.has_y) {
    j["targets"] = d.y_path;
    j[d.classes ? "classes" : "outputs"] = d.outputs;
  }
  return j;
}

}  // namespace

void add_dense_train_flags(CLI::App* app, DenseTrainFlags& f) {
  app->add_option("--targets", f.targets,
                  "Targets of the dense rows of --data X.npy: floats [rows, outputs] (mse) or "
                  "integer class ids [rows] (softmax); trains an mlp model")
      ->type_name("Y.npy")
      ->group("Dense data");
  app->add_option("--crop-pad", f.augment.pad,
                  "Image sets: random crops of each training image padded by this many zero "
                  "pixels (0: none), drawn from --seed, the epoch and the row")
      ->check(in_range(0, 1 << 16, true))
      ->group("Dense data");
  app->add_flag("--flip", f.augment.flip,
                "Image sets: flip each training image horizontally with probability 1/2")
      ->group("Dense data");
  app->add_flag("--no-prefetch", f.no_prefetch,
                "Image sets: prepare each training batch just before its step, not during the "
                "step before (the same bits either way)")
      ->group("Dense data");
  app->add_option("--valid-fraction", f.valid_fraction,
                  "The fraction of training rows held out and evaluated after each epoch (dense "
                  "data; bag-of-words data: only when --plateau-patience or --early-stop is on, "
                  "which then decide on these rows, never on the --test set)")
      ->check(in_range(0.0, 0.9, false))
      ->capture_default_str()
      ->group("Dense data");
}

bool is_npy_path(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
}

bool is_dense_model(const pooch_model* model) {
  return std::strcmp(pooch_model_family(model), "xmc") != 0 && dense_io(model).x;
}

namespace {

// Trains `model` on `d` (a new model or one being finetuned) and saves it
// to tf.out: the held-out split, the epochs, the log. Exit code.
int train_dense(ModelHandle& model, DenseData& d, const DenseTrainFlags& df, const TrainFlags& tf,
                const DeviceFlags& dev, const std::string& name, Output& out) {
  Json& res = out.result();
  prepare_images(model.p, d);
  const DenseIo io = dense_io(model.p);
  if (!io.x || !io.prediction || !io.loss)
    return out.fail(kBadInput, std::string("model: a ") + pooch_model_family(model.p) +
                                   " model without batch.x, prediction and loss cannot train "
                                   "on dense rows");
  if (int rc = check_width(io, d, name, out)) return rc;
  if (int rc = check_targets(io, d, name, out)) return rc;

  // The held-out rows: a seeded draw, the same for the same --seed.
  std::mt19937_64 gen(tf.seed);
  std::vector<int64_t> order(static_cast<size_t>(d.rows));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  shuffle(order, gen);
  int64_t n_valid = 0;
  if (df.valid_fraction > 0)
    n_valid = std::max<int64_t>(1, std::llround(df.valid_fraction * static_cast<double>(d.rows)));
  if (n_valid >= d.rows)
    return out.fail(kUsage, "--valid-fraction " + std::to_string(df.valid_fraction) + ": holding " +
                                std::to_string(n_valid) + " of " + std::to_string(d.rows) +
                                " rows out leaves none to train on");
  std::vector<int64_t> valid(order.begin(), order.begin() + n_valid);
  std::vector<int64_t> train(order.begin() + n_valid, order.end());
  std::sort(valid.begin(), valid.end());
  std::printf("split: %lld rows to train on, %lld held out (--valid-fraction %g)\n",
              static_cast<long long>(train.size()), static_cast<long long>(valid.size()),
              df.valid_fraction);
  res["valid"] = {{"rows", n_valid}, {"fraction", df.valid_fraction}};

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  std::string err;
  if (!apply_device_flags(dev, &sp, &err)) return out.fail(kUsage, err);
  apply_optimizer_flags(tf, tf.optimizer, &sp);
  sp.resume = 0;

  LogFile log_file;
  if (int rc = open_log(tf.log, false, log_file, out)) return rc;
  FILE* log = log_file.f;

  SessionHandle s;
  if (pooch_status st = pooch_session_create(model.p, &sp, &s.p)) return out.fail(st, "session");
  print_memory(s.p, out);
  if (const char* spec = pooch_model_spec_json(model.p))
    res["model_spec"] = Json::parse(spec, nullptr, false);

  Batches batches(s.p, d, io);
  // Image sets prepare each batch during the step before (a thread's start
  // is noise beside a convolutional step, not beside a small mlp's).
  const bool prefetch = d.image.c && !df.no_prefetch;
  Progress progress(isatty(STDOUT_FILENO) != 0, tf.epochs);
  const int64_t per_epoch = (static_cast<int64_t>(train.size()) + io.rows - 1) / io.rows;
  Json epochs = Json::array();
  int64_t steps = 0;
  double best = INFINITY;
  int since_best = 0;
  // With early stopping on held-out rows, the model written is the epoch
  // whose validation loss was the lowest, as stopping implies (the epochs
  // after it only waited for an improvement that did not come): each new
  // best is written to --out when it is reached, and the last epoch's
  // weights replace it only if they are the best.
  const bool keep_best = tf.early_stop > 0 && !valid.empty();
  int best_epoch = 0;  // the epoch whose weights --out holds (0: none yet)
  Json best_valid;
  bool stopped = false, by_signal = false;
  int last_epoch = 0;
  int64_t last_batch = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_step_end = t0;  // a --log step line's "seconds" is the wall time from it
  {
    SigintGuard guard;
    for (int epoch = 1; epoch <= tf.epochs && !stopped; ++epoch) {
      const auto te = std::chrono::steady_clock::now();
      shuffle(train, gen);
      batches.set_augment(df.augment, tf.seed, static_cast<uint64_t>(epoch));
      double sum = 0;
      int64_t seen = 0, batch = 0;
      for (size_t first = 0; first < train.size(); first += static_cast<size_t>(io.rows)) {
        const int64_t rows = std::min<int64_t>(io.rows, static_cast<int64_t>(train.size() - first));
        // Image models train on full batches only: batch normalisation would
        // count a short batch's padding rows in its statistics. The rows left
        // over take part in later epochs (each epoch reshuffles).
        if (d.image.c && rows < io.rows && first > 0) break;
        float loss = 0;
        if (pooch_status st = batches.prefetched()
                                  ? batches.stage_prefetched()
                                  : batches.stage(train.data() + first, rows, true))
          return out.fail(st, "setting the inputs");
        // The next batch of the epoch is prepared while this step runs.
        const size_t next = first + static_cast<size_t>(io.rows);
        if (prefetch && next < train.size() &&
            (!d.image.c || train.size() - next >= static_cast<size_t>(io.rows)))
          batches.prefetch(train.data() + next,
                           std::min<int64_t>(io.rows, static_cast<int64_t>(train.size() - next)),
                           true);
        if (pooch_status st = batches.run(POOCH_PROGRAM_TRAIN_STEP, &loss))
          return out.fail(st, "training");
        ++steps;
        ++batch;
        sum += static_cast<double>(loss) * static_cast<double>(rows);
        seen += rows;
        progress.step(steps, loss, epoch, batch, per_epoch);
        const auto now = std::chrono::steady_clock::now();
        const double step_seconds = std::chrono::duration<double>(now - last_step_end).count();
        last_step_end = now;
        if (log) {
          Json j;
          j["type"] = "step";
          j["step"] = steps;
          j["epoch"] = epoch;
          j["batch"] = batch;
          j["batches"] = per_epoch;
          j["loss"] = tidy(loss);
          j["seconds"] = step_seconds;
          std::fprintf(log, "%s\n", j.dump().c_str());
        }
        last_epoch = epoch;
        last_batch = batch;
        by_signal = sigint_received();
        if (by_signal || (tf.max_steps > 0 && steps >= tf.max_steps)) {
          stopped = true;
          break;
        }
      }
      if (stopped) break;
      const double train_loss = sum / static_cast<double>(std::max<int64_t>(1, seen));
      EvalResult ev;
      batches.set_augment(df.augment, tf.seed, 0);
      if (!valid.empty())
        if (pooch_status st = evaluate(batches, d, io, valid, &ev))
          return out.fail(st, "evaluating the held-out rows");
      const double score = valid.empty() ? train_loss : ev.loss;
      const bool improved = score < best;
      if (improved) {
        best = score;
        since_best = 0;
        if (keep_best) {
          if (pooch_status st = pooch_session_save(s.p, tf.out.c_str()))
            return out.fail(st, "saving " + tf.out);
          best_epoch = epoch;
          best_valid = eval_json(ev, d.classes);
        }
      } else {
        ++since_best;
      }
      const bool stopping = tf.early_stop > 0 && since_best >= tf.early_stop && epoch < tf.epochs;
      const double secs = seconds_since(te);
      progress.clear();
      const std::string valid_str = valid.empty() ? "" : "  valid " + eval_str(ev, d.classes);
      const std::string stop_str =
          stopping ? "  (stopping: no improvement in " + std::to_string(tf.early_stop) + " epochs)"
                   : "";
      std::printf("epoch %d/%d  loss %.5f%s  %.1f s  lr %g%s\n", epoch, tf.epochs, train_loss,
                  valid_str.c_str(), secs, static_cast<double>(tf.lr), stop_str.c_str());
      std::fflush(stdout);
      Json j;
      j["epoch"] = epoch;
      j["loss"] = train_loss;
      j["seconds"] = secs;
      j["lr"] = tidy(tf.lr);
      j["improved"] = improved;
      j["stopping"] = stopping;
      j["valid"] = valid.empty() ? Json() : eval_json(ev, d.classes);
      epochs.push_back(j);
      if (log) {
        Json l;
        l["type"] = "epoch";
        for (auto& [k, v] : j.items()) l[k] = v;
        std::fprintf(log, "%s\n", l.dump().c_str());
        std::fflush(log);
      }
      if (stopping) break;
    }
  }
  progress.clear();
  const double secs = seconds_since(t0);
  res["epochs"] = epochs;
  res["steps"] = steps;
  res["seconds"] = secs;
  if (!epochs.empty() && !epochs.back()["valid"].is_null()) res["final"] = epochs.back()["valid"];
  res["interrupted"] = stopped;
  res["input"] = {{"prefetch", prefetch},
                  {"prepare_seconds", batches.prepare_seconds()},
                  {"wait_seconds", batches.wait_seconds()}};
  if (stopped)
    std::printf("%s at step %lld (epoch %d, batch %lld of %lld) after %.1f s\n",
                by_signal ? "interrupted" : "stopped (--max-steps)", static_cast<long long>(steps),
                last_epoch, static_cast<long long>(last_batch), static_cast<long long>(per_epoch),
                secs);
  else
    std::printf("trained %lld steps in %.1f s\n", static_cast<long long>(steps), secs);
  // A run stopped within an epoch writes the weights as they are: there is
  // no validation loss to prefer another epoch's by. Otherwise, with
  // keep_best, --out already holds the best epoch's.
  const int last_epoch_done = static_cast<int>(epochs.size());
  if (stopped || !keep_best || best_epoch == 0) {
    if (pooch_status st = pooch_session_save(s.p, tf.out.c_str()))
      return out.fail(st, "saving " + tf.out);
    std::printf(
        "model written to %s%s\n", tf.out.c_str(),
        stopped ? " (as trained so far; dense models have no checkpoint to resume from)" : "");
    res["written_epoch"] = stopped ? Json() : Json(last_epoch_done);
  } else if (best_epoch == last_epoch_done) {
    std::printf("model written to %s\n", tf.out.c_str());
    res["written_epoch"] = best_epoch;
  } else {
    std::printf(
        "model written to %s: the weights of epoch %d, whose validation loss was the lowest "
        "(the %d epochs after it did not improve on it)\n",
        tf.out.c_str(), best_epoch, last_epoch_done - best_epoch);
    res["written_epoch"] = best_epoch;
    res["final"] = best_valid;
  }
  res["out"] = tf.out;
  return by_signal ? kInterrupted : kOk;
}

}  // namespace

int run_dense_train(const std::string& x_path, const DenseTrainFlags& df, const ModelFlags& mf,
                    const TrainFlags& tf, const DeviceFlags& dev, const CLI::App* app,
                    Output& out) {
  if (int rc = refuse_xmc_flags(app, out)) return rc;
  if (x_path.empty()) return out.fail(kUsage, "--targets: give the features with --data X.npy");
  if (int rc = check_output_paths({{"--out", tf.out}, {"--log", tf.log}}, out)) return rc;
  DenseData d;
  if (int rc = load_dense(x_path, "--data", df.targets, "--targets", false, d, out)) return rc;
  out.result()["train"] = data_json(d);
  ModelHandle model;
  if (int rc = make_dense_model(mf, tf, d, model, out)) return rc;
  return train_dense(model, d, df, tf, dev, "the model", out);
}

int run_dense_finetune(const std::string& model_path, int64_t new_head, const std::string& x_path,
                       const DenseTrainFlags& df, const TrainFlags& tf, const DeviceFlags& dev,
                       const CLI::App* app, Output& out) {
  if (int rc = refuse_xmc_flags(app, out)) return rc;
  if (x_path.empty()) return out.fail(kUsage, "--targets: give the features with --data X.npy");
  if (int rc = check_output_paths({{"--out", tf.out}, {"--log", tf.log}}, out)) return rc;
  DenseData d;
  if (int rc = load_dense(x_path, "--data", df.targets, "--targets", false, d, out)) return rc;
  out.result()["train"] = data_json(d);
  ModelHandle model;
  if (pooch_status st = pooch_model_load(model_path.c_str(), &model.p))
    return out.fail(st, "--model " + model_path);
  out.result()["model"] = model_path;
  if (!is_dense_model(model.p))
    return out.fail(kBadInput, "--model: " + model_path + " is a " + pooch_model_family(model.p) +
                                   " model; --data X.npy --targets Y.npy finetunes a model that "
                                   "takes batch.x (mlp, resnet, vgg)");
  const int64_t had = dense_io(model.p).outputs;
  // -1: the data's class count when it differs from the model's; 0: keep.
  int64_t head = new_head;
  if (head < 0) head = d.classes && d.outputs != had ? d.outputs : 0;
  if (head > 0) {
    if (d.classes && head < d.outputs)
      return out.fail(kBadInput, "finetune: --new-head " + std::to_string(head) +
                                     " is fewer classes than --targets " + d.y_path + " has (" +
                                     std::to_string(d.outputs) + ")");
    if (pooch_status st = pooch_model_replace_head(model.p, head))
      return out.fail(st, "replacing the output layer");
    std::printf("new output layer: %lld classes (was %lld); every other weight kept\n",
                static_cast<long long>(head), static_cast<long long>(had));
    out.result()["new_head"] = head;
  }
  if (tf.batch > 0)
    if (pooch_status st = pooch_model_set_run_shape(model.p, tf.batch, 0, 0))
      return out.fail(st, "--batch");
  return train_dense(model, d, df, tf, dev, model_path, out);
}

int run_dense_profile(const std::string& model_path, const ModelFlags& mf, const TrainFlags& tf,
                      const std::string& x_path, const std::string& y_path, const DeviceFlags& dev,
                      Output& out, const std::function<int(pooch_session*)>& profile) {
  if (x_path.empty() || y_path.empty())
    return out.fail(kUsage, "a dense model is profiled on --data X.npy --targets Y.npy");
  DenseData d;
  if (int rc = load_dense(x_path, "--data", y_path, "--targets", false, d, out)) return rc;
  ModelHandle model;
  std::string name = "the model";
  if (!model_path.empty()) {
    if (pooch_status st = pooch_model_load(model_path.c_str(), &model.p))
      return out.fail(st, "--model " + model_path);
    if (tf.batch > 0)
      if (pooch_status st = pooch_model_set_run_shape(model.p, tf.batch, 0, 0))
        return out.fail(st, "--batch");
    name = model_path;
  } else if (int rc = make_dense_model(mf, tf, d, model, out)) {
    return rc;
  }
  prepare_images(model.p, d);
  const DenseIo io = dense_io(model.p);
  if (!io.x || !io.loss)
    return out.fail(kBadInput, name + ": a " + pooch_model_family(model.p) +
                                   " model without batch.x and loss cannot train on dense rows");
  if (int rc = check_width(io, d, name, out)) return rc;
  if (int rc = check_targets(io, d, name, out)) return rc;
  SessionHandle s;
  TrainFlags step = tf;  // the step train would run (--optimizer)
  const pooch_session_params sp = train_step_params(step, pooch_model_family(model.p));
  out.result()["optimizer"] = step.optimizer;
  if (int rc = open_session(model.p, dev, s, out, &sp)) return rc;
  std::vector<int64_t> rows(static_cast<size_t>(std::min(d.rows, io.rows)));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  Batches b(s.p, d, io);
  if (pooch_status st = b.stage(rows.data(), static_cast<int64_t>(rows.size()), true))
    return out.fail(st, "setting the inputs");
  float loss = 0;
  if (pooch_status st = b.run(POOCH_PROGRAM_TRAIN_STEP, &loss)) return out.fail(st, "warm-up step");
  return profile(s.p);
}

int run_dense_eval(pooch_model* model, const std::string& model_path, const std::string& x_path,
                   const std::string& y_path, int64_t batch, const DeviceFlags& dev, Output& out) {
  if (x_path.empty() || y_path.empty())
    return out.fail(kUsage, model_path + " is a dense model: evaluate it with --data X.npy " +
                                "--targets Y.npy");
  DenseData d;
  if (int rc = load_dense(x_path, "--data", y_path, "--targets", false, d, out)) return rc;
  out.result()["model"] = model_path;
  out.result()["test"] = data_json(d);
  if (batch > 0)
    if (pooch_status st = pooch_model_set_run_shape(model, batch, 0, 0))
      return out.fail(st, "--batch");
  const DenseIo io = dense_io(model);
  prepare_images(model, d);
  if (int rc = check_width(io, d, model_path, out)) return rc;
  if (int rc = check_targets(io, d, model_path, out)) return rc;
  SessionHandle s;
  if (int rc = open_session(model, dev, s, out)) return rc;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> all(static_cast<size_t>(d.rows));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  Batches b(s.p, d, io);
  EvalResult ev;
  if (pooch_status st = evaluate(b, d, io, all, &ev)) return out.fail(st, "evaluating");
  const double secs = seconds_since(t0);
  std::printf("%lld rows in %.2f s: %s\n", static_cast<long long>(ev.rows), secs,
              eval_str(ev, d.classes).c_str());
  out.result()["metrics"] = eval_json(ev, d.classes);
  out.result()["seconds"] = secs;
  return kOk;
}

int run_dense_predict(pooch_model* model, const std::string& model_path, const std::string& x_path,
                      const std::string& out_path, int64_t batch, const DeviceFlags& dev,
                      Output& out) {
  if (x_path.empty())
    return out.fail(kUsage,
                    model_path + " is a dense model: give its input rows with --data X.npy");
  DenseData d;
  // Without --out nothing but predictions goes to stdout.
  if (int rc = load_dense(x_path, "--data", "", "", out_path.empty(), d, out)) return rc;
  if (batch > 0)
    if (pooch_status st = pooch_model_set_run_shape(model, batch, 0, 0))
      return out.fail(st, "--batch");
  const DenseIo io = dense_io(model);
  if (!io.prediction)
    return out.fail(kBadInput, model_path + ": the model has no output named prediction");
  prepare_images(model, d);
  if (int rc = check_width(io, d, model_path, out)) return rc;
  SessionHandle s;
  if (int rc = open_session(model, dev, s, out)) return rc;

  const auto t0 = std::chrono::steady_clock::now();
  Batches b(s.p, d, io);
  const auto o = static_cast<size_t>(io.outputs);
  std::vector<float> all(static_cast<size_t>(d.rows) * o);
  std::vector<int64_t> idx(static_cast<size_t>(io.rows));
  for (int64_t first = 0; first < d.rows; first += io.rows) {
    const int64_t rows = std::min(io.rows, d.rows - first);
    for (int64_t i = 0; i < rows; ++i) idx[static_cast<size_t>(i)] = first + i;
    const float* p = nullptr;
    if (pooch_status st = b.stage(idx.data(), rows, false))
      return out.fail(st, "setting the inputs");
    if (pooch_status st = pooch_session_run(s.p, POOCH_PROGRAM_FORWARD))
      return out.fail(st, "predicting");
    if (pooch_status st = b.prediction(&p)) return out.fail(st, "reading the prediction");
    std::memcpy(all.data() + static_cast<size_t>(first) * o, p,
                static_cast<size_t>(rows) * o * sizeof(float));
  }
  const double secs = seconds_since(t0);
  Json& res = out.result();
  res["rows"] = d.rows;
  res["outputs"] = io.outputs;
  res["seconds"] = secs;
  if (!out_path.empty()) {
    std::string err;
    if (!write_npy(out_path, NpyType::f32, {d.rows, io.outputs}, all.data(), &err))
      return out.fail(kBadInput, "--out: " + err);
    std::printf("predicted %lld rows × %lld outputs in %.2f s into %s\n",
                static_cast<long long>(d.rows), static_cast<long long>(io.outputs), secs,
                out_path.c_str());
    res["out"] = out_path;
    return kOk;
  }
  if (out.json) {
    Json rows = Json::array();
    for (int64_t r = 0; r < d.rows; ++r) {
      Json row = Json::array();
      for (size_t j = 0; j < o; ++j) row.push_back(tidy(all[static_cast<size_t>(r) * o + j]));
      rows.push_back(std::move(row));
    }
    res["predictions"] = std::move(rows);
    return kOk;
  }
  std::string line;
  for (int64_t r = 0; r < d.rows; ++r) {
    line.clear();
    for (size_t j = 0; j < o; ++j) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.6g", j ? " " : "",
                    static_cast<double>(all[static_cast<size_t>(r) * o + j]));
      line += buf;
    }
    std::printf("%s\n", line.c_str());
  }
  return kOk;
}

}  // namespace cli
