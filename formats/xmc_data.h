// An extreme multi-label data set in memory: features and labels per row,
// both in CSR form. Features are either sparse (CSR row_ptr/col/val) or, for
// data read from a NumPy .npy file, dense (`dense`, row-major rows x dense_dim;
// row_ptr then holds rows + 1 zeros so that rows() still counts the points).
#pragma once
#include <cstdint>
#include <vector>

namespace pooch {

struct XmcDataset {
  int64_t features = 0;
  int64_t labels = 0;
  std::vector<int64_t> row_ptr{0};  // rows + 1
  std::vector<int32_t> col;
  std::vector<float> val;
  std::vector<int64_t> label_ptr{0};  // rows + 1
  std::vector<int32_t> label;
  std::vector<float> dense;  // rows * dense_dim when has_dense()
  int64_t dense_dim = 0;     // == features when the features are dense

  int64_t rows() const { return static_cast<int64_t>(row_ptr.size()) - 1; }
  bool has_dense() const { return dense_dim > 0; }
};

// A small problem whose labels are exactly predictable from the features:
// every label owns a few "topic" features; a point draws 1-3 labels (lower
// ids more often) and carries a few topic features of each, plus noise.
struct PlantedParams {
  int64_t rows = 2048;
  int64_t features = 1000;
  int64_t labels = 200;
  int topic_features = 4;  // features owned by each label
  int noise_features = 3;  // random features per point
  uint64_t seed = 1;
};

XmcDataset make_planted(const PlantedParams& p);

// Rows `rows` of `d` (in that order) as a data set of the same width and labels.
XmcDataset take_rows(const XmcDataset& d, const std::vector<int64_t>& rows);

// `held_out` rows drawn at random (by `seed`) as `held`, the others as
// `rest`; each keeps the rows' order in `d`.
void split_rows(const XmcDataset& d, int64_t held_out, uint64_t seed, XmcDataset& rest,
                XmcDataset& held);

// The most entries `rows` rows of a CSR array hold together (`ptr` its rows + 1
// offsets: row_ptr for the nonzeros, label_ptr for the labels): what a batch
// of that many rows may need at most. 0 for no rows.
int64_t most_in_rows(const std::vector<int64_t>& ptr, int64_t rows);

}  // namespace pooch
