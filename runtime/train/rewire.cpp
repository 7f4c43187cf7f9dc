#include "rewire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "../../kernels/common/philox.h"
#include "../core/error.h"

namespace pooch {

namespace {

// A counter stream of its own, clear of dropout keys and initialiser streams.
constexpr uint32_t kRewireKey = 0x7E000000u;

int64_t read_index(const std::vector<std::byte>& b, DType dt, size_t i) {
  if (dt == DType::u16) {
    uint16_t v;
    std::memcpy(&v, b.data() + i * 2, 2);
    return v;
  }
  int32_t v;
  std::memcpy(&v, b.data() + i * 4, 4);
  return v;
}

void write_index(std::vector<std::byte>& b, DType dt, size_t i, int64_t v) {
  if (dt == DType::u16) {
    const auto x = static_cast<uint16_t>(v);
    std::memcpy(b.data() + i * 2, &x, 2);
  } else {
    const auto x = static_cast<int32_t>(v);
    std::memcpy(b.data() + i * 4, &x, 4);
  }
}

}  // namespace

RewireResult rewire_fixed_fan_in(Session& s, const std::string& index_name,
                                 const std::string& weight_name, double fraction, uint64_t seed,
                                 uint64_t step) {
  if (!(fraction >= 0 && fraction <= 1))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the rewire fraction must be in [0, 1], got {}", fraction));
  const Graph& g = s.graph();
  const auto ix = g.find(index_name), wx = g.find(weight_name);
  int64_t H = -1;
  if (ix && wx)
    for (const Node& n : g.nodes())
      // The layer alone, or fused with its loss or top-k (same operand order).
      if ((n.op == "ffi_linear" || n.op == "ffi_loss" || n.op == "ffi_topk") &&
          n.inputs[1] == *ix && n.inputs[2] == *wx)
        H = g.tensor(n.inputs[0]).shape.back();
  if (H < 0)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("'{}' and '{}' are not the index and weights of a fixed fan-in layer",
                            index_name, weight_name));
  const TensorDesc& id = g.tensor(*ix);
  const int64_t L = id.shape[0], K = id.shape[1];
  // Regrowth avoids the row's K inputs and the r it prunes: at most H - K new ones.
  const int64_t r = std::min({static_cast<int64_t>(std::llround(fraction * double(K))), K, H - K});
  RewireResult res;
  res.rows = L;
  if (r <= 0 || L == 0) return res;

  std::vector<std::byte> index = s.read_tensor(index_name);
  std::vector<std::byte> wb = s.read_tensor(weight_name);
  std::vector<std::vector<std::byte>> states;
  std::vector<std::string> state_names;
  for (const char* suffix : {".m", ".v", ".momentum"})
    if (g.find(weight_name + suffix)) {
      state_names.push_back(weight_name + suffix);
      states.push_back(s.read_tensor(state_names.back()));
    }
  auto* w = reinterpret_cast<float*>(wb.data());
  std::vector<int64_t> order(static_cast<size_t>(K)), ids(static_cast<size_t>(K)), old;
  std::vector<std::pair<int64_t, size_t>> sorted(static_cast<size_t>(K));
  uint64_t counter = 0;
  for (int64_t row = 0; row < L; ++row) {
    const size_t base = static_cast<size_t>(row * K);
    for (int64_t k = 0; k < K; ++k)
      ids[static_cast<size_t>(k)] = read_index(index, id.dtype, base + k);
    old = ids;
    // The r smallest |w| (ties: the lower slot), pruned.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + r, order.end(), [&](int64_t a, int64_t b) {
      const float x = std::fabs(w[base + a]), y = std::fabs(w[base + b]);
      return x < y || (x == y && a < b);
    });
    for (int64_t j = 0; j < r; ++j) {
      const auto slot = static_cast<size_t>(order[static_cast<size_t>(j)]);
      // A random input the row neither uses nor just pruned (K is small: a
      // scan is enough).
      int64_t pick;
      do {
        const float u = kern::philox_uniform(seed, step, kRewireKey, counter++);
        pick = std::min<int64_t>(H - 1, static_cast<int64_t>(double(u) * double(H)));
      } while (std::find(ids.begin(), ids.end(), pick) != ids.end() ||
               std::find(old.begin(), old.end(), pick) != old.end());
      ids[slot] = pick;
      w[base + slot] = 0.0f;
      for (auto& st : states) reinterpret_cast<float*>(st.data())[base + slot] = 0.0f;
    }
    // Rows stay sorted by input (friendlier gathers), slots moving together.
    for (int64_t k = 0; k < K; ++k)
      sorted[static_cast<size_t>(k)] = {ids[static_cast<size_t>(k)], static_cast<size_t>(k)};
    std::sort(sorted.begin(), sorted.end());
    std::vector<float> wrow(static_cast<size_t>(K));
    std::vector<std::vector<float>> srow(states.size(), std::vector<float>(static_cast<size_t>(K)));
    for (int64_t k = 0; k < K; ++k) {
      const size_t from = base + sorted[static_cast<size_t>(k)].second;
      wrow[static_cast<size_t>(k)] = w[from];
      for (size_t q = 0; q < states.size(); ++q)
        srow[q][static_cast<size_t>(k)] = reinterpret_cast<float*>(states[q].data())[from];
    }
    for (int64_t k = 0; k < K; ++k) {
      write_index(index, id.dtype, base + k, sorted[static_cast<size_t>(k)].first);
      w[base + k] = wrow[static_cast<size_t>(k)];
      for (size_t q = 0; q < states.size(); ++q)
        reinterpret_cast<float*>(states[q].data())[base + k] = srow[q][static_cast<size_t>(k)];
    }
    res.rewired += r;
  }
  s.write_tensor(index_name, index.data(), index.size());
  s.write_tensor(weight_name, wb.data(), wb.size());
  for (size_t q = 0; q < states.size(); ++q)
    s.write_tensor(state_names[q], states[q].data(), states[q].size());
  return res;
}

}  // namespace pooch
