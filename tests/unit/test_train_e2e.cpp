// The foundation's end-to-end check: sparse input -> linear -> relu -> fixed
// fan-in head -> BCE, trained with Adam on a planted problem inside the arena.
#include <gtest/gtest.h>

#include <numeric>

#include "formats/xmc_data.h"
#include "runtime/train/trainer.h"
#include "runtime/models/xmc.h"
#include "runtime/train/xmc_session.h"

using namespace pooch;

namespace {

struct TrainResult {
  std::vector<float> losses;
  std::vector<std::vector<std::byte>> weights;
};

TrainResult train(int threads, int epochs = 4) {
  PlantedParams pp;
  pp.rows = 1024;
  pp.features = 500;
  pp.labels = 100;
  const XmcDataset d = make_planted(pp);
  ModelSpec spec =
      spec_from_flags(InputKind::sparse, pp.features, pp.labels, 64, 0, 16, LossKind::bce, 0.0);
  spec.run.batch = 32;
  OptimizerConfig opt;
  opt.lr = 1e-2;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = threads;
  cfg.optimizer = opt;
  XmcSession s(build_xmc_model(spec), cfg);
  TrainResult r;
  for (int e = 0; e < epochs; ++e)
    for (int64_t first = 0; first < d.rows(); first += spec.run.batch) {
      BatchView b;
      b.rows = std::min<int64_t>(spec.run.batch, d.rows() - first);
      b.row_ptr = d.row_ptr.data() + first;
      b.col = d.col.data();
      b.val = d.val.data();
      b.label_ptr = d.label_ptr.data() + first;
      b.label = d.label.data();
      r.losses.push_back(s.train_step(b));
    }
  for (const char* w : {"fc0.weight", "fc0.bias", "head.weight", "head.bias", "head.index"})
    r.weights.push_back(s.read(w));
  return r;
}

double mean(const std::vector<float>& v, size_t from, size_t n) {
  return std::accumulate(v.begin() + static_cast<long>(from),
                         v.begin() + static_cast<long>(from + n), 0.0) /
         static_cast<double>(n);
}

}  // namespace

TEST(TrainEndToEnd, LossFallsByAtLeastHalf) {
  const TrainResult r = train(2);
  ASSERT_GE(r.losses.size(), 64u);
  const double first = mean(r.losses, 0, 8), last = mean(r.losses, r.losses.size() - 8, 8);
  EXPECT_LT(last, 0.5 * first) << "first steps " << first << ", last steps " << last;
}

TEST(TrainEndToEnd, SameSeedGivesBitwiseIdenticalWeights) {
  const TrainResult a = train(2, 2), b = train(2, 2);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_EQ(a.weights[i], b.weights[i]) << "weight " << i;
  EXPECT_EQ(a.losses, b.losses);
}

TEST(TrainEndToEnd, ThreadCountDoesNotChangeTheResult) {
  const TrainResult a = train(1, 1), b = train(2, 1);
  for (size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_EQ(a.weights[i], b.weights[i]) << "weight " << i;
}

// Dense input (precomputed embeddings, as the fixed fan-in paper trains on):
// dropout -> linear -> relu -> layernorm -> fixed fan-in head, through the
// trainer with evaluation.
TEST(TrainEndToEnd, DenseInputModelLearnsThroughTheTrainer) {
  PlantedParams pp;
  pp.rows = 1200;
  pp.features = 64;
  pp.labels = 40;
  const XmcDataset sparse = make_planted(pp);
  auto densify = [](const XmcDataset& s, int64_t from, int64_t to) {
    XmcDataset d;
    d.features = d.dense_dim = s.features;
    d.labels = s.labels;
    for (int64_t r = from; r < to; ++r) {
      std::vector<float> row(static_cast<size_t>(s.features), 0.0f);
      for (int64_t j = s.row_ptr[r]; j < s.row_ptr[r + 1]; ++j)
        row[static_cast<size_t>(s.col[j])] += s.val[j];
      d.dense.insert(d.dense.end(), row.begin(), row.end());
      d.row_ptr.push_back(0);
      d.label.insert(d.label.end(), s.label.begin() + s.label_ptr[r],
                     s.label.begin() + s.label_ptr[r + 1]);
      d.label_ptr.push_back(static_cast<int64_t>(d.label.size()));
    }
    return d;
  };
  const XmcDataset train_set = densify(sparse, 0, 1000), test_set = densify(sparse, 1000, 1200);
  ModelSpec spec;
  spec.input = InputKind::dense;
  spec.input_width = pp.features;
  spec.labels = pp.labels;
  spec.layers = {{LayerKind::dropout, 0, "none", 0.1, 0},
                 {LayerKind::linear, 128, "relu", 0, 0},
                 {LayerKind::layernorm, 0, "none", 0, 0},
                 {LayerKind::ffi_head, 0, "none", 0, 16}};
  spec.run.batch = 50;
  OptimizerConfig opt;
  opt.lr = 1e-2;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  cfg.optimizer = opt;
  XmcSession s(build_xmc_model(spec), cfg);
  const XmcMetricsResult before = evaluate(s, test_set, nullptr);
  TrainConfig tc;
  tc.epochs = 8;
  tc.early_stop_patience = 0;
  TrainerState st;
  std::vector<double> losses;
  TrainCallbacks cb;
  cb.on_epoch = [&](const EpochReport& r) { losses.push_back(r.train_loss); };
  train_xmc(s, train_set, &test_set, tc, st, cb);
  const XmcMetricsResult after = evaluate(s, test_set, nullptr);
  ASSERT_EQ(losses.size(), 8u);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  EXPECT_GT(after.precision_at(1), 0.8)
      << "before: " << before.summary() << " after: " << after.summary();
  EXPECT_GT(after.precision_at(1), before.precision_at(1) + 0.3);
}
