// The data flags of train, finetune and eval: --data DIR (DIR/train.txt and
// DIR/test.txt), --train/--test FILE (bag of words), or the split form
// --train-features/--train-labels/--test-features/--test-labels (features as
// text or .npy). Loading prints one line per file.
#pragma once
#include <string>

#include "cli_common.h"

namespace cli {

struct DataFlags {
  std::string dir;
  std::string train, test;
  std::string train_features, train_labels, test_features, test_labels;
};

enum class DataUse {
  train,  // a training set is required, a test set optional
  eval,   // a test set is required; the training set (for PSP) optional
};

void add_data_flags(CLI::App* app, DataFlags& f, DataUse use);

struct Data {
  DatasetHandle train, test;
  // Rows held out of the training set (pooch-run train --valid-fraction):
  // evaluated after each epoch in place of the test set, which is then
  // evaluated once, after the last epoch.
  DatasetHandle valid;
  std::string name;  // the data set's name (the directory's), for propensities
  std::string train_source, test_source;
};

// Loads what `use` needs; with DataUse::eval and --data DIR the training set
// is loaded only when DIR/train.txt exists. Returns an exit code (kOk).
int load_data(const DataFlags& f, DataUse use, Data& d, Output& out);

// One data set from a file, printed as "<label>: <path>: N rows, F features, L labels".
int load_one(const std::string& path, const std::string& labels_path, const char* label,
             DatasetHandle& ds, Output& out);

struct Shape {
  int64_t rows = 0, features = 0, labels = 0;
};
Shape shape_of(const pooch_dataset* ds);
Json shape_json(const pooch_dataset* ds, const std::string& source);

// The last path component of a directory (without trailing slashes).
std::string base_name(const std::string& path);
std::string parent_dir(const std::string& path);

}  // namespace cli
