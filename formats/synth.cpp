#include "formats/synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/util.h"
#include "runtime/core/error.h"

// Fusing a*b+c into one FMA rounds differently from two operations; keep
// every product and sum separately rounded so the power-law weights and row
// norms carry the same bits whatever the target CPU.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace pooch {

namespace {

constexpr double kLn2 = 0.693147180559945309417;
// ln 2 split so that k * kLn2Hi is exact for |k| < 2^11 (exp's range reduction).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman and Vigna): fast, and its output is defined by
// integer operations alone, unlike std::uniform_int_distribution's.
class Rng {
 public:
  // Independent streams per purpose (and per row), so that changing how one
  // part draws never shifts the numbers another part sees.
  Rng(uint64_t seed, uint64_t stream, uint64_t index = 0) {
    uint64_t x = seed;
    x ^= splitmix64(x) + stream * 0xD1B54A32D192ED03ull;
    x ^= splitmix64(x) + index * 0xAEF17502108EF2D9ull;
    for (auto& v : s_) v = splitmix64(x);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n), unbiased (Lemire's multiply-and-reject), n > 0.
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

enum Stream : uint64_t {
  kLabelCounts = 1,
  kLabelDeal = 2,
  kTestLabels = 3,
  kLabelIds = 4,
  kSignatures = 5,
  kWordIds = 6,
  kTrainRows = 7,
  kTestRows = 8,
};

double det_pow(double x, double a) {
  return synth_exp(a * synth_log(x));
}

int64_t round_half_up(double x) {
  return static_cast<int64_t>(std::floor(x + 0.5));
}

// Draws an index with probability proportional to integer weights, in
// expected O(1): a guide table points each slice of the cumulative weight
// range at the first index that can fall in it (the cutpoint method).
class WeightedSampler {
 public:
  explicit WeightedSampler(const std::vector<uint64_t>& weights) {
    cum_.resize(weights.size());
    uint64_t total = 0;
    for (size_t i = 0; i < weights.size(); ++i) cum_[i] = total += weights[i];
    total_ = total;
    int bits = 1;
    while ((size_t{1} << bits) < 2 * weights.size() && bits < 40) ++bits;
    int total_bits = 64 - __builtin_clzll(total_);
    shift_ = std::max(0, total_bits - bits);
    guide_.resize(static_cast<size_t>(total_ >> shift_) + 1);
    size_t i = 0;
    for (size_t g = 0; g < guide_.size(); ++g) {
      const uint64_t lo = static_cast<uint64_t>(g) << shift_;
      while (i + 1 < cum_.size() && cum_[i] <= lo) ++i;
      guide_[g] = static_cast<uint32_t>(i);
    }
  }
  uint32_t draw(Rng& rng) const {
    const uint64_t u = rng.below(total_);
    size_t i = guide_[u >> shift_];
    while (cum_[i] <= u) ++i;
    return static_cast<uint32_t>(i);
  }

 private:
  std::vector<uint64_t> cum_;
  std::vector<uint32_t> guide_;
  uint64_t total_ = 0;
  int shift_ = 0;
};

void shuffle(std::vector<int32_t>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

std::vector<int32_t> identity_perm(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return v;
}

// Labels per point: 1 + a geometric count with mean lpp - 1, capped at `cap`
// (the cap cuts a tail of probability about e^-7).
std::vector<int32_t> labels_per_point(int64_t rows, double lpp, int64_t cap, Rng& rng) {
  const double extra = std::max(0.0, lpp - 1.0);
  // P(one more label) = extra / (extra + 1), as a 32-bit fixed-point threshold.
  const auto q = static_cast<uint64_t>(std::floor(extra / (extra + 1.0) * 4294967296.0));
  std::vector<int32_t> k(static_cast<size_t>(rows));
  for (auto& v : k) {
    int64_t n = 1;
    while (n < cap && rng.below(uint64_t{1} << 32) < q) ++n;
    v = static_cast<int32_t>(n);
  }
  return k;
}

// Exact training counts for the `present` most frequent labels (ranks), a
// power law max(1, round(c1 r^-beta)) with c1 chosen so they sum to `total`,
// no count above `rows` (a label occurs at most once per point).
std::vector<int64_t> label_counts(int64_t present, int64_t total, int64_t rows, double beta) {
  std::vector<double> w(static_cast<size_t>(present));
  for (int64_t r = 0; r < present; ++r)
    w[static_cast<size_t>(r)] = det_pow(static_cast<double>(r + 1), -beta);
  const auto sum_at = [&](double c1) {
    int64_t s = 0;
    for (int64_t r = 0; r < present; ++r) {
      const double c = c1 * w[static_cast<size_t>(r)];
      if (c < 1.5) return s + (present - r);  // the weights fall: all the rest are 1
      s += std::min<int64_t>(rows, round_half_up(c));
    }
    return s;
  };
  double lo = 0, hi = static_cast<double>(rows);
  for (int it = 0; it < 64; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (sum_at(mid) <= total)
      lo = mid;
    else
      hi = mid;
  }
  std::vector<int64_t> c(static_cast<size_t>(present));
  int64_t s = 0;
  for (int64_t r = 0; r < present; ++r) {
    c[static_cast<size_t>(r)] =
        std::clamp<int64_t>(round_half_up(lo * w[static_cast<size_t>(r)]), 1, rows);
    s += c[static_cast<size_t>(r)];
  }
  // The rounding leaves a small remainder: give it to the head, one each,
  // which keeps the counts non-increasing in rank.
  while (s < total) {
    bool moved = false;
    for (int64_t r = 0; r < present && s < total; ++r)
      if (c[static_cast<size_t>(r)] < rows) {
        ++c[static_cast<size_t>(r)];
        ++s;
        moved = true;
      }
    if (!moved) break;
  }
  return c;
}

bool contains(const int32_t* b, const int32_t* e, int32_t v) {
  return std::find(b, e, v) != e;
}

// Deals label tokens (ranks, each repeated by its count) to points with k[i]
// slots each, so every label occurs exactly its count times; a label dealt
// twice to one point is swapped with a random token elsewhere, or dropped
// when no swap is found. Returns per-point rank lists (CSR).
void deal_labels(const std::vector<int64_t>& counts, const std::vector<int32_t>& k, Rng& rng,
                 std::vector<int64_t>& ptr, std::vector<int32_t>& tok) {
  const size_t rows = k.size();
  ptr.assign(rows + 1, 0);
  for (size_t i = 0; i < rows; ++i) ptr[i + 1] = ptr[i] + k[i];
  tok.clear();
  tok.reserve(static_cast<size_t>(ptr[rows]));
  for (size_t r = 0; r < counts.size(); ++r)
    tok.insert(tok.end(), static_cast<size_t>(counts[r]), static_cast<int32_t>(r));
  shuffle(tok, rng);
  const auto total = static_cast<uint64_t>(tok.size());
  for (size_t i = 0; i < rows; ++i) {
    int32_t* b = tok.data() + ptr[i];
    int32_t* e = tok.data() + ptr[i + 1];
    std::sort(b, e);
    int32_t prev = -1;
    for (int32_t* t = b; t < e; ++t) {
      if (*t != prev) {
        prev = *t;
        continue;
      }
      bool fixed = false;
      for (int attempt = 0; attempt < 64 && !fixed; ++attempt) {
        const uint64_t q = rng.below(total);
        const size_t o = static_cast<size_t>(
            std::upper_bound(ptr.begin(), ptr.end(), static_cast<int64_t>(q)) - ptr.begin() - 1);
        const int32_t other = tok[q];
        if (o == i || other < 0 || contains(b, e, other) ||
            contains(tok.data() + ptr[o], tok.data() + ptr[o + 1], *t))
          continue;
        std::swap(*t, tok[q]);
        fixed = true;
      }
      if (!fixed) *t = -1;  // dropped; removed below
    }
  }
  // Compact away dropped tokens.
  size_t w = 0;
  int64_t start = 0;
  for (size_t i = 0; i < rows; ++i) {
    const int64_t end = ptr[i + 1];
    for (int64_t j = start; j < end; ++j)
      if (tok[static_cast<size_t>(j)] >= 0) tok[w++] = tok[static_cast<size_t>(j)];
    start = end;
    ptr[i + 1] = static_cast<int64_t>(w);
  }
  tok.resize(w);
}

struct Model {
  SynthShape shape;
  int sig = 0;                    // signature size
  std::vector<int32_t> label_id;  // rank -> label id
  std::vector<int32_t> sig_feat;  // [labels x sig] by rank
  std::vector<uint8_t> sig_w;     // weight in tenths, 5..15
  std::vector<int32_t> word_id;   // Zipf rank -> feature id
  int64_t noise = 0;              // mean background words per point
};

// Builds the feature rows of one set from its label ranks.
void make_rows(const Model& m, const WeightedSampler& words, uint64_t seed, uint64_t stream,
               const std::vector<int64_t>& lab_ptr, const std::vector<int32_t>& lab_rank,
               XmcDataset& d) {
  const int64_t rows = static_cast<int64_t>(lab_ptr.size()) - 1;
  const int64_t dim = m.shape.features;
  d.features = dim;
  d.labels = m.shape.labels;
  d.row_ptr.assign(1, 0);
  d.label_ptr.assign(1, 0);
  d.row_ptr.reserve(static_cast<size_t>(rows) + 1);
  d.label_ptr.reserve(static_cast<size_t>(rows) + 1);
  d.col.reserve(static_cast<size_t>(static_cast<double>(rows) * m.shape.features_per_point * 1.1));
  d.val.reserve(d.col.capacity());
  d.label.reserve(lab_rank.size());
  // slot[f] is where feature f sits in the current row when stamp[f] is the
  // row's number: duplicate features merge in O(1) without clearing arrays.
  std::vector<int64_t> stamp(static_cast<size_t>(dim), -1);
  std::vector<int32_t> slot(static_cast<size_t>(dim));
  std::vector<std::pair<int32_t, int32_t>> row;  // feature, weight in tenths
  std::vector<int32_t> ids;
  const int64_t cap = dim / 2;  // keeps the rejection loop below short
  for (int64_t i = 0; i < rows; ++i) {
    Rng rng(seed, stream, static_cast<uint64_t>(i));
    row.clear();
    const auto add = [&](int32_t f, int32_t w) {
      if (stamp[static_cast<size_t>(f)] == i) {
        row[static_cast<size_t>(slot[static_cast<size_t>(f)])].second += w;
        return false;
      }
      stamp[static_cast<size_t>(f)] = i;
      slot[static_cast<size_t>(f)] = static_cast<int32_t>(row.size());
      row.emplace_back(f, w);
      return true;
    };
    for (int64_t j = lab_ptr[i]; j < lab_ptr[i + 1]; ++j) {
      const int64_t r = lab_rank[static_cast<size_t>(j)];
      for (int s = 0; s < m.sig; ++s)
        if (rng.below(4) != 0) {
          const size_t at = static_cast<size_t>(r * m.sig + s);
          add(m.sig_feat[at], m.sig_w[at]);
        }
    }
    // Background words: a count around the mean, each distinct word counted
    // once (a repeated word adds to its value, as a term frequency would).
    const int64_t want = std::min<int64_t>(
        m.noise / 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(m.noise) + 1)),
        std::max<int64_t>(0, cap - static_cast<int64_t>(row.size())));
    int64_t got = 0;
    for (int64_t tries = 0; got < want && tries < 4 * want + 16; ++tries) {
      // Two draws in two statements: the order of evaluation of function
      // arguments differs between compilers, and with it the data.
      const int32_t f = m.word_id[words.draw(rng)];
      const auto w = 1 + static_cast<int32_t>(rng.below(5));
      if (add(f, w)) ++got;
    }
    std::sort(row.begin(), row.end());
    double norm = 0;
    for (const auto& [f, w] : row) norm += static_cast<double>(w) * static_cast<double>(w);
    const double inv = norm > 0 ? 1.0 / std::sqrt(norm) : 1.0;
    for (const auto& [f, w] : row) {
      d.col.push_back(f);
      d.val.push_back(static_cast<float>(static_cast<double>(w) * inv));
    }
    d.row_ptr.push_back(static_cast<int64_t>(d.col.size()));
    ids.clear();
    for (int64_t j = lab_ptr[i]; j < lab_ptr[i + 1]; ++j)
      ids.push_back(m.label_id[static_cast<size_t>(lab_rank[static_cast<size_t>(j)])]);
    std::sort(ids.begin(), ids.end());
    d.label.insert(d.label.end(), ids.begin(), ids.end());
    d.label_ptr.push_back(static_cast<int64_t>(d.label.size()));
  }
}

void check_shape(const SynthShape& s) {
  const auto bad = [&](const std::string& what) {
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("synth: {}", what));
  };
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (s.features < 1 || s.features > kMax) bad("features must lie in [1, 2^31)");
  if (s.labels < 1 || s.labels > kMax) bad("labels must lie in [1, 2^31)");
  if (s.train_rows < 1 || s.test_rows < 0 || s.train_rows > kMax || s.test_rows > kMax)
    bad("train rows must lie in [1, 2^31) and test rows in [0, 2^31)");
  if (!(s.labels_per_point >= 1) || s.labels_per_point > 1000)
    bad("labels per point must lie in [1, 1000]");
  if (!(s.points_per_label >= 1) || s.points_per_label > 1e9)
    bad("points per label must be at least 1");
  if (!(s.features_per_point >= 0) || s.features_per_point > 1e6)
    bad("features per point must lie in [0, 1e6]");
  if (!(s.beta >= 0) || s.beta > 4) bad("beta must lie in [0, 4]");
}

}  // namespace

double synth_log(double x) {
  if (!(x > 0) || !std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  int e = 0;
  double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1): exact
  if (m < 0.70710678118654752440) {
    m *= 2;
    --e;
  }
  // ln m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172: 20 terms reach 1e-30.
  const double s = (m - 1) / (m + 1);
  const double s2 = s * s;
  double term = s, sum = 0;
  for (int k = 1; k <= 41; k += 2) {
    sum += term / k;
    term *= s2;
  }
  return e * kLn2Hi + (e * kLn2Lo + 2 * sum);
}

double synth_exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709) return std::numeric_limits<double>::infinity();
  if (x < -745) return 0;
  // x = k ln2 + r, |r| <= ln2/2; e^r by its Taylor series (r^23/23! < 1e-30).
  const double k = std::floor(x / kLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double term = 1, sum = 1;
  for (int i = 1; i <= 23; ++i) {
    term = term * r / i;
    sum += term;
  }
  return std::ldexp(sum, static_cast<int>(k));
}

const std::vector<SynthPreset>& synth_presets() {
  // features, labels, train, test, labels/point, points/label: REFERENCE.md.
  // Features per point are approximate averages of the repository's BoW
  // files; beta is our choice, giving head labels in roughly the share of
  // points the real sets show (a few % for Amazon-670K, tens of % for
  // Wiki10-31K and AmazonCat-13K).
  static const std::vector<SynthPreset> presets = {
      {"EURLex-4K", {5000, 3993, 15539, 3809, 5.31, 25.7, 236.8, 0.6}},
      {"Wiki10-31K", {101938, 30938, 14146, 6616, 18.64, 8.5, 673.4, 0.7}},
      {"AmazonCat-13K", {203882, 13330, 1186239, 306782, 5.04, 448.6, 71.1, 0.9}},
      {"Wiki-500K", {2381304, 501070, 1813391, 783743, 4.77, 24.8, 385.3, 0.85}},
      {"Amazon-670K", {135909, 670091, 490449, 153025, 5.45, 3.99, 75.7, 0.6}},
      {"Amazon-3M", {337067, 2812281, 1717899, 742507, 36.17, 31.6, 36.0, 0.7}},
  };
  return presets;
}

namespace {

// The presets whose name is `name` (ignoring case), or else those it begins.
std::vector<const SynthPreset*> presets_named(std::string_view name) {
  std::vector<const SynthPreset*> starts;
  for (const auto& p : synth_presets()) {
    if (iequals(p.name, name)) return {&p};
    if (!name.empty() && istarts_with(p.name, name)) starts.push_back(&p);
  }
  return starts;
}

}  // namespace

const SynthPreset* find_synth_preset(std::string_view name) {
  const auto found = presets_named(name);
  return found.size() == 1 ? found[0] : nullptr;
}

SynthShape synth_shape(const SynthPreset& preset, double scale) {
  if (!(scale > 0) || scale > 100)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("synth: scale {} is out of range; use a number in (0, 100], e.g. 0.01 "
                            "for a small set of the same shape",
                            scale));
  const SynthShape& s = preset.shape;
  SynthShape o = s;
  const auto scaled = [&](int64_t v, double f, int64_t floor) {
    return std::clamp<int64_t>(round_half_up(static_cast<double>(v) * f), floor,
                               std::numeric_limits<int32_t>::max());
  };
  o.train_rows = scaled(s.train_rows, scale, 1);
  o.test_rows = scaled(s.test_rows, scale, 1);
  o.labels = scaled(s.labels, scale, 8);
  o.features = scaled(s.features, std::sqrt(scale), 64);
  o.features_per_point = std::min(s.features_per_point, static_cast<double>(o.features / 4));
  return o;
}

SynthData make_synth(std::string_view preset, double scale, const SynthOptions& opts) {
  const SynthPreset* p = find_synth_preset(preset);
  if (!p) {
    const auto several = presets_named(preset);
    std::string names;
    const auto add = [&](const char* n) { names += std::string(names.empty() ? "" : ", ") + n; };
    if (several.empty())
      for (const auto& q : synth_presets()) add(q.name);
    for (const SynthPreset* q : several) add(q->name);
    throw Error(
        POOCH_ERR_INVALID_ARG,
        several.empty()
            ? fmt::format("synth: unknown preset '{}'; choose one of {}", preset, names)
            : fmt::format("synth: preset '{}' could be {}; give more of the name", preset, names));
  }
  return make_synth(synth_shape(*p, scale), opts);
}

SynthData make_synth(const SynthShape& shape, const SynthOptions& opts) {
  check_shape(shape);
  if (opts.signature_features < 0 || opts.signature_features > 4096)
    throw Error(POOCH_ERR_INVALID_ARG, "synth: signature_features must lie in [0, 4096]");
  const uint64_t seed = opts.seed;
  SynthData out;
  out.shape = shape;
  Model m;
  m.shape = shape;
  const int64_t L = shape.labels, D = shape.features, N = shape.train_rows;

  // Labels of the training set.
  Rng count_rng(seed, kLabelCounts);
  const auto k_cap = [&](int64_t present) {
    return std::max<int64_t>(
        1, std::min<int64_t>(present, round_half_up(8 * shape.labels_per_point) + 4));
  };
  // Labels with training points: points x labels/point / points/label.
  int64_t present = std::clamp<int64_t>(
      round_half_up(static_cast<double>(N) * shape.labels_per_point / shape.points_per_label), 1,
      L);
  const std::vector<int32_t> k_train =
      labels_per_point(N, shape.labels_per_point, k_cap(present), count_rng);
  int64_t total = 0;
  for (int32_t v : k_train) total += v;
  present = std::min(present, total);
  const std::vector<int64_t> counts = label_counts(present, total, N, shape.beta);
  Rng deal_rng(seed, kLabelDeal);
  std::vector<int64_t> train_ptr;
  std::vector<int32_t> train_rank;
  deal_labels(counts, k_train, deal_rng, train_ptr, train_rank);

  // Labels of the test set: drawn from the training label occurrences, so
  // test frequencies follow the training ones.
  Rng test_rng(seed, kTestLabels);
  const std::vector<int32_t> k_test =
      labels_per_point(shape.test_rows, shape.labels_per_point, k_cap(present), test_rng);
  std::vector<int64_t> test_ptr{0};
  std::vector<int32_t> test_rank;
  for (int32_t k : k_test) {
    const size_t from = test_rank.size();
    for (int32_t j = 0; j < k && !train_rank.empty(); ++j)
      for (int attempt = 0; attempt < 32; ++attempt) {
        const int32_t r = train_rank[test_rng.below(train_rank.size())];
        if (!contains(test_rank.data() + from, test_rank.data() + test_rank.size(), r)) {
          test_rank.push_back(r);
          break;
        }
      }
    test_ptr.push_back(static_cast<int64_t>(test_rank.size()));
  }

  // Label ids are a random permutation of frequency ranks, as in real data
  // where an id says nothing about how common a label is.
  Rng id_rng(seed, kLabelIds);
  m.label_id = identity_perm(L);
  shuffle(m.label_id, id_rng);

  // Signatures: distinct features per label, weights 0.5 to 1.5.
  m.sig = opts.signature_features > 0
              ? opts.signature_features
              : static_cast<int>(std::clamp<int64_t>(
                    round_half_up(shape.features_per_point / (2 * shape.labels_per_point)), 4, 24));
  m.sig = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(m.sig, D / 4)));
  Rng sig_rng(seed, kSignatures);
  m.sig_feat.resize(static_cast<size_t>(L * m.sig));
  m.sig_w.resize(m.sig_feat.size());
  for (int64_t r = 0; r < L; ++r) {
    int32_t* f = m.sig_feat.data() + r * m.sig;
    for (int s = 0; s < m.sig; ++s) {
      int32_t v;
      do v = static_cast<int32_t>(sig_rng.below(static_cast<uint64_t>(D)));
      while (contains(f, f + s, v));  // sig <= D/4: a few tries at most
      f[s] = v;
      m.sig_w[static_cast<size_t>(r * m.sig + s)] = static_cast<uint8_t>(5 + sig_rng.below(11));
    }
  }

  // Background words: Zipf (exponent 1) over a random order of the features.
  Rng word_rng(seed, kWordIds);
  m.word_id = identity_perm(D);
  shuffle(m.word_id, word_rng);
  std::vector<uint64_t> wweights(static_cast<size_t>(D));
  for (int64_t f = 0; f < D; ++f)
    wweights[static_cast<size_t>(f)] = std::max<uint64_t>(
        1, static_cast<uint64_t>(det_pow(static_cast<double>(f + 1), -1.0) * 1099511627776.0));
  const WeightedSampler words(wweights);
  m.noise = std::max<int64_t>(
      0, round_half_up(shape.features_per_point - shape.labels_per_point * m.sig * 0.75));

  make_rows(m, words, seed, kTrainRows, train_ptr, train_rank, out.train);
  make_rows(m, words, seed, kTestRows, test_ptr, test_rank, out.test);
  return out;
}

}  // namespace pooch
