#include "blocked_to_plain.h"

#include <omp.h>

#include <algorithm>

namespace pooch::kern::dnnl_cpu {

std::shared_ptr<const BlockedToPlain> BlockedToPlain::make(const dnnl::memory::desc& from) {
  const dnnl_memory_desc_t& d = from.data;
  if (d.format_kind != dnnl_blocked || d.data_type != dnnl_f32 || d.offset0 != 0 ||
      d.format_desc.blocking.inner_nblks == 0)
    return nullptr;
  auto copy = std::make_shared<const BlockedToPlain>(from);
  const bool fast = copy->shortest_run_ >= 16 && copy->run_gap_ >= 4096 / 4;
  return fast ? copy : nullptr;
}

BlockedToPlain::BlockedToPlain(const dnnl::memory::desc& from) {
  const dnnl_memory_desc_t& d = from.data;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  nd_ = d.ndims;
  for (int i = 0; i < nd_; ++i) {
    dims_[i] = d.dims[i];
    block_[i] = 1;
    src_stride_[i] = b.strides[i];
  }
  for (int k = 0; k < b.inner_nblks; ++k) block_[b.inner_idxs[k]] *= b.inner_blks[k];
  for (int i = 0; i < nd_; ++i) outer_[i] = d.padded_dims[i] / block_[i];
  int64_t s = 1;
  for (int i = nd_ - 1; i >= 0; --i) {
    dst_stride_[i] = s;
    s *= dims_[i];
  }
  for (int k = 0; k < b.inner_nblks; ++k) inner_size_ *= b.inner_blks[k];
  inner_dst_.resize(static_cast<size_t>(inner_size_));
  inner_idx_.resize(static_cast<size_t>(inner_size_ * nd_));
  // Element k of the block: its digits in the inner blocks' sizes, the
  // first block the most significant; a dimension blocked twice (as in
  // OIhw4i16o4i) takes its first block's digit as the more significant.
  for (int64_t k = 0; k < inner_size_; ++k) {
    int64_t digit[DNNL_MAX_NDIMS];
    int64_t rest = k;
    for (int j = b.inner_nblks - 1; j >= 0; --j) {
      digit[j] = rest % b.inner_blks[j];
      rest /= b.inner_blks[j];
    }
    int64_t sub[DNNL_MAX_NDIMS] = {};
    for (int j = 0; j < b.inner_nblks; ++j)
      sub[b.inner_idxs[j]] = sub[b.inner_idxs[j]] * b.inner_blks[j] + digit[j];
    int64_t off = 0;
    for (int i = 0; i < nd_; ++i) {
      off += sub[i] * dst_stride_[i];
      inner_idx_[static_cast<size_t>(k * nd_ + i)] = static_cast<int32_t>(sub[i]);
    }
    inner_dst_[static_cast<size_t>(k)] = off;
  }
  // Visit a block's elements in the plain layout's order: each destination
  // line is then written whole at once, while the block being read (1 KiB
  // for 16 × 16) stays in the cache. In the blocked order a 16 × 16 block
  // would write 16 lines a plain row apart, which (rows of a power of two
  // bytes) share a cache set.
  order_.resize(static_cast<size_t>(inner_size_));
  for (int64_t k = 0; k < inner_size_; ++k) order_[static_cast<size_t>(k)] = k;
  std::sort(order_.begin(), order_.end(), [&](int64_t x, int64_t y) {
    return inner_dst_[static_cast<size_t>(x)] < inner_dst_[static_cast<size_t>(y)];
  });
  sorted_dst_.resize(order_.size());
  for (size_t j = 0; j < order_.size(); ++j)
    sorted_dst_[j] = inner_dst_[static_cast<size_t>(order_[j])];
  shortest_run_ = inner_size_;
  run_gap_ = INT64_MAX;
  size_t start = 0;
  for (size_t j = 1; j <= sorted_dst_.size(); ++j) {
    if (j < sorted_dst_.size() && sorted_dst_[j] == sorted_dst_[j - 1] + 1) continue;
    shortest_run_ = std::min(shortest_run_, static_cast<int64_t>(j - start));
    if (j < sorted_dst_.size()) run_gap_ = std::min(run_gap_, sorted_dst_[j] - sorted_dst_[start]);
    start = j;
  }
}

void BlockedToPlain::run(const float* src, float* dst, int threads) const {
  int64_t blocks = 1;
  for (int i = 0; i < nd_; ++i) blocks *= outer_[i];
  for (int i = 0; i < nd_; ++i)
    if (dims_[i] == 0) return;
  const int64_t* inner_dst = inner_dst_.data();
  const int64_t* order = order_.data();
  const int64_t* sorted_dst = sorted_dst_.data();
#pragma omp parallel for num_threads(threads) if (blocks * inner_size_ > 32768) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t rest = blk, src_off = 0, dst_off = 0;
    bool partial = false;
    int64_t first[DNNL_MAX_NDIMS];
    for (int i = nd_ - 1; i >= 0; --i) {
      const int64_t o = rest % outer_[i];
      rest /= outer_[i];
      first[i] = o * block_[i];
      src_off += o * src_stride_[i];
      dst_off += first[i] * dst_stride_[i];
      partial |= first[i] + block_[i] > dims_[i];
    }
    const float* s = src + src_off;
    float* t = dst + dst_off;
    if (!partial) {
      for (int64_t j = 0; j < inner_size_; ++j) t[sorted_dst[j]] = s[order[j]];
      continue;
    }
    // A block reaching into the padding: only its elements inside the
    // dimensions are copied.
    for (int64_t k = 0; k < inner_size_; ++k) {
      const int32_t* sub = &inner_idx_[static_cast<size_t>(k * nd_)];
      bool inside = true;
      for (int i = 0; i < nd_; ++i) inside &= first[i] + sub[i] < dims_[i];
      if (inside) t[inner_dst[k]] = s[k];
    }
  }
}

}  // namespace pooch::kern::dnnl_cpu
