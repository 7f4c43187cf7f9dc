// Row subsets of an XMC data set: the validation part pooch-run train holds
// out of the training set for its learning-rate and stopping decisions; the
// most a batch of rows can hold.
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "xmc_data.h"

namespace pooch {

XmcDataset take_rows(const XmcDataset& d, const std::vector<int64_t>& rows) {
  XmcDataset out;
  out.features = d.features;
  out.labels = d.labels;
  out.dense_dim = d.dense_dim;
  out.row_ptr.reserve(rows.size() + 1);
  out.label_ptr.reserve(rows.size() + 1);
  for (int64_t r : rows) {
    const auto i = static_cast<size_t>(r);
    out.col.insert(out.col.end(), d.col.begin() + d.row_ptr[i], d.col.begin() + d.row_ptr[i + 1]);
    out.val.insert(out.val.end(), d.val.begin() + d.row_ptr[i], d.val.begin() + d.row_ptr[i + 1]);
    out.row_ptr.push_back(static_cast<int64_t>(out.col.size()));
    out.label.insert(out.label.end(), d.label.begin() + d.label_ptr[i],
                     d.label.begin() + d.label_ptr[i + 1]);
    out.label_ptr.push_back(static_cast<int64_t>(out.label.size()));
    if (d.has_dense()) {
      const auto D = static_cast<size_t>(d.dense_dim);
      out.dense.insert(out.dense.end(), d.dense.begin() + static_cast<long>(i * D),
                       d.dense.begin() + static_cast<long>((i + 1) * D));
    }
  }
  return out;
}

void split_rows(const XmcDataset& d, int64_t held_out, uint64_t seed, XmcDataset& rest,
                XmcDataset& held) {
  const int64_t n = d.rows();
  held_out = std::clamp<int64_t>(held_out, 0, n);
  // A seeded Fisher-Yates over explicit integer arithmetic (no std
  // distributions, whose output differs between standard libraries): the
  // same rows are held out on every machine.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
  std::vector<char> is_held(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < held_out; ++i)
    is_held[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  std::vector<int64_t> a, b;
  for (int64_t r = 0; r < n; ++r) (is_held[static_cast<size_t>(r)] ? b : a).push_back(r);
  rest = take_rows(d, a);
  held = take_rows(d, b);
}

int64_t most_in_rows(const std::vector<int64_t>& ptr, int64_t rows) {
  if (ptr.size() < 2 || rows <= 0) return 0;
  std::vector<int64_t> len(ptr.size() - 1);
  for (size_t r = 0; r < len.size(); ++r) len[r] = ptr[r + 1] - ptr[r];
  const auto n = static_cast<std::ptrdiff_t>(std::min(static_cast<size_t>(rows), len.size()));
  std::partial_sort(len.begin(), len.begin() + n, len.end(), std::greater<>());
  return std::accumulate(len.begin(), len.begin() + n, int64_t{0});
}

}  // namespace pooch
