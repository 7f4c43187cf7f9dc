#include "metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>

#include "runtime/core/error.h"

namespace pooch {

namespace {

[[noreturn]] void invalid(std::string msg) {
  throw Error(POOCH_ERR_INVALID_ARG, "metrics: " + std::move(msg));
}

double value_at(const std::vector<double>& v, int k, int max_k, const char* what) {
  if (v.empty()) invalid(std::string(what) + " needs inverse propensities, none were given");
  if (k < 1 || k > max_k)
    invalid(std::string(what) + "@" + std::to_string(k) + ": k must lie in 1.." +
            std::to_string(max_k));
  return v[static_cast<size_t>(k - 1)];
}

}  // namespace

double XmcMetricsResult::precision_at(int k) const {
  return value_at(precision, k, max_k, "P");
}
double XmcMetricsResult::ndcg_at(int k) const {
  return value_at(ndcg, k, max_k, "nDCG");
}
double XmcMetricsResult::psp_at(int k) const {
  return value_at(psp, k, max_k, "PSP");
}
double XmcMetricsResult::psndcg_at(int k) const {
  return value_at(psndcg, k, max_k, "PSnDCG");
}

std::string XmcMetricsResult::summary() const {
  std::string out;
  auto add = [&](const char* name, const std::vector<double>& v) {
    for (int k : {1, 3, 5}) {
      if (k > max_k || v.empty()) continue;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s@%d %.2f", out.empty() ? "" : " ", name, k,
                    100.0 * v[static_cast<size_t>(k - 1)]);
      out += buf;
    }
  };
  add("P", precision);
  add("nDCG", ndcg);
  add("PSP", psp);
  add("PSnDCG", psndcg);
  return out;
}

XmcMetrics::XmcMetrics(int64_t num_labels, int max_k, const std::vector<double>* inv_propensity)
    : num_labels_(num_labels), max_k_(max_k), inv_p_(inv_propensity) {
  if (num_labels < 1) invalid("num_labels must be ≥ 1, got " + std::to_string(num_labels));
  if (max_k < 1) invalid("max_k must be ≥ 1, got " + std::to_string(max_k));
  if (inv_p_) {
    if (static_cast<int64_t>(inv_p_->size()) != num_labels)
      invalid("inverse propensities hold " + std::to_string(inv_p_->size()) + " values for " +
              std::to_string(num_labels) + " labels");
    for (size_t l = 0; l < inv_p_->size(); ++l) {
      double w = (*inv_p_)[l];
      if (!std::isfinite(w) || w < 0)
        invalid("inverse propensity of label " + std::to_string(l) + " is " + std::to_string(w) +
                ", must be finite and ≥ 0");
    }
  }
  const size_t K = static_cast<size_t>(max_k);
  discount_.resize(K);
  zcum_.resize(K);
  double z = 0;
  for (size_t i = 0; i < K; ++i) {
    discount_[i] = 1.0 / std::log2(static_cast<double>(i) + 2.0);
    z += discount_[i];
    zcum_[i] = z;
  }
  p_sum_.assign(K, 0.0);
  ndcg_sum_.assign(K, 0.0);
  if (inv_p_) {
    psp_num_.assign(K, 0.0);
    psp_den_.assign(K, 0.0);
    psndcg_num_.assign(K, 0.0);
    psndcg_den_.assign(K, 0.0);
  }
}

void XmcMetrics::add_row(const int32_t* top_labels, int k_available, const int32_t* true_labels,
                         int64_t n_true) {
  const int64_t row = rows_;
  auto where = [&] { return "row " + std::to_string(row) + ": "; };
  if (k_available < 0)
    invalid(where() + "negative prediction count " + std::to_string(k_available));
  if (n_true < 0) invalid(where() + "negative true label count " + std::to_string(n_true));
  if (k_available > 0 && !top_labels) invalid(where() + "null predictions");
  if (n_true > 0 && !true_labels) invalid(where() + "null true labels");

  // Validate everything before touching the sums, so a throw leaves the accumulator unchanged.
  true_sorted_.assign(true_labels, true_labels + n_true);
  for (int32_t l : true_sorted_)
    if (l < 0 || l >= num_labels_)
      invalid(where() + "true label " + std::to_string(l) + " outside [0, " +
              std::to_string(num_labels_) + ")");
  std::sort(true_sorted_.begin(), true_sorted_.end());
  if (auto it = std::adjacent_find(true_sorted_.begin(), true_sorted_.end());
      it != true_sorted_.end())
    invalid(where() + "true label " + std::to_string(*it) + " appears twice");

  const int m = std::min(k_available, max_k_);  // predictions that count
  pred_sorted_.assign(top_labels, top_labels + m);
  for (int32_t l : pred_sorted_)
    if (l < 0 || l >= num_labels_)
      invalid(where() + "predicted label " + std::to_string(l) + " outside [0, " +
              std::to_string(num_labels_) + ")");
  std::sort(pred_sorted_.begin(), pred_sorted_.end());
  if (auto it = std::adjacent_find(pred_sorted_.begin(), pred_sorted_.end());
      it != pred_sorted_.end())
    invalid(where() + "predicted label " + std::to_string(*it) + " appears twice in the top " +
            std::to_string(m));

  // The propensity-ideal ranking: the row's true labels by decreasing weight (top max_k only).
  const int n_best = static_cast<int>(std::min<int64_t>(n_true, max_k_));
  if (inv_p_) {
    true_w_.clear();
    for (int32_t l : true_sorted_) true_w_.push_back((*inv_p_)[static_cast<size_t>(l)]);
    std::partial_sort(true_w_.begin(), true_w_.begin() + n_best, true_w_.end(),
                      std::greater<double>());
  }

  double hits = 0, dcg = 0, ps = 0, psdcg = 0, best = 0, bestdcg = 0;
  for (int i = 0; i < max_k_; ++i) {
    const size_t k = static_cast<size_t>(i);  // index of "@(i+1)"
    if (i < m) {
      const int32_t l = top_labels[i];
      if (std::binary_search(true_sorted_.begin(), true_sorted_.end(), l)) {
        hits += 1;
        dcg += discount_[k];
        if (inv_p_) {
          const double w = (*inv_p_)[static_cast<size_t>(l)];
          ps += w;
          psdcg += w * discount_[k];
        }
      }
    }
    if (inv_p_ && i < n_best) {
      best += true_w_[k];
      bestdcg += true_w_[k] * discount_[k];
    }
    p_sum_[k] += hits / static_cast<double>(i + 1);
    if (n_true > 0) {
      const double z = zcum_[static_cast<size_t>(std::min<int64_t>(i + 1, n_true) - 1)];
      ndcg_sum_[k] += dcg / z;
      if (inv_p_) {
        psp_num_[k] += ps;
        psp_den_[k] += best;
        psndcg_num_[k] += psdcg / z;
        psndcg_den_[k] += bestdcg / z;
      }
    }
  }
  ++rows_;
  if (n_true == 0) ++empty_rows_;
}

void XmcMetrics::merge(const XmcMetrics& o) {
  if (o.num_labels_ != num_labels_ || o.max_k_ != max_k_ || o.inv_p_ != inv_p_)
    invalid("merge: the two accumulators differ in num_labels, max_k or propensities");
  auto add = [](std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  };
  add(p_sum_, o.p_sum_);
  add(ndcg_sum_, o.ndcg_sum_);
  add(psp_num_, o.psp_num_);
  add(psp_den_, o.psp_den_);
  add(psndcg_num_, o.psndcg_num_);
  add(psndcg_den_, o.psndcg_den_);
  rows_ += o.rows_;
  empty_rows_ += o.empty_rows_;
}

XmcMetricsResult XmcMetrics::result() const {
  XmcMetricsResult r;
  r.rows = rows_;
  r.empty_rows = empty_rows_;
  r.max_k = max_k_;
  r.has_propensity = inv_p_ != nullptr;
  const size_t K = static_cast<size_t>(max_k_);
  const double n = static_cast<double>(rows_);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  r.precision.resize(K);
  r.ndcg.resize(K);
  for (size_t k = 0; k < K; ++k) {
    r.precision[k] = ratio(p_sum_[k], n);
    r.ndcg[k] = ratio(ndcg_sum_[k], n);
  }
  if (inv_p_) {
    r.psp.resize(K);
    r.psndcg.resize(K);
    for (size_t k = 0; k < K; ++k) {
      r.psp[k] = ratio(psp_num_[k], psp_den_[k]);
      r.psndcg[k] = ratio(psndcg_num_[k], psndcg_den_[k]);
    }
  }
  return r;
}

std::vector<double> inverse_propensities(const std::vector<int64_t>& label_counts, int64_t n_train,
                                         double A, double B) {
  if (n_train < 1)
    invalid("inverse_propensities: n_train must be ≥ 1, got " + std::to_string(n_train));
  if (!std::isfinite(A) || A < 0)
    invalid("inverse_propensities: A must be finite and ≥ 0, got " + std::to_string(A));
  if (!std::isfinite(B) || B <= -1)
    invalid("inverse_propensities: B must be finite and > -1, got " + std::to_string(B));
  const double C = (std::log(static_cast<double>(n_train)) - 1.0) * std::pow(B + 1.0, A);
  std::vector<double> w(label_counts.size());
  for (size_t l = 0; l < label_counts.size(); ++l) {
    const int64_t c = label_counts[l];
    if (c < 0 || c > n_train)
      invalid("inverse_propensities: label " + std::to_string(l) + " has count " +
              std::to_string(c) + ", outside [0, " + std::to_string(n_train) + "]");
    const double base = static_cast<double>(c) + B;
    if (!(base > 0))
      invalid("inverse_propensities: label " + std::to_string(l) +
              ": N_l + B = " + std::to_string(base) + " must be > 0");
    w[l] = 1.0 + C * std::pow(base, -A);
  }
  return w;
}

namespace {

// The propensity constants (A, B) of the Extreme Classification Repository
// (http://manikvarma.org/downloads/XC/XMLRepository.html, "Propensity scored
// metrics"; Jain, Prabhu and Varma, "Extreme Multi-label Loss Functions for
// Recommendation, Tagging, Ranking & Other Missing Label Applications", KDD
// 2016, section 5): A = 0.5, B = 0.4 for the Wikipedia-LSHTC-derived sets
// (WikiLSHTC-325K, Wiki-500K, WikiSeeAlso, WikiTitles); A = 0.6, B = 2.6 for
// the Amazon sets (Amazon-670K, Amazon-3M, AmazonTitles); A = 0.55, B = 1.5
// for all others (EURLex-4K, Wiki10-31K, AmazonCat-13K, Debtags, ...).
// A name matches a row when it contains the row's key (lower case, letters
// and digits only); the first matching row wins, so the "others" that share a
// prefix with a special family (Wiki10, AmazonCat) come first.
struct PropensityRow {
  const char* key;
  double a, b;
};
constexpr PropensityRow kPropensityTable[] = {
    {"wiki10", 0.55, 1.5},     // Wiki10-31K: not Wikipedia-LSHTC-derived
    {"amazoncat", 0.55, 1.5},  // AmazonCat-13K: "all others"
    {"wiki", 0.5, 0.4},        // WikiLSHTC-325K, Wiki-500K, Wikipedia-500K, WikiSeeAlso, ...
    {"amazon", 0.6, 2.6},      // Amazon-670K, Amazon-3M, AmazonTitles-*
};
constexpr PropensityRow kPropensityOthers = {"", 0.55, 1.5};

}  // namespace

std::pair<double, double> default_propensity_ab(std::string_view dataset_name) {
  std::string s;  // lower case, letters and digits only: "Wiki10-31K" -> "wiki1031k"
  for (char ch : dataset_name) {
    const auto u = static_cast<unsigned char>(ch);
    if (std::isalnum(u)) s += static_cast<char>(std::tolower(u));
  }
  for (const PropensityRow& r : kPropensityTable)
    if (s.find(r.key) != std::string::npos) return {r.a, r.b};
  return {kPropensityOthers.a, kPropensityOthers.b};
}

}  // namespace pooch
