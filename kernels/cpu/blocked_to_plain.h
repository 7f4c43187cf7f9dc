// A copy from one of oneDNN's blocked f32 layouts back to the plain
// (row-major) one.
//
// oneDNN 2.6's own reorder is fast into blocked weight layouts and slow out
// of them: OIhw16i16o (ABcd16b16a) to plain ran at about 1.3 GB/s here, a
// tenth of the other direction, and it is what every convolution's weight
// gradient goes through (28 ms of a 260 ms ResNet-50 step). This copy takes
// the layout's blocking description once, then moves whole inner blocks,
// reading each contiguously and writing it through a table of plain offsets.
#pragma once
#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace pooch::kern::dnnl_cpu {

class BlockedToPlain {
 public:
  // The copy out of `from` where it beats oneDNN's reorder, else null: a
  // blocked f32 layout whose inner block holds runs of at least 16
  // consecutive plain elements (a whole cache line) at least 4 KiB apart,
  // as the weights of a 1 × 1 convolution with 1024 or more input channels
  // in OIhw16i16o do. There oneDNN's reorder writes 16 lines a multiple of
  // 4 KiB apart, which share a cache set (2048 × 1024: 6.0 ms against 1.2).
  // Elsewhere (shorter runs: a 3 × 3 kernel's weights, nChw16c activations;
  // or closer rows) oneDNN's reorder was as fast or faster here.
  static std::shared_ptr<const BlockedToPlain> make(const dnnl::memory::desc& from);

  // `from` is a blocked f32 descriptor with inner blocks and no offset.
  explicit BlockedToPlain(const dnnl::memory::desc& from);

  void run(const float* src, float* dst, int threads) const;

 private:
  int nd_ = 0;
  int64_t dims_[DNNL_MAX_NDIMS] = {};
  int64_t block_[DNNL_MAX_NDIMS] = {};       // the inner block's extent per dimension
  int64_t outer_[DNNL_MAX_NDIMS] = {};       // blocks per dimension (padded / block)
  int64_t src_stride_[DNNL_MAX_NDIMS] = {};  // between blocks, in the blocked layout
  int64_t dst_stride_[DNNL_MAX_NDIMS] = {};  // between elements, in the plain one
  int64_t inner_size_ = 1;
  // For each element of an inner block, in the blocked order: its plain
  // offset from the block's first element, and its index within the block
  // per dimension (for the blocks that reach into the padding).
  std::vector<int64_t> inner_dst_;
  std::vector<int32_t> inner_idx_;  // inner_size_ × nd_
  // The same elements in the order of their plain offsets: the blocked
  // index of each, and its plain offset.
  std::vector<int64_t> order_, sorted_dst_;
  int64_t shortest_run_ = 0;  // of consecutive plain offsets in sorted_dst_
  int64_t run_gap_ = 0;       // the least distance between two runs' starts
};

}  // namespace pooch::kern::dnnl_cpu
