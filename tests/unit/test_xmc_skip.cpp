// The linear skip path of the xmc family ("skip": true): the spec round-trips
// and is refused where it cannot apply, the path starts at zero (so the model
// predicts as the network alone), and training moves it, only in the rows of
// the features the batches hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "formats/xmc_data.h"
#include "runtime/core/error.h"
#include "runtime/models/xmc.h"
#include "runtime/train/xmc_session.h"

using namespace pooch;

namespace {

constexpr int64_t kF = 200, kL = 30, kB = 16;

ModelSpec spec(bool skip) {
  ModelSpec s = spec_from_flags(InputKind::sparse, kF, kL, 24, 0, 0, LossKind::bce, 0);
  s.run.batch = kB;
  s.skip = skip;
  return s;
}

std::vector<float> floats(const XmcSession& s, const std::string& name) {
  const auto b = s.read(name);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

TEST(XmcSkip, SpecRoundTripsAndIsCheckedWhereItCannotApply) {
  const ModelSpec s = spec(true);
  const ModelSpec back = spec_from_json(spec_to_json(s), "test");
  EXPECT_TRUE(back.skip);
  EXPECT_EQ(spec_to_json(spec(false)).find("skip"), std::string::npos);
  ModelSpec dense = s;
  dense.input = InputKind::dense;
  EXPECT_THROW(build_xmc_model(dense), Error);
  ModelSpec linear = s;  // already input -> labels
  linear.layers = {LayerSpec{LayerKind::dense_head}};
  EXPECT_THROW(build_xmc_model(linear), Error);
  EXPECT_THROW(spec_from_json(R"({"input": {"width": 5}, "labels": 3, "skip": 1,
                                  "layers": [{"type": "linear", "width": 4}, {"type": "dense"}]})",
                              "bad.json"),
               Error);
}

TEST(XmcSkip, StartsAtZeroAndTrainsOnlyTheBatchesFeatures) {
  PlantedParams pp;
  pp.rows = 4 * kB;
  pp.features = kF;
  pp.labels = kL;
  const XmcDataset d = make_planted(pp);
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  XmcSession with(build_xmc_model(spec(true)), cfg);
  XmcSession without(build_xmc_model(spec(false)), cfg);
  BatchView b;
  b.rows = kB;
  b.row_ptr = d.row_ptr.data();
  b.col = d.col.data();
  b.val = d.val.data();
  b.label_ptr = d.label_ptr.data();
  b.label = d.label.data();
  // Zero path: the same predictions as the model without it.
  std::vector<float> s1(kB * 5), s2(kB * 5);
  std::vector<int32_t> l1(kB * 5), l2(kB * 5);
  with.predict(b, 5, l1.data(), s1.data());
  without.predict(b, 5, l2.data(), s2.data());
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(s1, s2);
  for (float v : floats(with, "head.skip.weight")) ASSERT_EQ(v, 0.0f);
  const float first = with.train_step(b);
  float last = first;
  for (int i = 0; i < 20; ++i) last = with.train_step(b);
  EXPECT_LT(last, first);
  std::set<int32_t> seen(d.col.begin(), d.col.begin() + d.row_ptr[kB]);
  const std::vector<float> w = floats(with, "head.skip.weight");
  int64_t moved = 0;
  for (int64_t f = 0; f < kF; ++f)
    for (int64_t l = 0; l < kL; ++l) {
      const float v = w[f * kL + l];
      if (!seen.count(static_cast<int32_t>(f))) {
        ASSERT_EQ(v, 0.0f) << "feature " << f;
      }
      moved += v != 0.0f;
    }
  EXPECT_GT(moved, 0);
}

}  // namespace
