// Dense models (the "mlp" family and any model whose input is batch.x) in
// pooch-run: data from .npy files (X: float rows; Y: float targets or
// integer class ids), trained, evaluated and run through the tensor-level
// C API (pooch_session_set_input / pooch_session_run /
// pooch_session_get_output). The XMC commands are untouched by this.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "image_data.h"
#include "training.h"

namespace cli {

// X and (optionally) Y of a dense data set.
struct DenseData {
  std::string x_path, y_path;
  int64_t rows = 0, width = 0;
  std::vector<float> x;  // rows × width
  // Y: float targets (regression) or integer class ids (classification).
  bool has_y = false;
  bool classes = false;
  int64_t outputs = 0;       // regression: Y's columns; classification: the largest id + 1
  std::vector<float> y;      // rows × outputs
  std::vector<int32_t> cls;  // rows
  // An image set (X of rank 4, image_data.h): x holds rows × C×H×W floats.
  ImageShape image;
};

// Reads X (`x_flag` names the flag in messages) and, when y_path is not
// empty, Y; checks shapes, types and values (finite floats, class ids in
// [0, 2^31)). Prints one line per file unless `quiet`. Exit code.
int load_dense(const std::string& x_path, const char* x_flag, const std::string& y_path,
               const char* y_flag, bool quiet, DenseData& d, Output& out);

// The dense flags of train.
struct DenseTrainFlags {
  std::string targets;          // --targets Y.npy (selects the dense path)
  double valid_fraction = 0.1;  // --valid-fraction
  Augment augment;              // --crop-pad, --flip (image sets)
  bool no_prefetch = false;     // image sets: batch i+1 is prepared during step i unless set
};

// --targets and --valid-fraction.
void add_dense_train_flags(CLI::App* app, DenseTrainFlags& f);

// pooch-run train --data X.npy --targets Y.npy [--spec mlp.json]: `app` is
// train's subcommand (to refuse XMC-only flags given with a dense model).
int run_dense_train(const std::string& x_path, const DenseTrainFlags& df, const ModelFlags& mf,
                    const TrainFlags& tf, const DeviceFlags& dev, const CLI::App* app, Output& out);

// pooch-run finetune --model M --data X.npy --targets Y.npy [--new-head L]:
// the model (its weights, not its optimizer state) trained further; with a
// new head (L > 0, or -1 and the data's class count differs from the
// model's) its output layer is replaced by a fresh one over L classes.
int run_dense_finetune(const std::string& model_path, int64_t new_head, const std::string& x_path,
                       const DenseTrainFlags& df, const TrainFlags& tf, const DeviceFlags& dev,
                       const CLI::App* app, Output& out);

// pooch-run eval --model M --data X.npy --targets Y.npy: mean loss (and
// accuracy for classification).
int run_dense_eval(pooch_model* model, const std::string& model_path, const std::string& x_path,
                   const std::string& y_path, int64_t batch, const DeviceFlags& dev, Output& out);

// pooch-run predict --model M --data X.npy [--out P.npy]: the model's
// prediction for every row (without --out: one line of numbers per row on
// stdout, or the JSON object's "predictions" with --json).
int run_dense_predict(pooch_model* model, const std::string& model_path, const std::string& x_path,
                      const std::string& out_path, int64_t batch, const DeviceFlags& dev,
                      Output& out);

// pooch-run profile --data X.npy --targets Y.npy (--model M or --spec S):
// loads the rows, makes or loads the model (`model` empty: from `mf`), opens
// a training session where `dev` says, sets the first batch of rows and runs
// one warm-up step, then hands the session to `profile`. Exit code.
int run_dense_profile(const std::string& model_path, const ModelFlags& mf, const TrainFlags& tf,
                      const std::string& x_path, const std::string& y_path, const DeviceFlags& dev,
                      Output& out, const std::function<int(pooch_session*)>& profile);

// True for a path ending in ".npy".
bool is_npy_path(const std::string& path);

// True when the model takes dense rows through the tensor-level calls (it
// has an input named batch.x and is not an XMC model).
bool is_dense_model(const pooch_model* model);

// pooch-run synth --kind regression|classification: X.npy and Y.npy in `dir`.
struct DenseSynthFlags {
  std::string kind;  // "regression" or "classification"
  int64_t rows = 2000;
  int64_t features = 8;
  int64_t outputs = 0;  // regression: 2; classification: 4 classes
  double noise = 0.05;
};
int run_dense_synth(const DenseSynthFlags& f, uint64_t seed, const std::string& dir, Output& out);

}  // namespace cli
