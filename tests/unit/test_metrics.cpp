// XMC metrics: hand-computed P@k, nDCG@k, PSP@k, PSnDCG@k, the Jain et al. propensities, the
// edge cases (short rows, empty rows, short prediction lists) and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/train/metrics.h"

namespace pooch {
namespace {

constexpr double kTol = 1e-12;

// Rank discounts 1/log2(i+1), i = 1..5:
//   d1 = 1, d2 = 1/log2 3 = 0.6309297535714575, d3 = 1/log2 4 = 0.5,
//   d4 = 1/log2 5 = 0.43067655807339306, d5 = 1/log2 6 = 0.38685280723454163
const double d1 = 1.0, d2 = 1.0 / std::log2(3.0), d3 = 0.5, d4 = 1.0 / std::log2(5.0),
             d5 = 1.0 / std::log2(6.0);

void add(XmcMetrics& m, const std::vector<int32_t>& top, const std::vector<int32_t>& truth) {
  m.add_row(top.data(), static_cast<int>(top.size()), truth.data(),
            static_cast<int64_t>(truth.size()));
}

// The worked example used by several tests: 10 labels, weights w_l = l + 1.
//   row A: true {1, 2, 3}, predicted [1, 5, 2, 6, 3] -> hits at ranks 1, 3, 5
//   row B: true {4},       predicted [0, 4, 7, 8, 9] -> hit at rank 2
std::vector<double> example_weights() {
  std::vector<double> w(10);
  std::iota(w.begin(), w.end(), 1.0);
  return w;
}
void add_example(XmcMetrics& m) {
  add(m, {1, 5, 2, 6, 3}, {1, 2, 3});
  add(m, {0, 4, 7, 8, 9}, {4});
}

TEST(XmcMetrics, PrecisionHandComputed) {
  XmcMetrics m(10, 5);
  add_example(m);
  auto r = m.result();
  EXPECT_EQ(r.rows, 2);
  EXPECT_EQ(r.empty_rows, 0);
  // A: P@1 = 1/1, P@3 = 2/3, P@5 = 3/5.  B: P@1 = 0, P@3 = 1/3, P@5 = 1/5.
  // Means: P@1 = (1 + 0)/2 = 0.5, P@3 = (2/3 + 1/3)/2 = 0.5, P@5 = (3/5 + 1/5)/2 = 0.4.
  EXPECT_NEAR(r.precision_at(1), 0.5, kTol);
  EXPECT_NEAR(r.precision_at(3), 0.5, kTol);
  EXPECT_NEAR(r.precision_at(5), 0.4, kTol);
  // Also k = 2, 4: A: 1/2, 2/4; B: 1/2, 1/4 -> 0.5, 0.375.
  EXPECT_NEAR(r.precision_at(2), 0.5, kTol);
  EXPECT_NEAR(r.precision_at(4), 0.375, kTol);
  EXPECT_FALSE(r.has_propensity);
  EXPECT_TRUE(r.psp.empty());
}

TEST(XmcMetrics, NdcgHandComputed) {
  XmcMetrics m(10, 5);
  add_example(m);
  auto r = m.result();
  // A (|y| = 3): Z(1) = d1 = 1; Z(3) = Z(5) = d1 + d2 + d3 = 2.1309297535714578.
  //   nDCG@1 = d1/1 = 1
  //   nDCG@3 = (d1 + d3)/Z(3) = 1.5/2.13093 = 0.7039180890341347
  //   nDCG@5 = (d1 + d3 + d5)/Z(3) = 1.88685/2.13093 = 0.8854598815714874
  // B (|y| = 1): Z = d1 = 1 at every k.
  //   nDCG@1 = 0, nDCG@3 = nDCG@5 = d2 = 0.6309297535714575
  // Means: @1 0.5, @3 0.6674239213027962, @5 0.7581948175714724.
  const double z3 = d1 + d2 + d3;
  EXPECT_NEAR(r.ndcg_at(1), 0.5, kTol);
  EXPECT_NEAR(r.ndcg_at(3), ((d1 + d3) / z3 + d2) / 2, kTol);
  EXPECT_NEAR(r.ndcg_at(5), ((d1 + d3 + d5) / z3 + d2) / 2, kTol);
  EXPECT_NEAR(r.ndcg_at(3), 0.6674239213027962, 1e-12);
  EXPECT_NEAR(r.ndcg_at(5), 0.7581948175714724, 1e-12);
}

TEST(XmcMetrics, PspHandComputed) {
  auto w = example_weights();  // w_l = l + 1
  XmcMetrics m(10, 5, &w);
  add_example(m);
  auto r = m.result();
  ASSERT_TRUE(r.has_propensity);
  // A: true weights {w1, w2, w3} = {2, 3, 4}; hits 1 (w 2) at rank 1, 2 (w 3) at 3, 3 (w 4) at 5.
  //   weighted hits: @1 2, @3 2+3 = 5, @5 2+3+4 = 9
  //   best (true weights sorted 4, 3, 2): @1 4, @3 4+3+2 = 9, @5 9
  // B: true {4}, w 5, hit at rank 2.
  //   weighted hits: @1 0, @3 5, @5 5;  best: 5 at every k.
  // PSP@k = Σ weighted hits / Σ best:
  //   @1 (2+0)/(4+5) = 2/9, @3 (5+5)/(9+5) = 5/7, @5 (9+5)/(9+5) = 1.
  // (A mean of per-row ratios would give @1 (2/4 + 0/5)/2 = 0.25: not what pyxclib reports.)
  EXPECT_NEAR(r.psp_at(1), 2.0 / 9.0, kTol);
  EXPECT_NEAR(r.psp_at(3), 5.0 / 7.0, kTol);
  EXPECT_NEAR(r.psp_at(5), 1.0, kTol);
}

TEST(XmcMetrics, PsNdcgHandComputed) {
  auto w = example_weights();
  XmcMetrics m(10, 5, &w);
  add_example(m);
  auto r = m.result();
  const double z3 = d1 + d2 + d3;  // A's normaliser at k = 3 and 5; B's is 1
  // A: psDCG@1 = 2·d1 = 2; best 4·d1 = 4 (Z = 1).
  //    psDCG@3 = 2·d1 + 3·d3 = 3.5; /Z3 = 1.6424755410796474
  //    best@3 = 4·d1 + 3·d2 + 2·d3 = 6.8927892607143725; /Z3 = 3.234639363011378 (same at @5)
  //    psDCG@5 = 3.5 + 4·d5 = 5.047411228938166; /Z3 = 2.3686427112290582
  // B: psDCG@1 = 0, best 5; psDCG@3 = psDCG@5 = 5·d2 = 3.1546487678572873, best 5.
  // PSnDCG@1 = (2 + 0)/(4 + 5) = 2/9
  // PSnDCG@3 = (1.64248 + 3.15465)/(3.23464 + 5) = 0.5825542683125644
  // PSnDCG@5 = (2.36864 + 3.15465)/(3.23464 + 5) = 0.6707387215882272
  const double bestA = (4 * d1 + 3 * d2 + 2 * d3) / z3;
  EXPECT_NEAR(r.psndcg_at(1), 2.0 / 9.0, kTol);
  EXPECT_NEAR(r.psndcg_at(3), ((2 * d1 + 3 * d3) / z3 + 5 * d2) / (bestA + 5), kTol);
  EXPECT_NEAR(r.psndcg_at(5), ((2 * d1 + 3 * d3 + 4 * d5) / z3 + 5 * d2) / (bestA + 5), kTol);
  EXPECT_NEAR(r.psndcg_at(3), 0.5825542683125644, 1e-12);
  EXPECT_NEAR(r.psndcg_at(5), 0.6707387215882272, 1e-12);
}

TEST(XmcMetrics, PerfectPredictionsScoreOne) {
  // Every row has ≥ 5 true labels and the top 5 predictions are all true.
  std::vector<double> w(100);
  for (int l = 0; l < 100; ++l) w[l] = 1.0 + 0.37 * l;  // increasing in l
  XmcMetrics m(100, 5, &w);
  std::mt19937 rng(7);
  for (int row = 0; row < 50; ++row) {
    std::set<int32_t> s;
    const int n = 5 + static_cast<int>(rng() % 8);
    while (static_cast<int>(s.size()) < n) s.insert(static_cast<int32_t>(rng() % 100));
    std::vector<int32_t> truth(s.begin(), s.end());
    // Ranked by decreasing propensity weight (= decreasing label here): perfect for PSP too.
    std::vector<int32_t> top(truth.rbegin(), truth.rbegin() + 5);
    std::shuffle(truth.begin(), truth.end(), rng);  // order of true labels must not matter
    add(m, top, truth);
  }
  auto r = m.result();
  for (int k = 1; k <= 5; ++k) {
    EXPECT_NEAR(r.precision_at(k), 1.0, kTol) << k;
    EXPECT_NEAR(r.ndcg_at(k), 1.0, kTol) << k;
    EXPECT_NEAR(r.psp_at(k), 1.0, kTol) << k;
    EXPECT_NEAR(r.psndcg_at(k), 1.0, kTol) << k;
  }
}

TEST(XmcMetrics, PerfectRankingNdcgOneWithShortRows) {
  // Rows with 1..3 true labels, all predicted first: nDCG@k = 1 for every k although P@5 < 1.
  XmcMetrics m(20, 5);
  add(m, {4, 10, 11, 12, 13}, {4});      // P@5 = 1/5
  add(m, {6, 5, 10, 11, 12}, {5, 6});    // P@5 = 2/5
  add(m, {9, 8, 7, 10, 11}, {7, 8, 9});  // P@5 = 3/5
  auto r = m.result();
  for (int k = 1; k <= 5; ++k) EXPECT_NEAR(r.ndcg_at(k), 1.0, kTol) << k;
  EXPECT_NEAR(r.precision_at(1), 1.0, kTol);
  // P@3 = (1/3 + 2/3 + 3/3)/3 = 2/3; P@5 = (1/5 + 2/5 + 3/5)/3 = 0.4
  EXPECT_NEAR(r.precision_at(3), 2.0 / 3.0, kTol);
  EXPECT_NEAR(r.precision_at(5), 0.4, kTol);
}

TEST(XmcMetrics, FewerTrueLabelsThanK) {
  auto w = example_weights();
  XmcMetrics m(10, 5, &w);
  add(m, {7, 1, 2, 3, 4}, {7});  // one true label, found at rank 1
  auto r = m.result();
  // P@1 = 1, P@3 = 1/3, P@5 = 1/5.
  EXPECT_NEAR(r.precision_at(1), 1.0, kTol);
  EXPECT_NEAR(r.precision_at(3), 1.0 / 3.0, kTol);
  EXPECT_NEAR(r.precision_at(5), 0.2, kTol);
  // nDCG normaliser Z(k, 1) = d1 = 1, DCG = d1 -> 1 at every k.
  // PSP: weighted hits w7 = 8 at every k; best = 8 (only one true label) -> 1 at every k.
  for (int k = 1; k <= 5; ++k) {
    EXPECT_NEAR(r.ndcg_at(k), 1.0, kTol);
    EXPECT_NEAR(r.psp_at(k), 1.0, kTol);
    EXPECT_NEAR(r.psndcg_at(k), 1.0, kTol);
  }
}

TEST(XmcMetrics, FewerPredictionsThanK) {
  auto w = example_weights();
  XmcMetrics m(10, 5, &w);
  add(m, {7}, {7, 8});  // one prediction only: ranks 2..5 are misses
  auto r = m.result();
  // P@1 = 1, P@3 = 1/3, P@5 = 1/5.
  EXPECT_NEAR(r.precision_at(1), 1.0, kTol);
  EXPECT_NEAR(r.precision_at(3), 1.0 / 3.0, kTol);
  EXPECT_NEAR(r.precision_at(5), 0.2, kTol);
  // nDCG@3 = d1 / (d1 + d2) = 1/1.6309297535714575 = 0.6131471927654584
  EXPECT_NEAR(r.ndcg_at(3), 1.0 / (d1 + d2), kTol);
  // PSP@3: hit w7 = 8; best = w8 + w7 = 9 + 8 = 17 -> 8/17. PSP@1: 8/9 (best is w8 = 9).
  EXPECT_NEAR(r.psp_at(1), 8.0 / 9.0, kTol);
  EXPECT_NEAR(r.psp_at(3), 8.0 / 17.0, kTol);
  // Predictions past max_k are ignored, and so is k_available = 0 (all misses).
  XmcMetrics m2(10, 2);
  add(m2, {0, 1, 2, 3}, {2, 3});  // only 0, 1 count: no hit
  int32_t t = 5;
  m2.add_row(nullptr, 0, &t, 1);
  EXPECT_NEAR(m2.result().precision_at(2), 0.0, kTol);
}

TEST(XmcMetrics, EmptyRows) {
  auto w = example_weights();
  XmcMetrics with(10, 5, &w), without(10, 5, &w);
  add(with, {1, 2, 3, 4, 5}, {1});
  add(without, {1, 2, 3, 4, 5}, {1});
  add(with, {1, 2, 3, 4, 5}, {});  // no true label
  auto a = with.result(), b = without.result();
  EXPECT_EQ(a.rows, 2);
  EXPECT_EQ(a.empty_rows, 1);
  // The empty row counts as a row with 0 hits: P@1 = (1 + 0)/2, nDCG@1 = (1 + 0)/2.
  EXPECT_NEAR(a.precision_at(1), 0.5, kTol);
  EXPECT_NEAR(a.precision_at(5), (0.2 + 0) / 2, kTol);
  EXPECT_NEAR(a.ndcg_at(1), 0.5, kTol);
  EXPECT_NEAR(a.ndcg_at(5), 0.5, kTol);
  // It adds 0 to both sums of PSP/PSnDCG, so those are unchanged.
  for (int k = 1; k <= 5; ++k) {
    EXPECT_NEAR(a.psp_at(k), b.psp_at(k), kTol);
    EXPECT_NEAR(a.psndcg_at(k), b.psndcg_at(k), kTol);
  }
  // Only empty rows, or no rows: zeros, never NaN.
  XmcMetrics only(10, 5, &w), none(10, 5, &w);
  add(only, {1, 2}, {});
  for (const auto& r : {only.result(), none.result()}) {
    for (int k = 1; k <= 5; ++k) {
      EXPECT_EQ(r.precision_at(k), 0.0);
      EXPECT_EQ(r.ndcg_at(k), 0.0);
      EXPECT_EQ(r.psp_at(k), 0.0);
      EXPECT_EQ(r.psndcg_at(k), 0.0);
    }
  }
}

// Random rows: top list of 5 distinct labels and 0..9 true labels drawn from a small space so
// that hits are common.
struct RandomRow {
  std::vector<int32_t> top, truth;
};
std::vector<RandomRow> random_rows(int n, int labels, int min_true, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<RandomRow> rows(n);
  for (auto& r : rows) {
    std::set<int32_t> t, p;
    const int nt = min_true + static_cast<int>(rng() % 10);
    while (static_cast<int>(t.size()) < nt) t.insert(static_cast<int32_t>(rng() % labels));
    while (p.size() < 5) p.insert(static_cast<int32_t>(rng() % labels));
    r.truth.assign(t.begin(), t.end());
    r.top.assign(p.begin(), p.end());
    std::shuffle(r.top.begin(), r.top.end(), rng);
  }
  return rows;
}

TEST(XmcMetrics, UniformPropensitiesGivePrecision) {
  // Every row has ≥ 5 true labels: Σ best = k·w per row, so PSP@k = Σ hits·w / (rows·k·w) = P@k.
  std::vector<double> w(30, 3.7);
  XmcMetrics m(30, 5, &w);
  for (const auto& r : random_rows(200, 30, 5, 11)) add(m, r.top, r.truth);
  auto r = m.result();
  for (int k = 1; k <= 5; ++k) {
    EXPECT_NEAR(r.psp_at(k), r.precision_at(k), 1e-12) << k;
    // Per row best psDCG/Z = w, so PSnDCG@k = Σ w·DCG/Z / (rows·w) = nDCG@k.
    EXPECT_NEAR(r.psndcg_at(k), r.ndcg_at(k), 1e-12) << k;
  }
  EXPECT_GT(r.precision_at(5), 0.05);  // the rows do have hits
}

TEST(XmcMetrics, UniformPropensitiesShortRows) {
  // Rows with 0..9 true labels (some empty): PSnDCG = nDCG · rows/(non-empty rows) and
  // PSP@k = Σ hits / Σ min(k, |y|).
  std::vector<double> w(30, 2.0);
  XmcMetrics m(30, 5, &w);
  auto rows = random_rows(300, 30, 0, 12);
  double hits5 = 0, best5 = 0;
  for (const auto& row : rows) {
    add(m, row.top, row.truth);
    for (int32_t l : row.top) hits5 += std::count(row.truth.begin(), row.truth.end(), l);
    best5 += std::min<size_t>(5, row.truth.size());
  }
  auto r = m.result();
  ASSERT_GT(r.empty_rows, 0);
  const double scale = static_cast<double>(r.rows) / static_cast<double>(r.rows - r.empty_rows);
  for (int k = 1; k <= 5; ++k) EXPECT_NEAR(r.psndcg_at(k), r.ndcg_at(k) * scale, 1e-12) << k;
  EXPECT_NEAR(r.psp_at(5), hits5 / best5, 1e-12);
}

// A direct, slow restatement of the definitions (dense indicator per row) to compare against.
TEST(XmcMetrics, MatchesDirectDefinition) {
  const int L = 40, K = 5;
  std::vector<double> w(L);
  std::mt19937 rng(3);
  for (auto& x : w) x = 1.0 + (rng() % 1000) / 100.0;
  auto rows = random_rows(500, L, 0, 13);
  XmcMetrics m(L, K, &w);
  double p[K] = {}, nd[K] = {}, pn[K] = {}, pd[K] = {}, qn[K] = {}, qd[K] = {};
  for (const auto& row : rows) {
    add(m, row.top, row.truth);
    std::vector<int> y(L, 0);
    for (int32_t l : row.truth) y[l] = 1;
    std::vector<double> tw;
    for (int32_t l : row.truth) tw.push_back(w[l]);
    std::sort(tw.rbegin(), tw.rend());
    const int n = static_cast<int>(row.truth.size());
    for (int k = 1; k <= K; ++k) {
      double h = 0, dcg = 0, ps = 0, psd = 0, b = 0, bd = 0, z = 0;
      for (int i = 1; i <= k; ++i) {
        const int32_t l = row.top[i - 1];
        const double disc = 1.0 / std::log2(i + 1.0);
        h += y[l];
        dcg += y[l] * disc;
        ps += y[l] * w[l];
        psd += y[l] * w[l] * disc;
        if (i <= n) {
          b += tw[i - 1];
          bd += tw[i - 1] * disc;
          z += disc;
        }
      }
      p[k - 1] += h / k;
      pn[k - 1] += ps;
      pd[k - 1] += b;
      if (n > 0) {
        nd[k - 1] += dcg / z;
        qn[k - 1] += psd / z;
        qd[k - 1] += bd / z;
      }
    }
  }
  auto r = m.result();
  const double N = static_cast<double>(rows.size());
  for (int k = 1; k <= K; ++k) {
    EXPECT_NEAR(r.precision_at(k), p[k - 1] / N, 1e-12) << k;
    EXPECT_NEAR(r.ndcg_at(k), nd[k - 1] / N, 1e-12) << k;
    EXPECT_NEAR(r.psp_at(k), pn[k - 1] / pd[k - 1], 1e-12) << k;
    EXPECT_NEAR(r.psndcg_at(k), qn[k - 1] / qd[k - 1], 1e-12) << k;
  }
}

TEST(XmcMetrics, MergeEqualsOneAccumulator) {
  auto w = example_weights();
  auto rows = random_rows(100, 10, 0, 5);
  XmcMetrics all(10, 5, &w), a(10, 5, &w), b(10, 5, &w);
  for (size_t i = 0; i < rows.size(); ++i) {
    add(all, rows[i].top, rows[i].truth);
    add(i % 3 ? a : b, rows[i].top, rows[i].truth);
  }
  a.merge(b);
  auto x = all.result(), y = a.result();
  EXPECT_EQ(x.rows, y.rows);
  EXPECT_EQ(x.empty_rows, y.empty_rows);
  for (int k = 1; k <= 5; ++k) {
    EXPECT_NEAR(x.precision_at(k), y.precision_at(k), 1e-12);
    EXPECT_NEAR(x.ndcg_at(k), y.ndcg_at(k), 1e-12);
    EXPECT_NEAR(x.psp_at(k), y.psp_at(k), 1e-12);
    EXPECT_NEAR(x.psndcg_at(k), y.psndcg_at(k), 1e-12);
  }
  XmcMetrics other_k(10, 3, &w), no_p(10, 5);
  EXPECT_THROW(a.merge(other_k), Error);
  EXPECT_THROW(a.merge(no_p), Error);
}

TEST(XmcMetrics, MaxKOtherThanFive) {
  XmcMetrics m(10, 1);
  add(m, {3, 4}, {4});
  auto r = m.result();
  EXPECT_NEAR(r.precision_at(1), 0.0, kTol);
  EXPECT_THROW(r.precision_at(3), Error);
  EXPECT_EQ(r.summary(), "P@1 0.00 nDCG@1 0.00");
  EXPECT_THROW(r.psp_at(1), Error);  // no propensities given
}

void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(XmcMetrics, ValidatesInputs) {
  XmcMetrics m(10, 5);
  add(m, {1, 2, 3}, {1});  // row 0 fine
  expect_invalid([&] { add(m, {1, 12, 3}, {1}); }, {"row 1", "predicted label 12"});
  expect_invalid([&] { add(m, {1, -1, 3}, {1}); }, {"row 1", "predicted label -1"});
  expect_invalid([&] { add(m, {1, 2}, {10}); }, {"row 1", "true label 10"});
  expect_invalid([&] { add(m, {1, 2}, {3, 3}); }, {"row 1", "true label 3", "twice"});
  expect_invalid([&] { add(m, {2, 1, 2}, {3}); }, {"row 1", "predicted label 2", "twice"});
  expect_invalid([&] { m.add_row(nullptr, -1, nullptr, 0); }, {"row 1"});
  expect_invalid([&] { m.add_row(nullptr, 0, nullptr, -2); }, {"row 1"});
  expect_invalid([&] { m.add_row(nullptr, 3, nullptr, 0); }, {"row 1"});
  // A rejected row leaves the accumulator as it was.
  auto r = m.result();
  EXPECT_EQ(r.rows, 1);
  EXPECT_NEAR(r.precision_at(1), 1.0, kTol);
  EXPECT_NEAR(r.precision_at(3), 1.0 / 3.0, kTol);
  // A repeat past max_k is not looked at.
  XmcMetrics m1(10, 2);
  add(m1, {1, 2, 1}, {1});
  EXPECT_EQ(m1.result().rows, 1);

  std::vector<double> short_w(9, 1.0), bad_w(10, 1.0);
  bad_w[4] = std::nan("");
  expect_invalid([&] { XmcMetrics x(10, 5, &short_w); }, {"9", "10"});
  expect_invalid([&] { XmcMetrics x(10, 5, &bad_w); }, {"label 4"});
  expect_invalid([&] { XmcMetrics x(10, 0); }, {"max_k"});
  expect_invalid([&] { XmcMetrics x(0, 5); }, {"num_labels"});
}

TEST(InversePropensities, HandCalculation) {
  // N = 100, A = 0.55, B = 1.5 (the default family):
  //   C = (ln 100 − 1)·(1.5 + 1)^0.55 = 3.605170185988091 · 1.655263... = 5.967504781407847
  //   N_l = 0:   1 + C·1.5^−0.55   = 5.774661450557821
  //   N_l = 1:   1 + C·2.5^−0.55   = 1 + (ln 100 − 1) = ln 100 = 4.605170185988092
  //   N_l = 10:  1 + C·11.5^−0.55  = 2.557431532775994
  //   N_l = 100: 1 + C·101.5^−0.55 = 1.4701500129601222
  auto w = inverse_propensities({0, 1, 10, 100}, 100, 0.55, 1.5);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 5.774661450557821, 1e-12);
  EXPECT_NEAR(w[1], std::log(100.0), 1e-12);
  EXPECT_NEAR(w[2], 2.557431532775994, 1e-12);
  EXPECT_NEAR(w[3], 1.4701500129601222, 1e-12);
  // Rarer labels weigh more.
  EXPECT_GT(w[0], w[1]);
  EXPECT_GT(w[2], w[3]);
  // N = 1000, A = 0.5, B = 0.4 (Wikipedia): C = (ln 1000 − 1)·1.4^0.5 = 6.99015031389725
  //   N_l = 0: 1 + C·0.4^−0.5 = 12.052398089428129; N_l = 3: 1 + C·3.4^−0.5 = 4.7909412695373845
  auto v = inverse_propensities({0, 3}, 1000, 0.5, 0.4);
  EXPECT_NEAR(v[0], 12.052398089428129, 1e-12);
  EXPECT_NEAR(v[1], 4.7909412695373845, 1e-12);
}

TEST(InversePropensities, Validates) {
  expect_invalid([] { inverse_propensities({1}, 0, 0.55, 1.5); }, {"n_train"});
  expect_invalid([] { inverse_propensities({0, 11}, 10, 0.55, 1.5); }, {"label 1", "11"});
  expect_invalid([] { inverse_propensities({0, -1}, 10, 0.55, 1.5); }, {"label 1"});
  expect_invalid([] { inverse_propensities({0}, 10, 0.55, 0.0); }, {"label 0"});  // 0^−A
  expect_invalid([] { inverse_propensities({1}, 10, -0.5, 1.5); }, {"A"});
  expect_invalid([] { inverse_propensities({1}, 10, 0.5, -1.0); }, {"B"});
  EXPECT_NO_THROW(inverse_propensities({1, 2}, 10, 0.5, 0.0));  // B = 0 fine when every N_l > 0
  EXPECT_TRUE(inverse_propensities({}, 10, 0.5, 0.4).empty());
}

TEST(DefaultPropensityAB, Families) {
  using AB = std::pair<double, double>;
  EXPECT_EQ(default_propensity_ab("WikiLSHTC-325K"), AB(0.5, 0.4));
  EXPECT_EQ(default_propensity_ab("Wikipedia-500K"), AB(0.5, 0.4));
  EXPECT_EQ(default_propensity_ab("LF-WikiSeeAlso-320K"), AB(0.5, 0.4));
  EXPECT_EQ(default_propensity_ab("Amazon-670K"), AB(0.6, 2.6));
  EXPECT_EQ(default_propensity_ab("amazon-3m"), AB(0.6, 2.6));
  EXPECT_EQ(default_propensity_ab("LF-AmazonTitles-131K"), AB(0.6, 2.6));
  EXPECT_EQ(default_propensity_ab("Wiki10-31K"), AB(0.55, 1.5));
  EXPECT_EQ(default_propensity_ab("AmazonCat-13K"), AB(0.55, 1.5));
  EXPECT_EQ(default_propensity_ab("EURLex-4K"), AB(0.55, 1.5));
  EXPECT_EQ(default_propensity_ab(""), AB(0.55, 1.5));
  EXPECT_EQ(default_propensity_ab("Wiki-500K"), AB(0.5, 0.4));
  EXPECT_EQ(default_propensity_ab("debtags-xmc"), AB(0.55, 1.5));
  EXPECT_EQ(default_propensity_ab("Wiki10-31K-sample"), AB(0.55, 1.5));
}

}  // namespace
}  // namespace pooch
