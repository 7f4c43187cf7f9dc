// Extreme multi-label classification metrics: P@k, nDCG@k, PSP@k and PSnDCG@k,
// accumulated one test row at a time.
//
// Definitions (k = 1..max_k, y = the row's true labels, r_i = the i-th predicted label, best first,
// w_l = 1/p_l the inverse propensity of label l):
//
//   P@k      = (1/k) Σ_{i≤k} [r_i ∈ y]                          averaged over all rows
//   nDCG@k   = Σ_{i≤k} [r_i ∈ y]/log2(i+1)  /  Z(k, |y|)        averaged over all rows,
//              Z(k, n) = Σ_{i≤min(k,n)} 1/log2(i+1); a row with no true label scores 0
//   PSP@k    = Σ_rows Σ_{i≤k} [r_i ∈ y]·w_{r_i}  /  Σ_rows Σ_{i≤min(k,|y|)} w*_i
//              where w*_1 ≥ w*_2 ≥ ... are the row's true labels' weights, sorted:
//              the best achievable ranking. This is a ratio of sums over the whole test
//              set, not a mean of per-row ratios: it is pyxclib's definition
//              (xclib/evaluation/xc_metrics.py, psprecision: mean of the weighted
//              precision@k over rows divided by the mean of the same for the
//              propensity-ideal ranking; the 1/k and 1/rows cancel).
//   PSnDCG@k = Σ_rows psDCG_row@k / Z(k,|y|)  /  Σ_rows psDCG*_row@k / Z(k,|y|)
//              with psDCG@k = Σ_{i≤k} [r_i ∈ y]·w_{r_i}/log2(i+1) and psDCG* the same for the
//              propensity-ideal ranking (pyxclib's psndcg). Empty rows add 0 to both sums.
//
// Rows with no true labels (the BoW format allows them): they count as a row with 0 hits, so
// they pull P@k and nDCG@k down (nDCG normaliser of an empty row: the row scores 0) and add 0
// to both sums of PSP/PSnDCG. This is what the Extreme Classification Repository's tools and
// pyxclib's precision/ndcg do (they average over every row of the test label matrix), so the
// numbers stay comparable with published ones. empty_rows in the result says how many
// there were, so a caller can rescale if it wants the "labelled rows only" figure.
//
// Fewer than max_k predictions for a row (k_available < k): the missing positions are misses
// (pyxclib pads with a label that is never true). Predictions past max_k are ignored.
//
// Thread use: one XmcMetrics per thread (it keeps scratch buffers), then merge().
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pooch {

struct XmcMetricsResult {
  int64_t rows = 0;        // rows added
  int64_t empty_rows = 0;  // rows with no true label (counted in every average, see above)
  int max_k = 0;
  bool has_propensity = false;
  // Index k-1 holds the value at k, for k = 1..max_k; psp/psndcg are empty without propensities.
  std::vector<double> precision, ndcg, psp, psndcg;

  // The value at k; Error POOCH_ERR_INVALID_ARG when k is outside 1..max_k, or for psp/psndcg
  // when no propensities were given.
  double precision_at(int k) const;
  double ndcg_at(int k) const;
  double psp_at(int k) const;
  double psndcg_at(int k) const;

  // "P@1 83.12 P@3 70.40 P@5 58.20 nDCG@1 ... PSP@1 ..." (percent, two decimals) over k = 1, 3, 5
  // (those that are ≤ max_k).
  std::string summary() const;
};

class XmcMetrics {
 public:
  // num_labels: the label space (labels must lie in [0, num_labels)). max_k ≥ 1.
  // inv_propensity: null, or one inverse propensity per label (size num_labels, each finite
  // and ≥ 0); it is not copied and must outlive this object.
  XmcMetrics(int64_t num_labels, int max_k = 5,
             const std::vector<double>* inv_propensity = nullptr);

  // One test row. top_labels[0..k_available) are the predictions, best first (may be null when
  // k_available is 0); true_labels[0..n_true) the row's true labels in any order (may be null
  // when n_true is 0). Error POOCH_ERR_INVALID_ARG, naming the row (0-based count of rows added
  // so far) and the label, for a label outside [0, num_labels), a label repeated within the
  // true labels or within the first max_k predictions, or a negative count; the accumulator
  // is then unchanged.
  void add_row(const int32_t* top_labels, int k_available, const int32_t* true_labels,
               int64_t n_true);

  // Adds another accumulator's rows (same num_labels, max_k and propensity vector, else
  // Error POOCH_ERR_INVALID_ARG).
  void merge(const XmcMetrics& other);

  XmcMetricsResult result() const;
  int64_t rows() const { return rows_; }
  int max_k() const { return max_k_; }

 private:
  int64_t num_labels_;
  int max_k_;
  const std::vector<double>* inv_p_;
  int64_t rows_ = 0, empty_rows_ = 0;
  std::vector<double> discount_;  // discount_[i] = 1/log2(i+2), i.e. the weight of rank i+1
  std::vector<double> zcum_;      // zcum_[i] = Σ_{j≤i} discount_[j]
  // Per k (index k-1): sums over rows.
  std::vector<double> p_sum_, ndcg_sum_, psp_num_, psp_den_, psndcg_num_, psndcg_den_;
  // Scratch (per row).
  std::vector<int32_t> true_sorted_, pred_sorted_;
  std::vector<double> true_w_;
};

// Jain et al. 2016 inverse propensities, one per label:
//   1/p_l = 1 + C·(N_l + B)^(−A),  C = (ln N − 1)·(B + 1)^A
// N = n_train (training points), N_l = label_counts[l] (training points with label l).
// Error POOCH_ERR_INVALID_ARG when n_train < 1, a count is negative or above n_train, A or B is
// not finite, A < 0, B ≤ −1, or N_l + B ≤ 0 for some label (the power would be infinite).
std::vector<double> inverse_propensities(const std::vector<int64_t>& label_counts, int64_t n_train,
                                         double A, double B);

// The usual (A, B) for a data set, chosen by its name (case and punctuation
// ignored) from the Extreme Classification Repository's table (metrics.cpp
// cites it): Wikipedia-LSHTC-derived sets (WikiLSHTC-325K, Wiki-500K,
// WikiSeeAlso, WikiTitles) -> (0.5, 0.4); Amazon sets (Amazon-670K, Amazon-3M,
// AmazonTitles) -> (0.6, 2.6); all others (EURLex-4K, Wiki10-31K,
// AmazonCat-13K, Debtags, an empty name) -> (0.55, 1.5). Pass explicit A, B
// to inverse_propensities to override.
std::pair<double, double> default_propensity_ab(std::string_view dataset_name);

}  // namespace pooch
