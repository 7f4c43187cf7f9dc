// Fast f32 kernels of the fused fixed fan-in output layer (ffi_loss,
// ffi_loss_grad, ffi_topk; runtime/core/ops/ffi_head_ops.cpp).
// ffi_loss_grad sums the loss terms as ffi_loss does, slice by slice in the
// same order, so its loss output is bitwise ffi_loss's.
//
// Layout: the input h[B,H] is transposed once into blocks of bw rows (bw, the
// call's width: the batch rounded up to 16, 32, 64 or 128, and 128 past
// that), hT[blocks][H][bw], padding rows zero. Label l's logits for one block
// are z[0..bw) = b[l] + sum_k w[l,k] * hT[block][index[l,k]][:]: K
// contiguous rows of the block, one FMA per lane. The labels are split into
// contiguous ranges, one per thread; each thread takes the blocks in turn
// and, within a block, its labels in order. A label's logits for a block
// live only in a tile, turned at once into their loss terms, their gradient
// g, db[l] += sum g, dw[l,k] += g . hT[block][u] and dhT[block][u] +=
// w[l,k] g (dhT per thread, summed in thread order at the end). The loops
// over a slice's labels (absent_labels_grad, absent_labels_loss,
// topk_labels) form the logits of two or four labels in one pass over k, so
// that their chains overlap, then finish each label in order, so the bits
// are those of one label at a time. Nothing here grows with L: the scratch
// is hT, one dhT per thread, the batch's (block, label, row) target pairs,
// sorted, and per-row sums.
//
// Targets: every label is first treated as absent (t = 0) for the whole
// tile, then the few listed (label, row) pairs are corrected, as the unfused
// label-CSR losses do.
//
// Softmax needs each row's log-sum-exp over all labels before any gradient:
// a first pass keeps a running (max, sum of e^(z - max)) per row and thread.
//
// Determinism: the labels are split into kMaxSlots fixed slices (threads take
// whole slices), each slice sums on its own, and the slices' partial results
// are combined in slice order, so the result is bitwise the same for any
// thread count.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

#include "../common/supports.h"
#include "cpu_kernels.h"
#include "target_clones.h"
#include "vec_math.h"

namespace pooch::kern {
namespace {

// A call's row block (its "width"): the batch rounded up to 16, 32, 64 or
// 128 rows, and 128 past that (docs/BENCHMARKS.md, "The fused fixed fan-in
// output layer": wider was faster, up to the 128 measured), or 64 where a
// block of 128 rows of hT and dhT (2 x H x 128 floats) does not fit the
// core's L2 cache: each label reads random rows of both, and the smaller
// block keeps more of them near the core. A step at B=128, H=4096,
// L=670 091 took 0.29 s instead of 0.39 s on a Xeon with 2 MiB of L2 (where
// the block of 64 fits) and 0.25 s instead of 0.30 s on an AMD EPYC (Zen 5)
// with 1 MiB (where neither fits); at H=1024 (128 rows fit that L2) the two
// widths were level. The choice never changes the results: every sum
// across rows (dw, db, the loss) is formed per group of kGroup rows, in the
// same order at either width. POOCH_FFI_BLOCK_ROWS=64 or 128 sets it (for
// tests that compare the two).
constexpr int64_t kMaxWidth = 128;
constexpr int64_t kGroup = 64;
size_t l2_bytes() {
  static const size_t bytes = [] {
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return n > 0 ? static_cast<size_t>(n) : size_t{0};
  }();
  return bytes;
}
int64_t width_of(int64_t batch, int64_t hidden) {
  int64_t w = 16;
  while (w < kMaxWidth && w < batch) w *= 2;
  if (w < kMaxWidth) return w;
  if (const char* e = std::getenv("POOCH_FFI_BLOCK_ROWS"))
    return std::string_view(e) == "64" ? kGroup : kMaxWidth;
  const auto block_bytes = [&](int64_t rows) {
    return 2 * static_cast<size_t>(hidden * rows) * sizeof(float);
  };
  return l2_bytes() > 0 && block_bytes(kMaxWidth) > l2_bytes() ? kGroup : kMaxWidth;
}
constexpr size_t kAlign = 64;

enum class Loss { bce = 0, hinge = 1, xent = 2 };

// Per-thread scratch is sized when the plan is made, which knows no thread
// count: for up to kMaxSlots threads, or the process's OpenMP default if
// fewer. A call then uses as many threads as the session asks and the
// workspace it was given holds slots for (a workspace function and its
// kernel agree through slots_for), so it never writes past the workspace.
constexpr int kMaxSlots = 8;
int planned_slots() {
  return kMaxSlots;
}

int64_t padded(int64_t batch, int64_t hidden) {
  const int64_t w = width_of(batch, hidden);
  return (batch + w - 1) / w * w;
}

// Rows of block b (of width bw) that are real (not padding).
int64_t rows_in(int64_t batch, int64_t bw, int64_t b) {
  return std::min(bw, batch - b * bw);
}

size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Carves the workspace into aligned pieces in call order; without a base it
// only counts the bytes (for the workspace size).
struct Carver {
  char* base;
  size_t used = 0;
  template <class T>
  T* take(int64_t n) {
    T* out = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += round_up(static_cast<size_t>(n) * sizeof(T));
    return out;
  }
};

template <class I>
struct Layer {
  const float* h;
  const I* index;
  const float* w;
  const float* bias;
  int64_t batch, hidden, labels, fan_in;
  int64_t bw, bp;  // the row block's width; the batch padded to whole blocks
  int64_t blocks() const { return bp / bw; }
  int64_t groups() const { return (bp + kGroup - 1) / kGroup; }  // of kGroup rows
};

template <class I>
Layer<I> layer_of(const KernelArgs& a) {
  const int64_t batch = a.in[0].shape[0], hidden = a.in[0].shape[1];
  return {a.in[0].as<float>(),
          a.in[1].as<I>(),
          a.in[2].as<float>(),
          a.in[3].as<float>(),
          batch,
          hidden,
          a.in[1].shape[0],
          a.in[1].shape[1],
          width_of(batch, hidden),
          padded(batch, hidden)};
}

// hT[blocks][H][bw] from h[B, H]; rows past B are zero.
template <class I>
void transpose_in(const Layer<I>& y, float* ht, int nt) {
  const int64_t bw = y.bw, hidden = y.hidden;
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2)
  for (int64_t b = 0; b < y.blocks(); ++b)
    for (int64_t u = 0; u < hidden; ++u) {
      float* row = ht + (b * hidden + u) * bw;
      const int64_t n = rows_in(y.batch, bw, b);
      for (int64_t r = 0; r < n; ++r) row[r] = y.h[(b * bw + r) * hidden + u];
      for (int64_t r = n; r < bw; ++r) row[r] = 0.0f;
    }
}

// A target: row `row` (of block `block`) has label `label`.
struct Pair {
  int32_t block, label, row;
  bool operator<(const Pair& o) const {
    if (block != o.block) return block < o.block;
    return label != o.label ? label < o.label : row < o.row;
  }
};

// The batch's targets sorted by (block, label, row): each thread walks the
// pairs of its label range block by block. Returns the count.
int64_t sorted_pairs(const int32_t* lptr, const int32_t* lidx, int64_t batch, int64_t bw,
                     Pair* pairs) {
  int64_t n = 0;
  for (int64_t r = 0; r < batch; ++r)
    for (int32_t j = lptr[r]; j < lptr[r + 1]; ++j)
      pairs[n++] = {static_cast<int32_t>(r / bw), lidx[j], static_cast<int32_t>(r)};
  std::sort(pairs, pairs + n);
  return n;
}

// The first pair of block b whose label is >= l.
int64_t first_pair(const Pair* pairs, int64_t n, int64_t b, int64_t l) {
  const Pair key{static_cast<int32_t>(b), static_cast<int32_t>(l), 0};
  return std::lower_bound(pairs, pairs + n, key) - pairs;
}

// A block's row of hT or dhT as vectors of 16 floats (GCC's vector extension:
// one AVX-512 register in the x86-64-v4 clone; the other clones sum in
// Halves, below; the v4 and v3 clones fuse each multiply-add, the default
// one, without FMA, rounds the product first, so its bits differ), its width
// a template argument so that a tile lives in registers. Plain loops over a
// runtime width ran 1.4 times slower: the compiler kept the tile in memory
// (it cannot prove that z does not alias the inputs) and versioned the
// loops. Vec8 is the 8-float vector that lane sums and the loss terms are
// added in.
typedef float Row16 __attribute__((vector_size(64), aligned(4)));
typedef float Vec8 __attribute__((vector_size(32), aligned(4)));
// The tiles' bodies inline into each clone of their callers (compiled for
// that clone's ISA); the cloned *_tile wrappers below serve the other callers.
#define POOCH_ALWAYS_INLINE inline __attribute__((always_inline))
// Row16 where the CPU has no 16-float registers: its two 8-float halves,
// with Row16's arithmetic lane for lane (so the same bits). GCC lowers a
// 64-byte vector that the clone's ISA cannot hold to memory: the x86-64-v3
// clone kept the tile on the stack and moved it through general registers,
// and a step at B=128, H=4096, L=670 091 took 1.78 s where the AVX-512
// clone takes 0.28 s (docs/BENCHMARKS.md, "Without AVX-512"). The tiles
// sum in Row16 where the AVX-512 clones run (kRunsAvx512Clones), in Halves
// elsewhere (RowOf; at_width picks).
struct Halves {
  Vec8 lo, hi;
};
POOCH_ALWAYS_INLINE Halves operator*(const Halves& a, const Halves& b) {
  return {a.lo * b.lo, a.hi * b.hi};
}
POOCH_ALWAYS_INLINE Halves& operator+=(Halves& a, const Halves& b) {
  a.lo += b.lo;
  a.hi += b.hi;
  return a;
}
POOCH_ALWAYS_INLINE Halves operator+(const Halves& a, float x) {
  return {a.lo + x, a.hi + x};
}
// The type a row's 16 floats are summed in: Row16 (kWide) or Halves. A
// member alias, because Row16 as a template argument loses its aligned(4)
// (GCC then takes every row for 64-byte aligned).
template <bool kWide>
struct RowOf {
  using type = Halves;
};
template <>
struct RowOf<true> {
  using type = Row16;
};
// Every lane x: R{} + x (Row16's form is the one the AVX-512 clone keeps in
// a register; a function returning it spilled it there, 2 times slower).
#define POOCH_SPLAT(R, x) (R{} + (x))

// The rows sit at random places (the index is random): fetching the row of a
// later k while this one is summed hides part of the cache-miss latency.
// Measured (pooch-bench-ffi --form fused --steps 5, B=128, H=4096, L=670 091,
// K=32, 2 threads, alternated twice): 1.17 and 1.15 s a step with it, 1.48
// and 1.28 s without. At H=512 (hT in L2) it is within the noise.
constexpr int64_t kAhead = 4;
template <int64_t W>
inline void prefetch_row(const float* row, bool write) {
  for (int64_t i = 0; i < W; i += 16) {
    if (write)
      __builtin_prefetch(row + i, 1, 3);
    else
      __builtin_prefetch(row + i, 0, 3);
  }
}

// One block's logits of label l: z[0..W) = bias + sum_k w[l,k]
// hT[block][index[l,k]][:], with ht the block's [H][W]. Narrow blocks sum the
// k in interleaved chains (k mod chains), added pairwise at the end: with
// only a vector or two per row, one chain would wait out the FMA latency at
// every k. NL labels at once (il[j], wl[j], bias[j] -> z[j]), each summed
// exactly as alone: their chains are independent, so two labels keep twice
// the multiply-adds in flight.
template <bool kWide, int64_t W, int NL, class I, int kChains = (W >= 64 ? 1 : 64 / W)>
POOCH_ALWAYS_INLINE void logits_rows(const float* ht, const I* const* il, const float* const* wl,
                                     int64_t fan_in, const float* bias, float* const* z) {
  using R = typename RowOf<kWide>::type;
  constexpr int64_t kVecs = W / 16;
  R acc[NL][kChains][kVecs] = {};
  for (int j = 0; j < NL; ++j)
    for (int64_t v = 0; v < kVecs; ++v) acc[j][0][v] = POOCH_SPLAT(R, bias[j]);
  for (int j = 0; j < NL; ++j)
    for (int64_t k = 0; k < kAhead && k < fan_in; ++k)
      prefetch_row<W>(ht + int64_t{il[j][k]} * W, false);
  // A step takes one k per chain (c a constant once unrolled, so acc stays
  // in registers); the k past the last whole step go to chains 0, 1, ...
  auto add = [&](int c, int64_t k) {
    for (int j = 0; j < NL; ++j) {
      if (k + kAhead < fan_in) prefetch_row<W>(ht + int64_t{il[j][k + kAhead]} * W, false);
      const R* row = reinterpret_cast<const R*>(ht + int64_t{il[j][k]} * W);
      const R wk = POOCH_SPLAT(R, wl[j][k]);
      for (int64_t v = 0; v < kVecs; ++v) acc[j][c][v] += wk * row[v];
    }
  };
  int64_t k = 0;
  for (; k + kChains <= fan_in; k += kChains)
    for (int c = 0; c < kChains; ++c) add(c, k + c);
  for (int c = 0; k < fan_in; ++k, ++c) add(c, k);
  for (int j = 0; j < NL; ++j) {
    for (int c = 1; c < kChains; c *= 2)  // pairwise: chains 0+1, 2+3, then (0+1)+(2+3)
      for (int d = 0; d + c < kChains; d += 2 * c)
        for (int64_t v = 0; v < kVecs; ++v) acc[j][d][v] += acc[j][d + c][v];
    for (int64_t v = 0; v < kVecs; ++v) reinterpret_cast<R*>(z[j])[v] = acc[j][0][v];
  }
}

// The sum of a vector's lanes, in a fixed order (halves, then pairs).
inline float lane_sum(const Vec8& s) {
  const float q0 = s[0] + s[4], q1 = s[1] + s[5], q2 = s[2] + s[6], q3 = s[3] + s[7];
  return (q0 + q2) + (q1 + q3);
}
inline float lane_sum(const Halves& s) {
  return lane_sum(s.lo + s.hi);
}
inline float lane_sum(const Row16& s) {
  Vec8 lo, hi;
  __builtin_memcpy(&lo, &s, sizeof lo);
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&s) + sizeof lo, sizeof hi);
  return lane_sum(lo + hi);
}

// lane_sum of 16 vectors at once: lane t of the result is lane_sum(s[t]),
// bit for bit, as every level adds the same two lanes as lane_sum does (8,
// then 4, 2 and 1 apart), two vectors' lanes side by side in one register:
// 30 shuffles and 15 adds where 16 lane_sums take 64 of each. Used where a
// block's row is at most kGroup rows (W <= 64: 16 partial sums fit the
// registers, once the loop that makes them is unrolled: rolled, GCC kept them
// on the stack), where the lane sums are much of a label's work:
// pooch-bench-ffi --form fused --hidden 512, L = 670 091, the median of
// three alternated runs: B=16 0.0340 -> 0.0284 s, B=32 0.0393 -> 0.0321 s,
// B=64 0.0661 -> 0.0650 s; the same bits (Amazon-670K training steps,
// checkpoints equal at batch 16, 32 and 64).
// (The result is written through `out`: a function returning a 64-byte
// vector has another ABI in the clones without AVX-512, which GCC warns of.
// __builtin_shufflevector: GCC 12 and clang both have it, with the lanes as
// constants, index < 16 from the first vector, >= 16 from the second.)
#define POOCH_LANES_A_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define POOCH_LANES_A_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define POOCH_LANES_B_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define POOCH_LANES_B_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define POOCH_LANES_C_LO 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define POOCH_LANES_C_HI 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define POOCH_LANES_D_LO 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define POOCH_LANES_D_HI 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
// Level by level, the lanes LO and HI of two vectors added: x + y 8 lanes
// apart, then 4, 2 and 1.
#define POOCH_FOLD(x, y, LO, HI) \
  (__builtin_shufflevector(x, y, LO) + __builtin_shufflevector(x, y, HI))
POOCH_ALWAYS_INLINE void lane_sums16(const Row16* s, Row16* out) {
  Row16 a[8], b[4], c[2];
  for (int m = 0; m < 8; ++m)  // a[m]: s[2m] then s[2m+1], 8 lanes each
    a[m] = POOCH_FOLD(s[2 * m], s[2 * m + 1], POOCH_LANES_A_LO, POOCH_LANES_A_HI);
  for (int m = 0; m < 4; ++m)  // b[m]: s[4m .. 4m+3], 4 lanes each
    b[m] = POOCH_FOLD(a[2 * m], a[2 * m + 1], POOCH_LANES_B_LO, POOCH_LANES_B_HI);
  for (int m = 0; m < 2; ++m)  // c[m]: s[8m .. 8m+7], 2 lanes each
    c[m] = POOCH_FOLD(b[2 * m], b[2 * m + 1], POOCH_LANES_C_LO, POOCH_LANES_C_HI);
  *out = POOCH_FOLD(c[0], c[1], POOCH_LANES_D_LO, POOCH_LANES_D_HI);
}
#undef POOCH_FOLD
#undef POOCH_LANES_A_LO
#undef POOCH_LANES_A_HI
#undef POOCH_LANES_B_LO
#undef POOCH_LANES_B_HI
#undef POOCH_LANES_C_LO
#undef POOCH_LANES_C_HI
#undef POOCH_LANES_D_LO
#undef POOCH_LANES_D_HI

// With one block's gradient g[0..W) (zero on padding rows): db[l] and
// dw[l, :] gain the block's share (the first block sets them), and the
// block's dhT[index[l, k]][:] += w[l, k] g.
template <bool kWide, int64_t W, class I>
POOCH_ALWAYS_INLINE void backward_rows(const float* ht, const I* il, const float* wl,
                                       int64_t fan_in, const float* g, bool first, float* dwl,
                                       float* dbl, float* dht) {
  using R = typename RowOf<kWide>::type;
  constexpr int64_t kVecs = W / 16, kGroupVecs = kGroup / 16;
  R gv[kVecs];
  // Sums over rows, per group of kGroup rows (a block of 128 holds two),
  // each added in turn: the same bits as two blocks of 64.
  float sb = 0, sb2 = 0;
  for (int64_t v = 0; v < kVecs; ++v) gv[v] = reinterpret_cast<const R*>(g)[v];
  for (int64_t r = 0; r < std::min(W, kGroup); ++r) sb += g[r];
  for (int64_t r = kGroup; r < W; ++r) sb2 += g[r];
  *dbl = first ? sb : *dbl + sb;
  if constexpr (W > kGroup) *dbl += sb2;
  for (int64_t k = 0; k < kAhead && k < fan_in; ++k)
    prefetch_row<W>(dht + int64_t{il[k]} * W, true);
  int64_t k = 0;
  // One group: 16 k's lane sums at once, in the AVX-512 clone only (R is
  // Row16 only there; the two-register shuffles have no AVX2 form: GCC
  // spells them out in scalar moves there, untimed).
  if constexpr (W <= kGroup && kWide) {
    for (; k + 16 <= fan_in; k += 16) {
      Row16 s[16];
#pragma GCC unroll 16
      for (int64_t j = 0; j < 16; ++j) {
        if (k + j + kAhead < fan_in) prefetch_row<W>(dht + int64_t{il[k + j + kAhead]} * W, true);
        const int64_t u = il[k + j];
        const Row16* row = reinterpret_cast<const Row16*>(ht + u * W);
        Row16* drow = reinterpret_cast<Row16*>(dht + u * W);
        const Row16 wk = POOCH_SPLAT(Row16, wl[k + j]);
        Row16 sj{};
        for (int64_t v = 0; v < kVecs; ++v) {
          sj += gv[v] * row[v];
          drow[v] += wk * gv[v];
        }
        s[j] = sj;
      }
      Row16 d;
      lane_sums16(s, &d);
      Row16* out = reinterpret_cast<Row16*>(dwl + k);
      *out = first ? d : *out + d;
    }
  }
  for (; k < fan_in; ++k) {
    if (k + kAhead < fan_in) prefetch_row<W>(dht + int64_t{il[k + kAhead]} * W, true);
    const int64_t u = il[k];
    const R* row = reinterpret_cast<const R*>(ht + u * W);
    R* drow = reinterpret_cast<R*>(dht + u * W);
    const R wk = POOCH_SPLAT(R, wl[k]);
    R s{}, s2{};
    for (int64_t v = 0; v < kVecs; ++v) {
      if (v < kGroupVecs)
        s += gv[v] * row[v];
      else
        s2 += gv[v] * row[v];
      drow[v] += wk * gv[v];
    }
    const float d = lane_sum(s);
    dwl[k] = first ? d : dwl[k] + d;
    if constexpr (W > kGroup) dwl[k] += lane_sum(s2);
  }
}

// The tiles for callers that are not clones themselves: one dispatch a call.
template <int64_t W, bool kWide, class I>
POOCH_VEC_CLONES void logits_tile(const float* ht, const I* il, const float* wl, int64_t fan_in,
                                  float bias, float* z) {
  logits_rows<kWide, W, 1>(ht, &il, &wl, fan_in, &bias, &z);
}
template <int64_t W, bool kWide, class I>
POOCH_VEC_CLONES void backward_tile(const float* ht, const I* il, const float* wl, int64_t fan_in,
                                    const float* g, bool first, float* dwl, float* dbl,
                                    float* dht) {
  backward_rows<kWide, W>(ht, il, wl, fan_in, g, first, dwl, dbl, dht);
}

// Calls f(std::integral_constant<int64_t, W>{}, std::bool_constant<kWide>{})
// with W the call's row-block width and kWide whether this CPU runs the
// AVX-512 clones (RowOf): the tiles take both as template arguments.
template <bool kWide, class F>
void at_width_in(int64_t bw, F&& f) {
  switch (bw) {
    case 16:
      return f(std::integral_constant<int64_t, 16>{}, std::bool_constant<kWide>{});
    case 32:
      return f(std::integral_constant<int64_t, 32>{}, std::bool_constant<kWide>{});
    case 64:
      return f(std::integral_constant<int64_t, 64>{}, std::bool_constant<kWide>{});
    default:
      return f(std::integral_constant<int64_t, kMaxWidth>{}, std::bool_constant<kWide>{});
  }
}
template <class F>
void at_width(int64_t bw, F&& f) {
  if (kRunsAvx512Clones)
    at_width_in<true>(bw, f);
  else
    at_width_in<false>(bw, f);
}

// Label l's logits over block b (ht: the block's [H][bw]), at the call's width.
template <class I>
void logits(const Layer<I>& y, const float* ht, int64_t l, float* z) {
  const I* il = y.index + l * y.fan_in;
  const float* wl = y.w + l * y.fan_in;
  at_width(y.bw, [&](auto w, auto r) {
    logits_tile<w.value, decltype(r)::value>(ht, il, wl, y.fan_in, y.bias[l], z);
  });
}

// backward_tile for label l, at the call's width.
template <class I>
void backward(const Layer<I>& y, const float* ht, int64_t l, const float* g, bool first, float* dw,
              float* db, float* dht) {
  const I* il = y.index + l * y.fan_in;
  const float* wl = y.w + l * y.fan_in;
  float* dwl = dw + l * y.fan_in;
  at_width(y.bw, [&](auto w, auto r) {
    backward_tile<w.value, decltype(r)::value>(ht, il, wl, y.fan_in, g, first, dwl, db + l, dht);
  });
}

// ln(2^-8): below it e^z < 2^-8 (tile_absent's series).
constexpr float kTinyLogit = -5.5451774f;

// The loss terms of a tile, summed per group of kGroup rows: rows [0, 64)
// and [64, 128) (`second` is 0 in a tile of 64 rows or fewer).
struct GroupSums {
  float first, second;
};

// A tile of n real rows (the rest padding) with every target 0: the sums of
// its loss terms and, with G, its gradient times k in g (zero on padding
// rows). One e^-|z| serves both (at Amazon-670K's training shape the two
// loops apart took a quarter of a step). The terms are summed 8 lanes at a
// time and then across the lanes, per group of rows, an order fixed here
// rather than left to the vectoriser, so that ffi_loss (G false) and
// ffi_loss_grad (G true) give the same bits, at either block width.
template <bool G>
POOCH_ALWAYS_INLINE GroupSums absent_rows(const float* z, int64_t n, int64_t bw, Loss kind, float k,
                                          float* g) {
  alignas(32) float terms[kMaxWidth];
  if (kind == Loss::bce) {
    // In runs of 16 rows (the same runs at either width): where every logit
    // of a run is below kTinyLogit, e = e^z < 2^-8 and log(1 + e) and
    // e / (1 + e) are their series to e^3 (what is left, under e^3 / 4 and
    // e^4 relative, is below float's rounding), with no division: most
    // labels are absent from most rows and score far below zero (a bias
    // starts at log(1 / labels)). The loss terms and gradient took a fifth
    // of a step at B=128, H=4096, L=670 091 (0.240 s, 0.187 s without them);
    // the series took 2% off the step.
    for (int64_t c = 0; c < n; c += 16) {
      const int64_t m = std::min<int64_t>(n, c + 16);
      int below = 0;  // a count, not a flag, so that the test vectorises (a NaN is not below)
#pragma omp simd reduction(+ : below)
      for (int64_t r = c; r < m; ++r) below += z[r] < kTinyLogit ? 1 : 0;
      if (below == m - c) {
#pragma omp simd
        for (int64_t r = c; r < m; ++r) {
          const float e = exp_f(z[r]);
          terms[r] = e * (1.0f - e * (0.5f - e * (1.0f / 3.0f)));
          if constexpr (G) g[r] = k * (e * (1.0f - e * (1.0f - e)));
        }
        continue;
      }
#pragma omp simd
      for (int64_t r = c; r < m; ++r) {
        const float e = exp_f(-std::fabs(z[r]));
        terms[r] = max0(z[r]) + log1p_unit(e);
        if constexpr (G) {  // sigmoid_f(z), from the same e
          const float d = 1.0f / (1.0f + e);
          g[r] = k * select_f(z[r] >= 0.0f, d, e * d);
        }
      }
    }
  } else {
#pragma omp simd
    for (int64_t r = 0; r < n; ++r) {
      const float m = max0(1.0f + z[r]);
      terms[r] = m * m;
      if constexpr (G) g[r] = k * 2.0f * m;
    }
  }
  if constexpr (G)
    for (int64_t r = n; r < bw; ++r) g[r] = 0.0f;
  const int64_t n8 = (n + 7) / 8 * 8;
  for (int64_t r = n; r < n8; ++r) terms[r] = 0.0f;
  Vec8 acc{}, acc2{};
  for (int64_t r = 0; r < std::min(n8, kGroup); r += 8)
    acc += *reinterpret_cast<const Vec8*>(terms + r);
  for (int64_t r = kGroup; r < n8; r += 8) acc2 += *reinterpret_cast<const Vec8*>(terms + r);
  return {lane_sum(acc), n8 > kGroup ? lane_sum(acc2) : 0.0f};
}

// tile_absent for callers that are not clones themselves.
template <bool G>
POOCH_VEC_CLONES GroupSums tile_absent(const float* z, int64_t n, int64_t bw, Loss kind, float k,
                                       float* g) {
  return absent_rows<G>(z, n, bw, kind, k, g);
}

// Adds a tile's group sums to the call's per-group loss sums (`sums` at the
// tile's first group).
inline void add_groups(double* sums, const GroupSums& t, int64_t bw) {
  sums[0] += t.first;
  if (bw > kGroup) sums[1] += t.second;
}

// One logit's loss term for target t (bce or squared hinge).
float term(float x, float t, Loss kind) {
  if (kind == Loss::bce) return max0(x) - x * t + log1p_unit(exp_f(-std::fabs(x)));
  const float m = max0(1.0f - (2.0f * t - 1.0f) * x);
  return m * m;
}

// One logit's gradient (before the scale) for target t.
float grad_of(float x, float t, Loss kind) {
  if (kind == Loss::bce) return sigmoid_f(x) - t;
  return -2.0f * (2.0f * t - 1.0f) * max0(1.0f - (2.0f * t - 1.0f) * x);
}

// One slice's labels [lo, hi) over block b of a train step with a loss of
// absent targets (bce, squared hinge): each label's logits, loss terms and
// gradient, its targets' corrections, then its backward. One function per
// ISA with the tiles inlined into it, so that it can take several labels at
// once (below).
template <int64_t W, bool kWide, class I>
POOCH_VEC_CLONES void absent_labels_grad(const Layer<I>& y, int64_t b, int64_t lo, int64_t hi,
                                         Loss kind, float k, const Pair* pairs, int64_t np,
                                         int64_t p, const float* hb, double* sums, float* dw,
                                         float* db, float* dhb) {
  const int64_t r0 = b * W, n = rows_in(y.batch, W, b);
  // Several labels at a time: their logits and loss terms have no bearing
  // on each other, so the one's chains fill the others' latency (B=128,
  // H=4096, L=670 091: two labels took 7% off a step, four 1.5% more). In
  // narrower blocks a label's work is short and four ran 7% slower than two
  // (B=32, H=512, where two are level with the tiles called one at a time).
  // The sums and dhT take each label's share in label order, as one at a
  // time.
  constexpr int kAtOnce = W >= 64 ? 4 : 2;
  // The labels' own chains stand in for the chains of one label's sum (four
  // in flight for 16 lanes): a label is summed the same way wherever it falls.
  constexpr int kChains = std::max(1, static_cast<int>(64 / W) / kAtOnce);
  alignas(64) float zs[kAtOnce][W], gs[kAtOnce][W];
  for (int64_t l = lo; l < hi; l += kAtOnce) {
    const int m = static_cast<int>(std::min<int64_t>(kAtOnce, hi - l));
    const I* il[kAtOnce];
    const float* wl[kAtOnce];
    float* zp[kAtOnce];
    for (int j = 0; j < kAtOnce; ++j) zp[j] = zs[j];
    for (int j = 0; j < kAtOnce; ++j) {
      il[j] = y.index + std::min(l + j, hi - 1) * y.fan_in;
      wl[j] = y.w + std::min(l + j, hi - 1) * y.fan_in;
    }
    float bias[kAtOnce];
    for (int j = 0; j < kAtOnce; ++j) bias[j] = y.bias[std::min(l + j, hi - 1)];
    if (m == kAtOnce)
      logits_rows<kWide, W, kAtOnce, I, kChains>(hb, il, wl, y.fan_in, bias, zp);
    else
      for (int j = 0; j < m; ++j)
        logits_rows<kWide, W, 1, I, kChains>(hb, il + j, wl + j, y.fan_in, bias + j, zp + j);
    GroupSums t[kAtOnce];
    for (int j = 0; j < m; ++j) t[j] = absent_rows<true>(zs[j], n, W, kind, k, gs[j]);
    for (int j = 0; j < m; ++j) {
      add_groups(sums + r0 / kGroup, t[j], W);
      for (; p < np && pairs[p].block == b && pairs[p].label == l + j; ++p) {
        const int64_t r = pairs[p].row - r0;
        sums[pairs[p].row / kGroup] +=
            static_cast<double>(term(zs[j][r], 1.0f, kind)) - term(zs[j][r], 0.0f, kind);
        gs[j][r] = k * grad_of(zs[j][r], 1.0f, kind);
      }
    }
    for (int j = 0; j < m; ++j)
      backward_rows<kWide, W>(hb, il[j], wl[j], y.fan_in, gs[j], b == 0, dw + (l + j) * y.fan_in,
                              db + l + j, dhb);
  }
}

// One slice's labels [lo, hi) over block b of an evaluate step (ffi_loss,
// bce or squared hinge): absent_labels_grad without the gradient, several
// labels' logits at a time; the sums take each label's share in label order.
// The labels' set-up is written out here, in topk_labels and in
// absent_labels_grad: an inlined helper for it made the train step 10% and
// top-k 13% slower (pooch-bench-ffi, alternated builds).
// (Its labels' set-up is written out here as in absent_labels_grad: a shared
// helper that filled the index and weight pointers through arguments made
// the train step 10% slower.)
template <int64_t W, bool kWide, class I>
POOCH_VEC_CLONES void absent_labels_loss(const Layer<I>& y, int64_t b, int64_t lo, int64_t hi,
                                         Loss kind, const Pair* pairs, int64_t np, int64_t p,
                                         const float* hb, double* sums) {
  const int64_t r0 = b * W, n = rows_in(y.batch, W, b);
  constexpr int kAtOnce = W >= 64 ? 4 : 2;  // as absent_labels_grad
  // The labels' own chains stand in for the chains of one label's sum (four
  // in flight for 16 lanes): a label is summed the same way wherever it falls.
  constexpr int kChains = std::max(1, static_cast<int>(64 / W) / kAtOnce);
  alignas(64) float zs[kAtOnce][W];
  for (int64_t l = lo; l < hi; l += kAtOnce) {
    const int m = static_cast<int>(std::min<int64_t>(kAtOnce, hi - l));
    const I* il[kAtOnce];
    const float* wl[kAtOnce];
    float* zp[kAtOnce];
    float bias[kAtOnce];
    for (int j = 0; j < kAtOnce; ++j) {
      const int64_t lj = std::min(l + j, hi - 1);
      il[j] = y.index + lj * y.fan_in;
      wl[j] = y.w + lj * y.fan_in;
      zp[j] = zs[j];
      bias[j] = y.bias[lj];
    }
    if (m == kAtOnce)
      logits_rows<kWide, W, kAtOnce, I, kChains>(hb, il, wl, y.fan_in, bias, zp);
    else
      for (int j = 0; j < m; ++j)
        logits_rows<kWide, W, 1, I, kChains>(hb, il + j, wl + j, y.fan_in, bias + j, zp + j);
    for (int j = 0; j < m; ++j) {
      add_groups(sums + r0 / kGroup, absent_rows<false>(zs[j], n, W, kind, 0.0f, nullptr), W);
      for (; p < np && pairs[p].block == b && pairs[p].label == l + j; ++p) {
        const float x = zs[j][pairs[p].row - r0];
        sums[pairs[p].row / kGroup] +=
            static_cast<double>(term(x, 1.0f, kind)) - term(x, 0.0f, kind);
      }
    }
  }
}

// Each thread's contiguous label range [lo, hi).
void label_range(int64_t labels, int nt, int t, int64_t* lo, int64_t* hi) {
  *lo = labels * t / nt;
  *hi = labels * (t + 1) / nt;
}

// Per row: the log-sum-exp of its logits over every label (softmax). Each
// thread keeps a running max and sum over its labels, merged in thread order.
template <class I>
void row_lse(const Layer<I>& y, const float* ht, int nt, int th, float* ztiles, double* m_part,
             double* s_part, double* lse) {
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* z = ztiles + t * kMaxWidth;
    double* m = m_part + t * y.bp;
    double* s = s_part + t * y.bp;
    std::fill(m, m + y.bp, -std::numeric_limits<double>::infinity());
    std::fill(s, s + y.bp, 0.0);
    for (int64_t b = 0; b < y.blocks(); ++b) {
      const float* hb = ht + b * y.hidden * y.bw;
      const int64_t n = rows_in(y.batch, y.bw, b);
      double* mb = m + b * y.bw;
      double* sb = s + b * y.bw;
      for (int64_t l = lo; l < hi; ++l) {
        logits(y, hb, l, z);
        for (int64_t r = 0; r < n; ++r) {
          const double v = z[r];
          if (v > mb[r]) {  // rescale the running sum to the new maximum
            sb[r] = sb[r] * (std::isfinite(mb[r]) ? std::exp(mb[r] - v) : 0.0) + 1.0;
            mb[r] = v;
          } else {
            sb[r] += std::exp(v - mb[r]);
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < y.batch; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < nt; ++t) m = std::max(m, m_part[t * y.bp + r]);
    double s = 0;
    for (int t = 0; t < nt; ++t)
      if (std::isfinite(m_part[t * y.bp + r]))
        s += s_part[t * y.bp + r] * std::exp(m_part[t * y.bp + r] - m);
    lse[r] = std::isfinite(m) ? m + std::log(s) : m;
  }
}

// ---- workspace --------------------------------------------------------------

struct Scratch {
  float* ht;       // [blocks, H, bw]
  float* dht;      // [nt, blocks, H, bw] (grad only)
  float* z;        // [nt, kMaxWidth] logit tiles
  float* g;        // [nt, kMaxWidth] gradient tiles
  Pair* pairs;     // [M]
  double* m_part;  // [nt, bp] softmax running max
  double* s_part;  // [nt, bp] softmax running sum
  double* lse;     // [bp]
  double* part;    // [nt] loss partial sums
  double* gsum;    // [nt, groups] loss sums per group of kGroup rows
};

Scratch carve(const KernelArgs& a, bool grad, int nt, void* base, size_t* bytes = nullptr) {
  const int64_t hidden = a.in[0].shape[1], bp = padded(a.in[0].shape[0], hidden);
  const int64_t m = a.n_in > 5 ? a.in[5].shape[0] : 0;
  Carver c{static_cast<char*>(base)};
  Scratch s{};
  s.ht = c.take<float>(hidden * bp);
  s.dht = grad ? c.take<float>(nt * hidden * bp) : nullptr;
  s.z = c.take<float>(nt * kMaxWidth);
  s.g = c.take<float>(nt * kMaxWidth);
  s.pairs = c.take<Pair>(m);
  s.m_part = c.take<double>(nt * bp);
  s.s_part = c.take<double>(nt * bp);
  s.lse = c.take<double>(bp);
  s.part = c.take<double>(nt);
  s.gsum = c.take<double>(nt * ((bp + kGroup - 1) / kGroup));
  if (bytes) *bytes = c.used;
  return s;
}

size_t ws_bytes(const KernelArgs& a, bool grad, int nt) {
  size_t n = 0;
  carve(a, grad, nt, nullptr, &n);
  return n;
}

// The label slices of a call: kMaxSlots, each summed on its own and the
// slices combined in order, so the result does not depend on the thread
// count (fewer only if the workspace holds fewer; it is sized for kMaxSlots).
int slots_for(const KernelArgs& a, bool grad) {
  int nt = kMaxSlots;
  while (nt > 1 && ws_bytes(a, grad, nt) > a.workspace_bytes) --nt;
  return nt;
}
size_t loss_ws(const KernelArgs& a) {
  return ws_bytes(a, false, planned_slots());
}
size_t loss_grad_ws(const KernelArgs& a) {
  return ws_bytes(a, true, planned_slots());
}

// ---- ffi_loss ---------------------------------------------------------------

// Softmax's summed loss: over rows, |targets| * lse - the targets' logits
// (lse from row_lse; the pairs from sorted_pairs).
template <class I>
double xent_total(const Layer<I>& y, const int32_t* lptr, const Scratch& s, int64_t np) {
  double total = 0;
  for (int64_t r = 0; r < y.batch; ++r)
    if (lptr[r + 1] > lptr[r]) total += static_cast<double>(lptr[r + 1] - lptr[r]) * s.lse[r];
  for (int64_t p = 0; p < np; ++p) {
    const int64_t l = s.pairs[p].label, r = s.pairs[p].row;
    double acc = 0;
    for (int64_t k = 0; k < y.fan_in; ++k)
      acc += static_cast<double>(y.h[r * y.hidden + int64_t{y.index[l * y.fan_in + k]}]) *
             y.w[l * y.fan_in + k];
    total -= static_cast<float>(acc + y.bias[l]);
  }
  return total;
}

// A slice's loss: its groups' sums added in row order.
double group_total(const double* sums, int64_t groups) {
  double total = 0;
  for (int64_t i = 0; i < groups; ++i) total += sums[i];
  return total;
}

// The slices' loss sums added in slice order, over the batch.
float mean_loss(double total, const Scratch& s, int nt, int64_t batch) {
  for (int t = 0; t < nt; ++t) total += s.part[t];
  return static_cast<float>(total / static_cast<double>(batch));
}

template <class I>
void loss_fwd(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  const int nt = slots_for(a, false), th = threads_of(a);
  Scratch s = carve(a, false, nt, a.workspace);
  float* out = a.out[0].as<float>();
  if (y.batch == 0) {
    *out = 0.0f;
    return;
  }
  transpose_in(y, s.ht, th);
  const int64_t np = sorted_pairs(lptr, lidx, y.batch, y.bw, s.pairs);
  double total = 0;
  if (kind == Loss::xent) {
    row_lse(y, s.ht, nt, th, s.z, s.m_part, s.s_part, s.lse);
    total = xent_total(y, lptr, s, np);
    std::fill(s.part, s.part + nt, 0.0);
  } else {
#pragma omp parallel for num_threads(th) schedule(static, 1)
    for (int t = 0; t < nt; ++t) {
      int64_t lo, hi;
      label_range(y.labels, nt, t, &lo, &hi);
      double* sums = s.gsum + t * y.groups();
      std::fill(sums, sums + y.groups(), 0.0);
      for (int64_t b = 0; b < y.blocks(); ++b) {
        const float* hb = s.ht + b * y.hidden * y.bw;
        const int64_t p = first_pair(s.pairs, np, b, lo);
        at_width(y.bw, [&](auto w, auto r) {
          absent_labels_loss<w.value, decltype(r)::value>(y, b, lo, hi, kind, s.pairs, np, p, hb,
                                                          sums);
        });
      }
      s.part[t] = group_total(sums, y.groups());
    }
  }
  *out = mean_loss(total, s, nt, y.batch);
}

// ---- ffi_loss_grad ----------------------------------------------------------

template <class I>
void loss_grad(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  const auto kind = static_cast<Loss>(a.attrs.geti("loss", 0));
  const int32_t* lptr = a.in[4].as<int32_t>();
  const int32_t* lidx = a.in[5].as<int32_t>();
  const int nt = slots_for(a, true), th = threads_of(a);
  Scratch s = carve(a, true, nt, a.workspace);
  float* dh = a.out[0].as<float>();
  float* dw = a.out[1].as<float>();
  float* db = a.out[2].as<float>();
  float* loss = a.n_out > 3 ? a.out[3].as<float>() : nullptr;  // with_loss
  if (y.batch == 0) {
    std::fill(dw, dw + y.labels * y.fan_in, 0.0f);
    std::fill(db, db + y.labels, 0.0f);
    if (loss) *loss = 0.0f;
    return;
  }
  transpose_in(y, s.ht, th);
  const int64_t np = sorted_pairs(lptr, lidx, y.batch, y.bw, s.pairs);
  const float k = static_cast<float>(a.attrs.get("scale", 1.0) / static_cast<double>(y.batch));
  if (kind == Loss::xent) row_lse(y, s.ht, nt, th, s.z, s.m_part, s.s_part, s.lse);
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* z = s.z + t * kMaxWidth;
    float* g = s.g + t * kMaxWidth;
    float* dht = s.dht + t * y.hidden * y.bp;
    std::memset(dht, 0, static_cast<size_t>(y.hidden * y.bp) * sizeof(float));
    double* sums = s.gsum + t * y.groups();  // the slice's loss terms, as loss_fwd sums them
    std::fill(sums, sums + y.groups(), 0.0);
    for (int64_t b = 0; b < y.blocks(); ++b) {
      const float* hb = s.ht + b * y.hidden * y.bw;
      float* dhb = dht + b * y.hidden * y.bw;
      const int64_t r0 = b * y.bw, n = rows_in(y.batch, y.bw, b);
      int64_t p = first_pair(s.pairs, np, b, lo);
      if (kind != Loss::xent) {
        at_width(y.bw, [&](auto w, auto r) {
          absent_labels_grad<w.value, decltype(r)::value>(y, b, lo, hi, kind, k, s.pairs, np, p, hb,
                                                          sums, dw, db, dhb);
        });
        continue;
      }
      for (int64_t l = lo; l < hi; ++l) {
        logits(y, hb, l, z);
        if (kind == Loss::xent) {
          for (int64_t r = 0; r < n; ++r)
            g[r] = k * static_cast<float>(std::exp(static_cast<double>(z[r]) - s.lse[r0 + r]) *
                                          static_cast<double>(lptr[r0 + r + 1] - lptr[r0 + r]));
          for (int64_t r = n; r < y.bw; ++r) g[r] = 0.0f;
          for (; p < np && s.pairs[p].block == b && s.pairs[p].label == l; ++p)
            g[s.pairs[p].row - r0] -= k;
        } else {
          add_groups(sums + r0 / kGroup, tile_absent<true>(z, n, y.bw, kind, k, g), y.bw);
          for (; p < np && s.pairs[p].block == b && s.pairs[p].label == l; ++p) {
            const int64_t r = s.pairs[p].row - r0;
            sums[s.pairs[p].row / kGroup] +=
                static_cast<double>(term(z[r], 1.0f, kind)) - term(z[r], 0.0f, kind);
            g[r] = k * grad_of(z[r], 1.0f, kind);
          }
        }
        backward(y, hb, l, g, b == 0, dw, db, dhb);
      }
    }
    s.part[t] = group_total(sums, y.groups());
  }
  if (loss)
    *loss = mean_loss(kind == Loss::xent ? xent_total(y, lptr, s, np) : 0.0, s, nt, y.batch);
    // dh[r, u] = sum over the slices of dhT[block][u][r], in slice order.
#pragma omp parallel for num_threads(th) schedule(static)
  for (int64_t u = 0; u < y.hidden; ++u)
    for (int64_t r = 0; r < y.batch; ++r) {
      const int64_t at = ((r / y.bw) * y.hidden + u) * y.bw + r % y.bw;
      float v = 0;
      for (int t = 0; t < nt; ++t) v += s.dht[t * y.hidden * y.bp + at];
      dh[r * y.hidden + u] = v;
    }
}

// ---- ffi_topk ---------------------------------------------------------------

// topk's order: larger first, NaN after every number, ties by lower label.
inline bool ranks_above(float u, int64_t iu, float v, int64_t iv) {
  const bool nu = std::isnan(u), nv = std::isnan(v);
  if (nu != nv) return nv;
  if (!nu && u != v) return u > v;
  return iu < iv;
}

// Inserts (v, l) into a rank-ordered list of n <= k entries.
inline void insert(float v, int64_t l, float* bv, int32_t* bi, int64_t& n, int64_t k) {
  if (n == k && !ranks_above(v, l, bv[n - 1], bi[n - 1])) return;
  int64_t p = n < k ? n++ : k - 1;
  while (p > 0 && ranks_above(v, l, bv[p - 1], bi[p - 1])) {
    bv[p] = bv[p - 1];
    bi[p] = bi[p - 1];
    --p;
  }
  bv[p] = v;
  bi[p] = static_cast<int32_t>(l);
}

// hT, and per thread and row a running top k and the value a logit must
// pass to enter it (the logit tiles are topk_labels' own).
size_t topk_bytes(const KernelArgs& a, int nt) {
  const int64_t hidden = a.in[0].shape[1], bp = padded(a.in[0].shape[0], hidden);
  const int64_t k = a.out[0].shape[1];
  Carver c{nullptr};
  c.take<float>(hidden * bp);
  c.take<float>(nt * bp * k);
  c.take<int32_t>(nt * bp * k);
  c.take<int64_t>(nt * bp);
  c.take<float>(nt * bp);
  return c.used;
}

// One slice's labels [lo, hi) over block b (rows r0 = b * W on) into the
// slice's running lists (v, ix, n: per row, k long), four labels' logits at
// a time, then each label in order. `bar` holds per row the k-th value once
// the list is full, NaN before: a logit z enters only where !(z <= bar)
// (z above it, or either NaN), tested 16 rows at a time; a label always
// follows the list's labels, so a tie never enters, and the rows the test
// lets through go to the exact comparison.
template <int64_t W, bool kWide, class I>
POOCH_VEC_CLONES void topk_labels(const Layer<I>& y, int64_t b, int64_t lo, int64_t hi,
                                  const float* hb, int64_t k, float* v, int32_t* ix, int64_t* n,
                                  float* bar) {
  const int64_t r0 = b * W, rows = rows_in(y.batch, W, b);
  constexpr int kAtOnce = 4;  // at every width (B=32, H=512: 0.021 s a call, 0.022 with two)
  // The labels' own chains stand in for the chains of one label's sum (four
  // in flight for 16 lanes): a label is summed the same way wherever it falls.
  constexpr int kChains = std::max(1, static_cast<int>(64 / W) / kAtOnce);
  alignas(64) float zs[kAtOnce][W];
  for (int64_t l = lo; l < hi; l += kAtOnce) {
    const int m = static_cast<int>(std::min<int64_t>(kAtOnce, hi - l));
    const I* il[kAtOnce];
    const float* wl[kAtOnce];
    float* zp[kAtOnce];
    float bias[kAtOnce];
    for (int j = 0; j < kAtOnce; ++j) {
      const int64_t lj = std::min(l + j, hi - 1);
      il[j] = y.index + lj * y.fan_in;
      wl[j] = y.w + lj * y.fan_in;
      zp[j] = zs[j];
      bias[j] = y.bias[lj];
    }
    if (m == kAtOnce)
      logits_rows<kWide, W, kAtOnce, I, kChains>(hb, il, wl, y.fan_in, bias, zp);
    else
      for (int j = 0; j < m; ++j)
        logits_rows<kWide, W, 1, I, kChains>(hb, il + j, wl + j, y.fan_in, bias + j, zp + j);
    for (int j = 0; j < m; ++j) {
      const float* z = zs[j];
      for (int64_t c = 0; c < rows; c += 16) {
        const int64_t e = std::min<int64_t>(rows, c + 16);
        int open = 0;
#pragma omp simd reduction(| : open)
        for (int64_t q = c; q < e; ++q) open |= !(z[q] <= bar[r0 + q]) ? 1 : 0;
        if (!open) continue;
        for (int64_t q = c; q < e; ++q) {
          const int64_t r = r0 + q;
          if (n[r] == k && !ranks_above(z[q], l + j, v[r * k + k - 1], ix[r * k + k - 1])) continue;
          insert(z[q], l + j, v + r * k, ix + r * k, n[r], k);
          if (n[r] == k) bar[r] = v[r * k + k - 1];
        }
      }
    }
  }
}
size_t topk_ws(const KernelArgs& a) {
  return topk_bytes(a, planned_slots());
}

template <class I>
void topk(const KernelArgs& a) {
  const Layer<I> y = layer_of<I>(a);
  int nt = kMaxSlots;
  const int th = threads_of(a);
  while (nt > 1 && topk_bytes(a, nt) > a.workspace_bytes) --nt;
  const int64_t k = a.out[0].shape[1];
  float* values = a.out[0].as<float>();
  int32_t* indices = a.out[1].as<int32_t>();
  if (y.batch == 0) return;
  Carver c{static_cast<char*>(a.workspace)};
  float* ht = c.take<float>(y.hidden * y.bp);
  float* bv = c.take<float>(nt * y.bp * k);
  auto* bi = c.take<int32_t>(nt * y.bp * k);
  auto* cnt = c.take<int64_t>(nt * y.bp);
  float* bars = c.take<float>(nt * y.bp);
  transpose_in(y, ht, th);
#pragma omp parallel for num_threads(th) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    int64_t lo, hi;
    label_range(y.labels, nt, t, &lo, &hi);
    float* v = bv + t * y.bp * k;
    int32_t* ix = bi + t * y.bp * k;
    int64_t* n = cnt + t * y.bp;
    float* bar = bars + t * y.bp;
    std::fill(n, n + y.bp, 0);
    std::fill(bar, bar + y.bp, std::numeric_limits<float>::quiet_NaN());
    for (int64_t b = 0; b < y.blocks(); ++b) {
      const float* hb = ht + b * y.hidden * y.bw;
      at_width(y.bw, [&](auto w, auto r) {
        topk_labels<w.value, decltype(r)::value>(y, b, lo, hi, hb, k, v, ix, n, bar);
      });
    }
  }
  // Merge the slices' lists per row (slice t's labels all precede t+1's).
#pragma omp parallel for num_threads(th) schedule(static)
  for (int64_t r = 0; r < y.batch; ++r) {
    float* out_v = values + r * k;
    int32_t* out_i = indices + r * k;
    int64_t n = 0;
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < cnt[t * y.bp + r]; ++j)
        insert(bv[(t * y.bp + r) * k + j], bi[(t * y.bp + r) * k + j], out_v, out_i, n, k);
  }
}

template <void (*F16)(const KernelArgs&), void (*F32)(const KernelArgs&)>
void by_index(const KernelArgs& a) {
  if (a.in[1].dtype == DType::u16)
    F16(a);
  else
    F32(a);
}

bool supports(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype) && a.in[0].shape[0] <= kInt32Max;
}

}  // namespace

std::vector<KernelVariant> cpu_ffi_head_kernels() {
  return {
      {"ffi_loss", "tiled", by_index<loss_fwd<uint16_t>, loss_fwd<int32_t>>, loss_ws, true,
       supports},
      {"ffi_loss_grad", "tiled", by_index<loss_grad<uint16_t>, loss_grad<int32_t>>, loss_grad_ws,
       true, supports},
      {"ffi_topk", "tiled", by_index<topk<uint16_t>, topk<int32_t>>, topk_ws, true, supports},
  };
}

}  // namespace pooch::kern
