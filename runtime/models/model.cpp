#include "model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "../../kernels/common/philox.h"

namespace pooch {

const IoTensor* Model::find_input(std::string_view name) const {
  for (const IoTensor& t : inputs)
    if (same_name(t.name, name)) return &t;
  return nullptr;
}

const IoTensor* Model::find_output(std::string_view name) const {
  for (const IoTensor& t : outputs)
    if (same_name(t.name, name)) return &t;
  return nullptr;
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

Model model_from_graph(Graph g, uint64_t seed) {
  Model m;
  m.seed = seed;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (d.role == Role::input) m.inputs.push_back({d.name, static_cast<TensorId>(t)});
  }
  for (TensorId o : g.outputs()) m.outputs.push_back({g.tensor(o).name, o});
  m.graph = std::move(g);
  return m;
}

namespace {

// The inputs already picked for one row of a fan-in index: a bitmap over
// [0, H) when that costs no more than a few bytes per pick (or 8 MiB), else
// a hash set. clear() forgets one row's picks in O(K).
class PickedSet {
 public:
  PickedSet(int64_t H, int64_t K) {
    constexpr int64_t kBitmapBits = int64_t{1} << 26;
    if (H <= kBitmapBits || H <= 64 * K)
      bits_.assign(static_cast<size_t>((H + 63) / 64), 0);
    else
      set_.reserve(static_cast<size_t>(K));
  }
  // False when `v` was there already.
  bool insert(int32_t v) {
    if (bits_.empty()) return set_.insert(v).second;
    uint64_t& word = bits_[static_cast<size_t>(v) / 64];
    const uint64_t bit = uint64_t{1} << (static_cast<uint32_t>(v) % 64);
    if (word & bit) return false;
    word |= bit;
    return true;
  }
  void clear(const std::vector<int32_t>& picked) {
    if (bits_.empty()) {
      set_.clear();
      return;
    }
    for (int32_t v : picked) bits_[static_cast<size_t>(v) / 64] = 0;
  }

 private:
  std::vector<uint64_t> bits_;
  std::unordered_set<int32_t> set_;
};

}  // namespace

std::vector<std::byte> initial_value(const TensorDesc& d, const WeightInit& w, uint64_t seed,
                                     int threads) {
  std::vector<std::byte> out(d.bytes());
  const auto n = static_cast<size_t>(d.numel());
  const uint32_t key = w.stream;
  switch (w.kind) {
    case WeightInit::Kind::zeros:
      break;
    case WeightInit::Kind::constant: {
      const float v = static_cast<float>(w.a);
      for (size_t i = 0; i < n; ++i) std::memcpy(out.data() + i * 4, &v, 4);
      break;
    }
    case WeightInit::Kind::uniform: {
      for (size_t i = 0; i < n; ++i) {
        const float u = kern::philox_uniform(seed, 0, key, i);
        const float v = static_cast<float>((2.0 * u - 1.0) * w.a);
        std::memcpy(out.data() + i * 4, &v, 4);
      }
      break;
    }
    case WeightInit::Kind::normal: {
      // Box-Muller over pairs of counter-based uniforms: element i takes
      // the cosine or sine half of pair i/2, so a value depends on its index
      // alone, and the pairs can be drawn in parallel (GPT-2 124M draws 124 M
      // values; one thread takes seconds).
      float* v = reinterpret_cast<float*>(out.data());
      const auto pairs = static_cast<int64_t>((n + 1) / 2);
#pragma omp parallel for num_threads(std::max(1, threads)) if (pairs > 65536) schedule(static)
      for (int64_t pair = 0; pair < pairs; ++pair) {
        const auto k = static_cast<uint64_t>(pair);
        const double u1 = 1.0 - static_cast<double>(kern::philox_uniform(seed, 0, key, 2 * k));
        const double u2 = static_cast<double>(kern::philox_uniform(seed, 0, key, 2 * k + 1));
        const double r = std::sqrt(-2.0 * std::log(u1)), t = 6.283185307179586 * u2;
        const size_t i = 2 * static_cast<size_t>(pair);
        v[i] = static_cast<float>(w.a * (r * std::cos(t)));
        if (i + 1 < n) v[i + 1] = static_cast<float>(w.a * (r * std::sin(t)));
      }
      break;
    }
    case WeightInit::Kind::positions: {
      const int64_t last = d.shape.empty() ? 1 : d.shape.back();
      for (size_t i = 0; i < n; ++i) {
        const auto v = static_cast<int32_t>(static_cast<int64_t>(i) % std::max<int64_t>(last, 1));
        std::memcpy(out.data() + i * 4, &v, 4);
      }
      break;
    }
    case WeightInit::Kind::fan_in_index: {
      // K distinct inputs per row, by Floyd's sampling: K draws per row
      // whatever H is (a shuffle of [0, H) per row would cost L*H). The
      // membership test is a bitmap over [0, H) reused across rows (only the
      // picked bits are cleared), or a hash set when H is much wider than K,
      // so a row costs O(K) (plus the sort).
      const int64_t rows = d.shape[0], K = d.shape[1], H = static_cast<int64_t>(w.a);
      std::vector<int32_t> pick(static_cast<size_t>(K));
      PickedSet picked(H, K);
      uint64_t counter = 0;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t n = 0;
        for (int64_t j = H - K; j < H; ++j) {
          const float u = kern::philox_uniform(seed, 0, key, counter++);
          auto t =
              static_cast<int32_t>(std::min<int64_t>(j, static_cast<int64_t>(u * double(j + 1))));
          // j itself is never picked yet: every earlier pick is below it.
          if (!picked.insert(t)) {
            t = static_cast<int32_t>(j);
            picked.insert(t);
          }
          pick[static_cast<size_t>(n++)] = t;
        }
        picked.clear(pick);
        std::sort(pick.begin(), pick.end());  // ascending: friendlier gathers
        for (int64_t k = 0; k < K; ++k) {
          const size_t at = static_cast<size_t>(r * K + k);
          if (d.dtype == DType::u16) {
            const auto v = static_cast<uint16_t>(pick[static_cast<size_t>(k)]);
            std::memcpy(out.data() + at * 2, &v, 2);
          } else {
            std::memcpy(out.data() + at * 4, &pick[static_cast<size_t>(k)], 4);
          }
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace pooch
