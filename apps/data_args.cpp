#include "data_args.h"

#include <cstdio>
#include <filesystem>

namespace cli {

namespace fs = std::filesystem;

void add_data_flags(CLI::App* app, DataFlags& f, DataUse use) {
  auto* g = app;
  g->add_option("--data", f.dir,
                use == DataUse::train
                    ? "Data directory holding train.txt and test.txt (bag of words), or dense "
                      "rows X.npy with --targets"
                    : "Data directory holding test.txt (and train.txt, for PSP@k), or dense rows "
                      "X.npy with --targets")
      ->type_name("DIR|X.npy")
      ->group("Data");
  g->add_option("--train", f.train,
                use == DataUse::train ? "Training set (bag-of-words file)"
                                      : "Training set, for PSP@k propensities")
      ->type_name("FILE")
      ->group("Data");
  g->add_option("--test", f.test, "Test set (bag-of-words file)")->type_name("FILE")->group("Data");
  g->add_option("--train-features", f.train_features,
                "Training features (split form: X_Xf.txt or dense .npy)")
      ->type_name("FILE")
      ->group("Data");
  g->add_option("--train-labels", f.train_labels, "Training labels (split form: X_Y.txt)")
      ->type_name("FILE")
      ->group("Data");
  g->add_option("--test-features", f.test_features, "Test features (split form)")
      ->type_name("FILE")
      ->group("Data");
  g->add_option("--test-labels", f.test_labels, "Test labels (split form)")
      ->type_name("FILE")
      ->group("Data");
}

Shape shape_of(const pooch_dataset* ds) {
  Shape s;
  if (ds) pooch_dataset_shape(ds, &s.rows, &s.features, &s.labels);
  return s;
}

Json shape_json(const pooch_dataset* ds, const std::string& source) {
  const Shape s = shape_of(ds);
  Json j;
  j["path"] = source;
  j["rows"] = s.rows;
  j["features"] = s.features;
  j["labels"] = s.labels;
  j["dense"] = ds ? pooch_dataset_is_dense(ds) != 0 : false;
  return j;
}

std::string base_name(const std::string& path) {
  // Absolute and normal, so that "data/", "." and "../x" name a folder too.
  if (path.empty()) return {};
  fs::path p = fs::absolute(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

std::string parent_dir(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  if (p.empty()) p = ".";
  return p.string();
}

int load_one(const std::string& path, const std::string& labels_path, const char* label,
             DatasetHandle& ds, Output& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const pooch_status st = labels_path.empty()
                              ? pooch_dataset_load(path.c_str(), &ds.p)
                              : pooch_dataset_load_split(path.c_str(), labels_path.c_str(), &ds.p);
  if (st != POOCH_OK) return out.fail(st, std::string("loading the ") + label + " set");
  const Shape s = shape_of(ds.p);
  const std::string src = labels_path.empty() ? path : path + " + " + labels_path;
  std::printf("%s: %s: %lld rows, %lld features%s, %lld labels (%.2f s)\n", label, src.c_str(),
              static_cast<long long>(s.rows), static_cast<long long>(s.features),
              pooch_dataset_is_dense(ds.p) ? " (dense)" : "", static_cast<long long>(s.labels),
              seconds_since(t0));
  std::fflush(stdout);
  return kOk;
}

int load_data(const DataFlags& f, DataUse use, Data& d, Output& out) {
  // Each set comes in one form: --data DIR names both; otherwise each of the
  // training and test sets is a bag-of-words file or a split pair.
  const bool split_train = !f.train_features.empty() || !f.train_labels.empty();
  const bool split_test = !f.test_features.empty() || !f.test_labels.empty();
  if (!f.dir.empty() && (!f.train.empty() || !f.test.empty() || split_train || split_test))
    return out.fail(kUsage,
                    "data: --data DIR names the training and test sets; leave out --train, "
                    "--test and the split files (--train-features ...) with it");
  if (!f.train.empty() && split_train)
    return out.fail(kUsage,
                    "data: give the training set once: --train FILE or "
                    "--train-features/--train-labels");
  if (!f.test.empty() && split_test)
    return out.fail(kUsage,
                    "data: give the test set once: --test FILE or --test-features/--test-labels");
  if (!f.train_features.empty() != !f.train_labels.empty())
    return out.fail(kUsage, "data: --train-features and --train-labels go together");
  if (!f.test_features.empty() != !f.test_labels.empty())
    return out.fail(kUsage, "data: --test-features and --test-labels go together");

  std::string train_path, train_labels, test_path, test_labels;
  if (!f.dir.empty()) {
    if (!fs::is_directory(f.dir))
      return out.fail(kBadInput, "data: '" + f.dir + "' is not a directory");
    train_path = (fs::path(f.dir) / "train.txt").string();
    test_path = (fs::path(f.dir) / "test.txt").string();
    if (use == DataUse::eval && !fs::exists(train_path)) train_path.clear();
    if (use == DataUse::train && !fs::exists(test_path)) {
      std::printf("data: %s does not exist; training without evaluation\n", test_path.c_str());
      test_path.clear();
    }
    d.name = base_name(f.dir);
  } else {
    train_path = !f.train.empty() ? f.train : f.train_features;
    train_labels = f.train_labels;
    test_path = !f.test.empty() ? f.test : f.test_features;
    test_labels = f.test_labels;
    const std::string any = !train_path.empty() ? train_path : test_path;
    if (!any.empty()) d.name = base_name(parent_dir(any));
  }
  if (use == DataUse::train && train_path.empty())
    return out.fail(kUsage,
                    "data: no training set: give --data DIR, --train FILE or "
                    "--train-features/--train-labels");
  if (use == DataUse::eval && test_path.empty())
    return out.fail(kUsage,
                    "data: no test set: give --data DIR, --test FILE or "
                    "--test-features/--test-labels");

  if (!train_path.empty()) {
    if (int rc = load_one(train_path, train_labels, "train", d.train, out)) return rc;
    d.train_source = train_path;
    out.result()["train"] = shape_json(d.train.p, train_path);
  }
  if (!test_path.empty()) {
    if (int rc = load_one(test_path, test_labels, "test", d.test, out)) return rc;
    d.test_source = test_path;
    out.result()["test"] = shape_json(d.test.p, test_path);
  }
  return kOk;
}

}  // namespace cli
