#include "arena_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "../../kernels/common/util.h"
#include "../core/error.h"

namespace pooch {

namespace {

std::string request_label(std::span<const BufferRequest> requests, size_t i) {
  const std::string& name = requests[i].name;
  return name.empty() ? fmt::format("buffer request #{}", i)
                      : fmt::format("buffer request #{} ('{}')", i, name);
}

struct Block {
  size_t offset;
  size_t size;
};

// Free space below the current top of the arena, kept sorted by offset with
// neighbours always merged, so a free block never touches another one.
class FreeList {
 public:
  void release(size_t offset, size_t size) {
    auto next = std::lower_bound(blocks_.begin(), blocks_.end(), offset,
                                 [](const Block& b, size_t off) { return b.offset < off; });
    if (next != blocks_.begin()) {
      auto prev = std::prev(next);
      if (prev->offset + prev->size == offset) {
        prev->size += size;
        if (next != blocks_.end() && prev->offset + prev->size == next->offset) {
          prev->size += next->size;
          blocks_.erase(next);
        }
        return;
      }
    }
    if (next != blocks_.end() && offset + size == next->offset) {
      next->offset = offset;
      next->size += size;
      return;
    }
    blocks_.insert(next, Block{offset, size});
  }

  // Best fit: the smallest block that holds `size`; among equals the lowest,
  // because scanning in offset order only replaces on a strictly smaller fit.
  // When nothing fits, a free block that ends at the top is grown upwards
  // instead of leaving it as a hole under a fresh block.
  size_t take(size_t size, size_t& top) {
    size_t best = blocks_.size();
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].size >= size &&
          (best == blocks_.size() || blocks_[i].size < blocks_[best].size))
        best = i;
    if (best != blocks_.size()) {
      Block& b = blocks_[best];
      const size_t offset = b.offset;
      b.offset += size;
      b.size -= size;
      if (b.size == 0) blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(best));
      return offset;
    }
    size_t offset = top;
    if (!blocks_.empty() && blocks_.back().offset + blocks_.back().size == top) {
      offset = blocks_.back().offset;
      blocks_.pop_back();
    }
    top = offset + size;
    return offset;
  }

 private:
  std::vector<Block> blocks_;
};

void validate(std::span<const BufferRequest> requests, size_t alignment) {
  if (alignment == 0)
    throw Error(POOCH_ERR_INVALID_ARG,
                "arena plan: alignment is 0; pass the backend's alignment (caps().alignment), "
                "which is at least 1");
  const size_t n = requests.size();
  for (size_t i = 0; i < n; ++i) {
    const BufferRequest& r = requests[i];
    if (r.first < 0 || r.last < r.first)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("arena plan: {} has the live interval [{}, {}]; the first position "
                              "must be at least 0 and not after the last",
                              request_label(requests, i), r.first, r.last));
    if (static_cast<int>(r.role) >= kNumRoles)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("arena plan: {} has role {}, which is not a tensor role",
                              request_label(requests, i), static_cast<int>(r.role)));
    if (r.inplace_of < -1 || r.inplace_of >= static_cast<int>(n) ||
        r.inplace_of == static_cast<int>(i))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("arena plan: {} names request {} for in-place reuse; it must be -1 "
                              "or another request's index (0..{})",
                              request_label(requests, i), r.inplace_of, n - 1));
    // Half the address space leaves room to round up and to add the next
    // block's offset without wrapping.
    if (r.bytes > std::numeric_limits<size_t>::max() / 2)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("arena plan: {} asks for {} bytes, more than any address space holds",
                              request_label(requests, i), r.bytes));
  }
}

}  // namespace

ArenaPlan plan_arena(std::span<const BufferRequest> requests, size_t alignment) {
  validate(requests, alignment);
  const size_t n = requests.size();
  ArenaPlan plan;
  plan.offsets.assign(n, 0);

  // Every buffer occupies whole alignment units, since the next offset is
  // aligned anyway. Peak and live peak both count in these units, so the
  // peak can never fall below the live peak.
  std::vector<size_t> block_bytes(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = requests[i].bytes;
    block_bytes[i] = b == 0 ? 0 : align_up(b, alignment);
    plan.bytes_by_role[static_cast<int>(requests[i].role)] += b;
  }

  // Requests in the order they start; the index breaks ties so the result
  // depends on nothing but the input.
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (block_bytes[i] != 0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].first < requests[b].first; });

  // Live blocks: an in-place reuse hands the front of a block to a new
  // request, so a block is not always one request's whole buffer.
  // `reusable`: the block is still its request's whole buffer, so an in-place
  // successor may take it (at most one does).
  struct Live {
    size_t offset;
    size_t size;
    bool reusable;
  };
  std::vector<Live> live;
  live.reserve(order.size());
  std::vector<size_t> block_of(n, SIZE_MAX);  // request -> its entry in `live`
  using Due = std::pair<int, size_t>;         // (last, live index): released once past `last`
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due;

  FreeList free_list;
  size_t top = 0;
  // Change of live bytes at each position; a buffer written in place of
  // another shares its bytes at that position, so the pair counts once.
  // (A vector over the positions, not a map: the planner places a step's
  // buffers some hundred times while it searches, and the map's lookups were
  // a third of its time.)
  int last_position = 0;
  for (const size_t i : order)
    last_position =
        std::max({last_position, requests[i].first,
                  requests[i].last == kLiveForever ? requests[i].first : requests[i].last});
  std::vector<int64_t> live_delta(static_cast<size_t>(last_position) + 2, 0);

  for (const size_t i : order) {
    const BufferRequest& r = requests[i];
    const int pos = r.first;
    while (!due.empty() && due.top().first < pos) {
      Live& l = live[due.top().second];
      due.pop();
      if (l.size != 0) free_list.release(l.offset, l.size);
      l.size = 0;
      l.reusable = false;
    }

    const size_t need = block_bytes[i];
    bool in_place = false;
    if (r.inplace_of >= 0) {
      const size_t j = static_cast<size_t>(r.inplace_of);
      if (block_of[j] != SIZE_MAX && live[block_of[j]].reusable && requests[j].last == pos &&
          live[block_of[j]].size >= need) {
        Live& jl = live[block_of[j]];
        plan.offsets[i] = jl.offset;
        // The rest of j's block stays busy until j dies, then frees as usual.
        jl.offset += need;
        jl.size -= need;
        jl.reusable = false;
        in_place = true;
        live_delta[static_cast<size_t>(pos)] -= static_cast<int64_t>(need);
        live_delta[static_cast<size_t>(pos) + 1] += static_cast<int64_t>(need);
      }
    }
    if (!in_place) {
      const size_t old_top = top;
      plan.offsets[i] = free_list.take(need, top);
      if (top < old_top || top < plan.offsets[i])
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("arena plan: placing {} ({} bytes) overflows the address space",
                                request_label(requests, i), r.bytes));
    }
    live.push_back(Live{plan.offsets[i], need, true});
    block_of[i] = live.size() - 1;
    if (r.last != kLiveForever) due.push({r.last, live.size() - 1});

    live_delta[static_cast<size_t>(pos)] += static_cast<int64_t>(need);
    if (r.last != kLiveForever)
      live_delta[static_cast<size_t>(r.last) + 1] -= static_cast<int64_t>(need);
  }

  plan.peak = top;
  int64_t running = 0;
  for (const int64_t delta : live_delta) {
    running += delta;
    plan.live_peak = std::max(plan.live_peak, static_cast<size_t>(std::max<int64_t>(running, 0)));
  }
  return plan;
}

std::string ArenaPlan::report() const {
  std::string roles;
  for (int r = 0; r < kNumRoles; ++r)
    roles += fmt::format("{}{} {:.2f} MiB", r == 0 ? "" : ", ", role_name(static_cast<Role>(r)),
                         to_mib(bytes_by_role[r]));
  return fmt::format(
      "arena plan: {} buffers, peak {:.2f} MiB ({} bytes), live peak {:.2f} MiB "
      "(the floor any placement needs); by role: {}.",
      offsets.size(), to_mib(peak), peak, to_mib(live_peak), roles);
}

void check_budget(const ArenaPlan& plan, size_t budget, std::string_view what) {
  if (plan.peak <= budget) return;
  throw OutOfBudget(
      plan.peak,
      fmt::format("{} needs {} bytes ({} MiB) of device memory but the budget is {} "
                  "bytes ({:.2f} MiB); it needs a budget of at least {} MiB, or a smaller "
                  "step (a smaller batch size)",
                  what, plan.peak, mib_ceil(plan.peak), budget, to_mib(budget),
                  mib_ceil(plan.peak)));
}

}  // namespace pooch
