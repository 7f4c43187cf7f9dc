#include <algorithm>
#include <cmath>
#include <random>

#include "xmc_data.h"

namespace pooch {

XmcDataset make_planted(const PlantedParams& p) {
  // mt19937_64 with explicit integer arithmetic (no std distributions, whose
  // output differs between standard libraries) keeps the data identical everywhere.
  std::mt19937_64 rng(p.seed);
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  XmcDataset d;
  d.features = p.features;
  d.labels = p.labels;
  std::vector<int32_t> topic(static_cast<size_t>(p.labels * p.topic_features));
  for (auto& f : topic) f = static_cast<int32_t>(below(p.features));

  std::vector<std::pair<int32_t, float>> row;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int n_labels = 1 + static_cast<int>(below(3));
    std::vector<int32_t> ls;
    for (int i = 0; i < n_labels; ++i) {
      // The minimum of two uniform draws favours low ids: a skewed label frequency.
      const int32_t l = static_cast<int32_t>(std::min(below(p.labels), below(p.labels)));
      if (std::find(ls.begin(), ls.end(), l) == ls.end()) ls.push_back(l);
    }
    std::sort(ls.begin(), ls.end());
    row.clear();
    for (int32_t l : ls)
      for (int k = 0; k < p.topic_features; ++k)
        if (below(4) != 0)  // each topic feature present with probability 3/4
          row.emplace_back(topic[static_cast<size_t>(l * p.topic_features + k)], 1.0f);
    for (int k = 0; k < p.noise_features; ++k)
      row.emplace_back(static_cast<int32_t>(below(p.features)), 0.5f);
    std::sort(row.begin(), row.end());
    // Merge duplicate features by summing; then scale the row to unit length.
    std::vector<std::pair<int32_t, float>> merged;
    for (auto& e : row)
      if (!merged.empty() && merged.back().first == e.first)
        merged.back().second += e.second;
      else
        merged.push_back(e);
    double norm = 0;
    for (auto& e : merged) norm += static_cast<double>(e.second) * e.second;
    const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 1.0f;
    for (auto& e : merged) {
      d.col.push_back(e.first);
      d.val.push_back(e.second * inv);
    }
    d.row_ptr.push_back(static_cast<int64_t>(d.col.size()));
    d.label.insert(d.label.end(), ls.begin(), ls.end());
    d.label_ptr.push_back(static_cast<int64_t>(d.label.size()));
  }
  return d;
}

}  // namespace pooch
