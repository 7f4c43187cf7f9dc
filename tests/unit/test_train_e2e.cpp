// The foundation's end-to-end check: sparse input -> linear -> relu -> fixed
// fan-in head -> BCE, trained with Adam on a planted problem inside the arena.
#include <gtest/gtest.h>

#include <numeric>

#include "formats/xmc_data.h"
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
  ModelSpec spec = spec_from_flags(InputKind::sparse, pp.features, pp.labels, 64, 0, 16,
                                   LossKind::bce, 0.0);
  spec.batch = 32;
  OptimizerConfig opt;
  opt.lr = 1e-2;
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = threads;
  cfg.optimizer = opt;
  XmcSession s(build_xmc_model(spec, opt), cfg);
  TrainResult r;
  for (int e = 0; e < epochs; ++e)
    for (int64_t first = 0; first < d.rows(); first += spec.batch) {
      BatchView b;
      b.rows = std::min<int64_t>(spec.batch, d.rows() - first);
      b.row_ptr = d.row_ptr.data() + first;
      b.col = d.col.data();
      b.val = d.val.data();
      b.label_ptr = d.label_ptr.data() + first;
      b.label = d.label.data();
      r.losses.push_back(s.step(b));
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
