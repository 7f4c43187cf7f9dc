// Dynamic sparse training of the fixed fan-in head: the fan-in stays exactly
// K, the smallest |w| are the ones pruned, regrown slots start at zero with
// reset Adam moments, survivors keep their weights and moments, and the
// draws are deterministic in (seed, step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "formats/xmc_data.h"
#include "runtime/core/error.h"
#include "runtime/models/xmc.h"
#include "runtime/train/rewire.h"
#include "runtime/train/trainer.h"
#include "runtime/train/xmc_session.h"

using namespace pooch;

namespace {

constexpr int64_t kL = 50, kK = 8, kH = 32;

ModelSpec spec() {
  ModelSpec s = spec_from_flags(InputKind::sparse, 300, kL, kH, 0, kK, LossKind::bce, 0);
  s.run.batch = 16;
  return s;
}

std::vector<float> floats(const Session& s, const std::string& name) {
  const auto b = s.read_tensor(name);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::vector<int64_t> index_of(const Session& s) {
  const auto b = s.read_tensor("head.index");
  std::vector<int64_t> v(b.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t x;
    std::memcpy(&x, b.data() + 2 * i, 2);
    v[i] = x;
  }
  return v;
}

void set_floats(Session& s, const std::string& name, const std::vector<float>& v) {
  s.write_tensor(name, v.data(), v.size() * 4);
}

TEST(Rewire, PrunesTheSmallestAndKeepsTheFanInExact) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session s(build_xmc_model(spec()), cfg);
  // Distinct magnitudes, and Adam moments that say which slot they belong to.
  std::vector<float> w(kL * kK), m(kL * kK), v(kL * kK);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>((i * 37) % 97 + 1) / 100.0f;
    m[i] = static_cast<float>(i) + 0.5f;
    v[i] = static_cast<float>(i) + 0.25f;
  }
  set_floats(s, "head.weight", w);
  set_floats(s, "head.weight.m", m);
  set_floats(s, "head.weight.v", v);
  const std::vector<int64_t> before = index_of(s);

  const RewireResult r = rewire_fixed_fan_in(s, "head.index", "head.weight", 0.25, 7, 100);
  EXPECT_EQ(r.rewired, kL * 2);  // 25% of K = 8
  const std::vector<int64_t> after = index_of(s);
  const std::vector<float> w2 = floats(s, "head.weight"), m2 = floats(s, "head.weight.m"),
                           v2 = floats(s, "head.weight.v");
  for (int64_t row = 0; row < kL; ++row) {
    // The slots before, by |w|: the 6 largest survive with their values.
    std::vector<std::pair<float, int64_t>> by_mag;
    std::map<int64_t, size_t> old_slot;
    for (int64_t k = 0; k < kK; ++k) {
      const size_t i = static_cast<size_t>(row * kK + k);
      by_mag.push_back({std::fabs(w[i]), before[i]});
      old_slot[before[i]] = i;
    }
    std::sort(by_mag.rbegin(), by_mag.rend());
    std::set<int64_t> survivors;
    for (int k = 0; k < 6; ++k) survivors.insert(by_mag[static_cast<size_t>(k)].second);
    std::set<int64_t> seen;
    int regrown = 0;
    for (int64_t k = 0; k < kK; ++k) {
      const size_t i = static_cast<size_t>(row * kK + k);
      const int64_t in = after[i];
      ASSERT_GE(in, 0);
      ASSERT_LT(in, kH);
      EXPECT_TRUE(seen.insert(in).second) << "row " << row << " uses input " << in << " twice";
      if (k > 0) {
        EXPECT_LT(after[i - 1], in) << "row " << row << " is not sorted";
      }
      if (survivors.count(in)) {
        const size_t from = old_slot[in];
        EXPECT_EQ(w2[i], w[from]);
        EXPECT_EQ(m2[i], m[from]);
        EXPECT_EQ(v2[i], v[from]);
      } else {
        ++regrown;
        EXPECT_FALSE(old_slot.count(in)) << "a pruned input came back in row " << row;
        EXPECT_EQ(w2[i], 0.0f);
        EXPECT_EQ(m2[i], 0.0f);
        EXPECT_EQ(v2[i], 0.0f);
      }
    }
    EXPECT_EQ(regrown, 2) << "row " << row;
  }
}

TEST(Rewire, DrawsDependOnSeedAndStepOnly) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  Session a(build_xmc_model(spec()), cfg), b(build_xmc_model(spec()), cfg),
      c(build_xmc_model(spec()), cfg);
  rewire_fixed_fan_in(a, "head.index", "head.weight", 0.5, 3, 10);
  rewire_fixed_fan_in(b, "head.index", "head.weight", 0.5, 3, 10);
  rewire_fixed_fan_in(c, "head.index", "head.weight", 0.5, 3, 11);
  EXPECT_EQ(index_of(a), index_of(b));
  EXPECT_NE(index_of(a), index_of(c));
  EXPECT_THROW(rewire_fixed_fan_in(a, "head.index", "head.weight", 1.5, 3, 10), Error);
  EXPECT_THROW(rewire_fixed_fan_in(a, "fc0.weight", "head.weight", 0.1, 3, 10), Error);
}

TEST(Rewire, TrainingRewiresEveryNSteps) {
  PlantedParams pp;
  pp.rows = 256;
  pp.features = 300;
  pp.labels = kL;
  const XmcDataset d = make_planted(pp);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  XmcSession s(build_xmc_model(spec()), cfg);
  const std::vector<int64_t> before = index_of(s.session());
  TrainConfig tc;
  tc.epochs = 2;
  tc.rewire_every = 4;
  tc.rewire_fraction = 0.25;
  TrainerState st;
  std::vector<double> losses;
  TrainCallbacks cb;
  cb.on_epoch = [&](const EpochReport& r) { losses.push_back(r.train_loss); };
  train_xmc(s, d, nullptr, tc, st, cb);
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(losses[1]));
  EXPECT_NE(index_of(s.session()), before);
}

}  // namespace
