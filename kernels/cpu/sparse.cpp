// Fast CPU kernels of the sparse family (docs/OPS.md, "Sparse"), f32 only.
//
// All of them are deterministic: work is cut into pieces whose size depends on
// the shapes alone, every output element is produced by exactly one piece with
// a fixed summation order, and threads only decide who runs which piece. So
// the bits are the same run to run and for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/supports.h"
#include "cpu_kernels.h"
#include "target_clones.h"

namespace pooch::kern {
namespace {

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kGrain = int64_t{1} << 16;

bool all_f32(const KernelArgs& a) {
  for (int i = 0; i < a.n_in; ++i)
    if (dtype_is_float(a.in[i].dtype) && a.in[i].dtype != DType::f32) return false;
  for (int i = 0; i < a.n_out; ++i)
    if (dtype_is_float(a.out[i].dtype) && a.out[i].dtype != DType::f32) return false;
  return true;
}

// ---- sparse_linear ---------------------------------------------------------

// y += a·x over n floats: a weight row into an output row (the forward), an
// output gradient row into a weight gradient row (the backward).
POOCH_VEC_CLONES void add_scaled(float a, const float* __restrict x, float* __restrict y,
                                 int64_t n) {
  for (int64_t o = 0; o < n; ++o) y[o] += a * x[o];
}

void sparse_linear_omp(const KernelArgs& a) {
  if (!all_f32(a)) return;
  const int32_t* ptr = a.in[0].as<int32_t>();
  const int32_t* idx = a.in[1].as<int32_t>();
  const float* val = a.in[2].as<float>();
  const float* w = a.in[3].as<float>();
  const float* bias = a.in[4].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t rows = a.out[0].shape[0], cols = a.out[0].shape[1];
  const int64_t work = (ptr[rows] - ptr[0] + rows) * cols;
  const int nt = threads_of(a);
  // Rows differ in length, so they are handed out dynamically; each row is
  // still summed by one thread in entry order.
#pragma omp parallel for num_threads(nt) if (nt > 1 && work > kGrain) schedule(dynamic, 8)
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
    for (int64_t o = 0; o < cols; ++o) yr[o] = 0.0f;
    for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j)
      add_scaled(val[j], w + int64_t{idx[j]} * cols, yr, cols);
    for (int64_t o = 0; o < cols; ++o) yr[o] += bias[o];
  }
}

// ---- sparse_linear_grad_weight -----------------------------------------------

// The batch's entries are grouped by feature with a stable LSD radix sort of
// entry ids. It needs O(capacity) scratch whatever F is (F may be millions,
// while a batch touches a few thousand features), and stability keeps each
// feature's entries in entry order, which fixes the summation order.
constexpr int kRadixBits = 11;
constexpr int64_t kRadix = int64_t{1} << kRadixBits;

// row_of[cap], two ping-pong buffers of cap + 1 (the spare one later holds the
// cap + 1 group starts), and one histogram.
size_t sparse_linear_grad_weight_ws(const KernelArgs& a) {
  const size_t cap = static_cast<size_t>(a.in[1].shape[0]);
  return (3 * cap + 2 + static_cast<size_t>(kRadix)) * sizeof(int32_t);
}

void sparse_linear_grad_weight_omp(const KernelArgs& a) {
  if (!all_f32(a)) return;
  const int32_t* ptr = a.in[0].as<int32_t>();
  const int32_t* idx = a.in[1].as<int32_t>();
  const float* val = a.in[2].as<float>();
  const float* dy = a.in[3].as<float>();
  int32_t* rows = a.out[0].as<int32_t>();
  float* dwr = a.out[1].as<float>();
  float* db = a.out[2].as<float>();
  const int64_t batch = a.in[3].shape[0], cols = a.in[3].shape[1];
  const int64_t cap = a.in[1].shape[0];
  const int nt = threads_of(a);

  int32_t* row_of = static_cast<int32_t*>(a.workspace);
  int32_t* src = row_of + cap;
  int32_t* dst = src + cap + 1;
  int32_t* count = dst + cap + 1;

  const int64_t first = ptr[0], last = ptr[batch], m = last - first;
  int32_t max_feature = 0;
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j) {
      row_of[j] = static_cast<int32_t>(r);
      max_feature = std::max(max_feature, idx[j]);
    }
  for (int64_t t = 0; t < m; ++t) src[t] = static_cast<int32_t>(first + t);
  for (int shift = 0; shift < 31 && (max_feature >> shift) != 0; shift += kRadixBits) {
    std::memset(count, 0, sizeof(int32_t) * kRadix);
    for (int64_t t = 0; t < m; ++t) ++count[(idx[src[t]] >> shift) & (kRadix - 1)];
    int32_t sum = 0;
    for (int64_t d = 0; d < kRadix; ++d) {
      const int32_t c = count[d];
      count[d] = sum;
      sum += c;
    }
    for (int64_t t = 0; t < m; ++t) dst[count[(idx[src[t]] >> shift) & (kRadix - 1)]++] = src[t];
    std::swap(src, dst);
  }

  // src holds the entries grouped by ascending feature; dst becomes the
  // group starts.
  int64_t n = 0;
  for (int64_t t = 0; t < m; ++t)
    if (t == 0 || idx[src[t]] != idx[src[t - 1]]) {
      dst[n] = static_cast<int32_t>(t);
      rows[1 + n] = idx[src[t]];
      ++n;
    }
  dst[n] = static_cast<int32_t>(m);
  rows[0] = static_cast<int32_t>(n);

  const int32_t* order = src;
  const int32_t* start = dst;
#pragma omp parallel num_threads(nt) if (nt > 1 && (m + batch) * cols > kGrain)
  {
#pragma omp for schedule(dynamic, 16) nowait
    for (int64_t i = 0; i < n; ++i) {
      float* out = dwr + i * cols;
      for (int64_t o = 0; o < cols; ++o) out[o] = 0.0f;
      for (int64_t t = start[i]; t < start[i + 1]; ++t) {
        const int32_t j = order[t];
        add_scaled(val[j], dy + int64_t{row_of[j]} * cols, out, cols);
      }
    }
    // db by column blocks, each summed over rows in row order.
    constexpr int64_t kCols = 256;
#pragma omp for schedule(static)
    for (int64_t o0 = 0; o0 < cols; o0 += kCols) {
      const int64_t o1 = std::min(cols, o0 + kCols);
      for (int64_t o = o0; o < o1; ++o) db[o] = 0.0f;
      for (int64_t r = 0; r < batch; ++r)
        for (int64_t o = o0; o < o1; ++o) db[o] += dy[r * cols + o];
    }
  }
}

// ---- ffi_linear and ffi_grad_weight: x in row panels -------------------------

// Both gather x[b, index[l,k]] for many rows b at once. With x re-laid as
// panels of kPanel rows, [H][kPanel] each, one slot (l,k) reads kPanel
// contiguous floats, and the loop over the rows of a panel vectorises. The
// last panel's missing rows are zeros, so the lane loops need no tail.
constexpr int64_t kPanel = 64;

int64_t panels_of(int64_t batch) {
  return (batch + kPanel - 1) / kPanel;
}

// Lanes actually computed in a panel: its rows rounded up to a SIMD-friendly 8.
int64_t lanes_of(int64_t rows_in_panel) {
  return (rows_in_panel + 7) & ~int64_t{7};
}

size_t panel_ws(int64_t batch, int64_t hidden) {
  return static_cast<size_t>(panels_of(batch) * hidden * kPanel) * sizeof(float);
}

void to_panels(const float* x, int64_t batch, int64_t hidden, float* panels, int nt) {
  const int64_t np = panels_of(batch);
#pragma omp parallel for num_threads(nt) if (nt > 1 && batch * hidden > kGrain) schedule(static)
  for (int64_t p = 0; p < np; ++p) {
    float* panel = panels + p * hidden * kPanel;
    const int64_t b0 = p * kPanel, nb = std::min(kPanel, batch - b0);
    for (int64_t h = 0; h < hidden; ++h) {
      float* dst = panel + h * kPanel;
      for (int64_t i = 0; i < nb; ++i) dst[i] = x[(b0 + i) * hidden + h];
      for (int64_t i = nb; i < kPanel; ++i) dst[i] = 0.0f;
    }
  }
}

// Labels per task: the tile's index and weight rows stay in L1 across the
// panel's lanes, and its outputs are written back a row segment at a time.
constexpr int64_t kLabelTile = 32;

// Four float lanes (a GCC/Clang vector extension). Spelling the lanes out
// pins the loop shape of the gathers and the scatter below: left to itself,
// GCC 12 vectorised the forward gather across slots for i32 indices, and the
// rowwise scatter not at all, each at a quarter of this speed.
typedef float f32x4 __attribute__((vector_size(16)));

// W lanes of one label: few enough to stay in registers across the K slots.
// Whatever W, each lane sums its K products in slot order and adds the bias
// last, so the width never changes a result.
template <int W, class I>
inline void gather_lanes(const float* panel, const I* il, const float* wl, int64_t fan_in,
                         float bias, float* out) {
  constexpr int V = W / 4;
  f32x4 r[V] = {};
  for (int64_t k = 0; k < fan_in; ++k) {
    const float* xs = panel + int64_t{il[k]} * kPanel;
    const float wk = wl[k];
    for (int v = 0; v < V; ++v) {
      f32x4 x;
      std::memcpy(&x, xs + 4 * v, sizeof x);
      r[v] += x * wk;
    }
  }
  for (int v = 0; v < V; ++v) {
    r[v] += bias;
    std::memcpy(out + 4 * v, &r[v], sizeof r[v]);
  }
}

size_t ffi_linear_ws(const KernelArgs& a) {
  return panel_ws(a.in[0].shape[0], a.in[0].shape[1]);
}

template <class I>
void ffi_linear_gather(const KernelArgs& a) {
  const float* x = a.in[0].as<float>();
  const I* index = a.in[1].as<I>();
  const float* w = a.in[2].as<float>();
  const float* bias = a.in[3].as<float>();
  float* y = a.out[0].as<float>();
  const int64_t batch = a.in[0].shape[0], hidden = a.in[0].shape[1];
  const int64_t labels = a.in[1].shape[0], fan_in = a.in[1].shape[1];
  const int nt = threads_of(a);
  float* panels = static_cast<float*>(a.workspace);
  to_panels(x, batch, hidden, panels, nt);

  const int64_t np = panels_of(batch), nlt = (labels + kLabelTile - 1) / kLabelTile;
  const int64_t tasks = np * nlt;
#pragma omp parallel for num_threads(nt) if (nt > 1 && batch * labels * (fan_in + 1) > kGrain) \
    schedule(dynamic, 4)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t p = task / nlt, l0 = (task % nlt) * kLabelTile;
    const int64_t b0 = p * kPanel, nb = std::min(kPanel, batch - b0), lanes = lanes_of(nb);
    const int64_t nl = std::min(kLabelTile, labels - l0);
    const float* panel = panels + p * hidden * kPanel;
    alignas(64) float acc[kLabelTile][kPanel];
    for (int64_t li = 0; li < nl; ++li) {
      const int64_t l = l0 + li;
      const I* il = index + l * fan_in;
      const float* wl = w + l * fan_in;
      int64_t c = 0;
      for (; c + 16 <= lanes; c += 16)
        gather_lanes<16>(panel + c, il, wl, fan_in, bias[l], acc[li] + c);
      for (; c < lanes; c += 8) gather_lanes<8>(panel + c, il, wl, fan_in, bias[l], acc[li] + c);
    }
    for (int64_t i = 0; i < nb; ++i) {
      float* yr = y + (b0 + i) * labels + l0;
      for (int64_t li = 0; li < nl; ++li) yr[li] = acc[li][i];
    }
  }
}

size_t ffi_grad_weight_ws(const KernelArgs& a) {
  return panel_ws(a.in[1].shape[0], a.in[1].shape[1]);
}

// dw[l,k] is a dot product over the batch of dy[:,l] and x[:,index[l,k]]
// (SDDMM-shaped). Per panel it is summed in 8 interleaved partial sums (so it
// vectorises) folded in a fixed order, then added across panels in order.
// Rows b with dy[b,l] == 0 add nothing; a label whose panel column is all zero
// (common: squared hinge is zero on most labels) skips its K dot products.
// Note this also skips 0·Inf = NaN terms, so an Inf in x does not turn such a
// label's gradient into NaN as the reference does.
template <class I>
void ffi_grad_weight_sddmm(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const float* x = a.in[1].as<float>();
  const I* index = a.in[2].as<I>();
  float* dw = a.out[0].as<float>();
  float* db = a.out[1].as<float>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t hidden = a.in[1].shape[1], fan_in = a.in[2].shape[1];
  const int nt = threads_of(a);
  float* panels = static_cast<float*>(a.workspace);
  to_panels(x, batch, hidden, panels, nt);

  const int64_t np = panels_of(batch), nlt = (labels + kLabelTile - 1) / kLabelTile;
#pragma omp parallel for num_threads(nt) if (nt > 1 && batch * labels * (fan_in + 1) > kGrain) \
    schedule(dynamic, 2)
  for (int64_t t = 0; t < nlt; ++t) {
    const int64_t l0 = t * kLabelTile, nl = std::min(kLabelTile, labels - l0);
    for (int64_t l = l0; l < l0 + nl; ++l) {
      float* dwl = dw + l * fan_in;
      for (int64_t k = 0; k < fan_in; ++k) dwl[k] = 0.0f;
      float dbl = 0.0f;
      for (int64_t r = 0; r < batch; ++r) dbl += dy[r * labels + l];
      db[l] = dbl;
    }
    for (int64_t p = 0; p < np; ++p) {
      const int64_t b0 = p * kPanel, nb = std::min(kPanel, batch - b0), lanes = lanes_of(nb);
      const float* panel = panels + p * hidden * kPanel;
      for (int64_t l = l0; l < l0 + nl; ++l) {
        alignas(64) float g[kPanel];
        bool any = false;
        for (int64_t i = 0; i < nb; ++i) {
          g[i] = dy[(b0 + i) * labels + l];
          any |= g[i] != 0.0f;
        }
        if (!any) continue;
        for (int64_t i = nb; i < lanes; ++i) g[i] = 0.0f;
        const I* il = index + l * fan_in;
        float* dwl = dw + l * fan_in;
        for (int64_t k = 0; k < fan_in; ++k) {
          const float* xs = panel + int64_t{il[k]} * kPanel;
          float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t i = 0; i < lanes; i += 8)
            for (int j = 0; j < 8; ++j) part[j] += g[i + j] * xs[i + j];
          dwl[k] += ((part[0] + part[4]) + (part[1] + part[5])) +
                    ((part[2] + part[6]) + (part[3] + part[7]));
        }
      }
    }
  }
}

// ---- ffi_grad_input ----------------------------------------------------------

// Both variants sum dx[b,h] over the slots (l,k) with index[l,k] == h in
// ascending (l,k) order, so they agree bit for bit with each other (while the
// weights are finite: see the zero skip of rowwise).
constexpr int64_t kRowBlock = 8;

// rowwise: a block of kRowBlock rows is one task that owns those rows of dx
// and scatters into a [H][kRowBlock] accumulator (its own slice of the
// workspace), so each slot costs one 8-lane update and the index and weights
// are streamed once per block rather than once per row.
size_t ffi_grad_input_rowwise_ws(const KernelArgs& a) {
  const int64_t batch = a.in[0].shape[0], hidden = a.out[0].shape[1];
  const int64_t blocks = (batch + kRowBlock - 1) / kRowBlock;
  return static_cast<size_t>(blocks * hidden * kRowBlock) * sizeof(float);
}

// A row block's labels whose dy is zero in every row are skipped (most of
// them, under squared hinge). As in ffi_grad_weight, that drops 0·Inf terms.
template <class I>
void ffi_grad_input_rowwise(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const I* index = a.in[1].as<I>();
  const float* w = a.in[2].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t fan_in = a.in[1].shape[1], hidden = a.out[0].shape[1];
  const int nt = threads_of(a);
  const int64_t blocks = (batch + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for num_threads(nt) if (nt > 1 && batch * labels * (fan_in + 1) > kGrain) \
    schedule(dynamic, 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t b0 = blk * kRowBlock, nb = std::min(kRowBlock, batch - b0);
    float* acc = static_cast<float*>(a.workspace) + blk * hidden * kRowBlock;
    for (int64_t e = 0; e < hidden * kRowBlock; ++e) acc[e] = 0.0f;
    const float* dyr[kRowBlock];
    for (int64_t i = 0; i < kRowBlock; ++i) dyr[i] = dy + (b0 + std::min(i, nb - 1)) * labels;
    for (int64_t l = 0; l < labels; ++l) {
      float g[kRowBlock];
      bool any = false;
      for (int64_t i = 0; i < kRowBlock; ++i) {
        g[i] = i < nb ? dyr[i][l] : 0.0f;
        any |= g[i] != 0.0f;
      }
      if (!any) continue;
      const I* il = index + l * fan_in;
      const float* wl = w + l * fan_in;
      constexpr int V = kRowBlock / 4;
      f32x4 gv[V];
      std::memcpy(gv, g, sizeof gv);
      for (int64_t k = 0; k < fan_in; ++k) {
        float* ah = acc + int64_t{il[k]} * kRowBlock;
        const float wk = wl[k];
        for (int v = 0; v < V; ++v) {
          f32x4 av;
          std::memcpy(&av, ah + 4 * v, sizeof av);
          av += gv[v] * wk;
          std::memcpy(ah + 4 * v, &av, sizeof av);
        }
      }
    }
    for (int64_t i = 0; i < nb; ++i) {
      float* dxr = dx + (b0 + i) * hidden;
      for (int64_t h = 0; h < hidden; ++h) dxr[h] = acc[h * kRowBlock + i];
    }
  }
}

// transposed: the index inverted into CSR form, for each hidden unit h the
// slots (l,k) that read it, ascending; dx[b,h] is then a gather with one
// writer, the layout a GPU's deterministic mode uses (no atomics). Blocks of
// kColBlock batch rows are taken one after another, each with its dy rows
// transposed to [L][kColBlock], so that a slot's rows are one contiguous read
// rather than a cache miss per row; one block at a time keeps the scratch
// independent of B. Workspace: start[H+1], slot label[L*K], slot weight[L*K],
// dy block[L][stride].
constexpr int64_t kColBlock = 32;

// Rows per dy block as stored: a small batch gets a short stride, so its
// copy of dy stays as compact as dy itself.
int64_t dy_block_stride(int64_t batch) {
  return lanes_of(std::min(batch, kColBlock));
}

size_t ffi_grad_input_transposed_ws(const KernelArgs& a) {
  const size_t hidden = static_cast<size_t>(a.out[0].shape[1]);
  const size_t labels = static_cast<size_t>(a.in[1].shape[0]);
  const size_t slots = labels * static_cast<size_t>(a.in[1].shape[1]);
  return (hidden + 1 + slots) * sizeof(int32_t) +
         (slots + labels * static_cast<size_t>(dy_block_stride(a.in[0].shape[0]))) * sizeof(float);
}

constexpr int64_t kHiddenTile = 64;

// W rows of dx[:,h]: the slot list of h is walked once per W rows, with the
// W sums held in registers.
template <int W>
inline void gather_slots(const int32_t* slot_label, const float* slot_weight, int32_t s0,
                         int32_t s1, const float* dyt, int64_t stride, float* out) {
  constexpr int V = W / 4;
  f32x4 r[V] = {};
  for (int32_t s = s0; s < s1; ++s) {
    const float* g = dyt + int64_t{slot_label[s]} * stride;
    const float wk = slot_weight[s];
    for (int v = 0; v < V; ++v) {
      f32x4 gv;
      std::memcpy(&gv, g + 4 * v, sizeof gv);
      r[v] += gv * wk;
    }
  }
  std::memcpy(out, r, sizeof r);
}

template <class I>
void ffi_grad_input_transposed(const KernelArgs& a) {
  const float* dy = a.in[0].as<float>();
  const I* index = a.in[1].as<I>();
  const float* w = a.in[2].as<float>();
  float* dx = a.out[0].as<float>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t fan_in = a.in[1].shape[1], hidden = a.out[0].shape[1];
  const int64_t slots = labels * fan_in;
  const int nt = threads_of(a);
  if (batch == 0) return;

  int32_t* start = static_cast<int32_t*>(a.workspace);
  int32_t* slot_label = start + hidden + 1;
  float* slot_weight = reinterpret_cast<float*>(slot_label + slots);
  float* dyt = slot_weight + slots;
  // Counting sort of the slots by hidden unit; filling in slot order keeps
  // each unit's list ascending in (l,k).
  for (int64_t h = 0; h <= hidden; ++h) start[h] = 0;
  for (int64_t s = 0; s < slots; ++s) ++start[int64_t{index[s]} + 1];
  for (int64_t h = 0; h < hidden; ++h) start[h + 1] += start[h];
  for (int64_t l = 0; l < labels; ++l)
    for (int64_t k = 0; k < fan_in; ++k) {
      const int64_t s = l * fan_in + k, pos = start[index[s]]++;
      slot_label[pos] = static_cast<int32_t>(l);
      slot_weight[pos] = w[s];
    }
  // Every start[h] has advanced to the end of its list; shift them back.
  for (int64_t h = hidden; h > 0; --h) start[h] = start[h - 1];
  start[0] = 0;

  const int64_t blocks = (batch + kColBlock - 1) / kColBlock;
  const int64_t stride = dy_block_stride(batch);
  const int64_t nht = (hidden + kHiddenTile - 1) / kHiddenTile;
#pragma omp parallel num_threads(nt) if (nt > 1 && batch * (slots + hidden) > kGrain)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t b0 = blk * kColBlock, nb = std::min(kColBlock, batch - b0), lanes = lanes_of(nb);
    // A short block's missing rows read as zeros: computed, never stored.
#pragma omp for schedule(static)
    for (int64_t l = 0; l < labels; ++l)
      for (int64_t i = 0; i < stride; ++i)
        dyt[l * stride + i] = i < nb ? dy[(b0 + i) * labels + l] : 0.0f;
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < nht; ++t) {
      const int64_t h0 = t * kHiddenTile, h1 = std::min(hidden, h0 + kHiddenTile);
      for (int64_t h = h0; h < h1; ++h) {
        alignas(64) float acc[kColBlock];
        int64_t c = 0;
        for (; c + 16 <= lanes; c += 16)
          gather_slots<16>(slot_label, slot_weight, start[h], start[h + 1], dyt + c, stride,
                           acc + c);
        for (; c < lanes; c += 8)
          gather_slots<8>(slot_label, slot_weight, start[h], start[h + 1], dyt + c, stride,
                          acc + c);
        for (int64_t i = 0; i < nb; ++i) dx[(b0 + i) * hidden + h] = acc[i];
      }
    }
  }
}

// ---- topk --------------------------------------------------------------------

// The contract's order as a strict total order on (value, position): larger
// values first, NaN after every number, equal values by lower position.
struct RanksAbove {
  const float* row;
  bool operator()(int32_t p, int32_t q) const {
    const float u = row[p], v = row[q];
    const bool nu = std::isnan(u), nv = std::isnan(v);
    if (nu != nv) return nv;
    if (!nu && u != v) return u > v;
    return p < q;
  }
};

// One pass per row keeping the k best seen so far in a heap whose top is the
// worst of them. The heap lives in the row's own slice of the indices output,
// so no scratch is needed. Candidates arrive in ascending position, so one
// that merely ties the worst never displaces it.
void topk_heap(const KernelArgs& a) {
  if (!all_f32(a)) return;
  const float* x = a.in[0].as<float>();
  float* values = a.out[0].as<float>();
  int32_t* indices = a.out[1].as<int32_t>();
  const int64_t batch = a.in[0].shape[0], labels = a.in[0].shape[1];
  const int64_t k = a.out[0].shape[1];
  const int nt = threads_of(a);
#pragma omp parallel for num_threads(nt) if (nt > 1 && batch * labels > kGrain) schedule(dynamic, 4)
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = x + b * labels;
    int32_t* heap = indices + b * k;
    const RanksAbove above{row};
    for (int64_t i = 0; i < k; ++i) heap[i] = static_cast<int32_t>(i);
    std::make_heap(heap, heap + k, above);
    for (int64_t i = k; i < labels; ++i) {
      const float v = row[i], worst = row[heap[0]];
      if (!(v > worst) && !(std::isnan(worst) && !std::isnan(v))) continue;
      std::pop_heap(heap, heap + k, above);
      heap[k - 1] = static_cast<int32_t>(i);
      std::push_heap(heap, heap + k, above);
    }
    std::sort_heap(heap, heap + k, above);
    for (int64_t r = 0; r < k; ++r) values[b * k + r] = row[heap[r]];
  }
}

// ---- dispatch --------------------------------------------------------------

template <template <class> class Kernel>
void by_index(const KernelArgs& a, DType index_dtype) {
  if (!all_f32(a)) return;
  if (index_dtype == DType::u16) Kernel<uint16_t>::run(a);
  if (index_dtype == DType::i32) Kernel<int32_t>::run(a);
}

template <class I>
struct FfiLinear {
  static void run(const KernelArgs& a) { ffi_linear_gather<I>(a); }
};
template <class I>
struct FfiGradWeight {
  static void run(const KernelArgs& a) { ffi_grad_weight_sddmm<I>(a); }
};
template <class I>
struct FfiGradInputRowwise {
  static void run(const KernelArgs& a) { ffi_grad_input_rowwise<I>(a); }
};
template <class I>
struct FfiGradInputTransposed {
  static void run(const KernelArgs& a) { ffi_grad_input_transposed<I>(a); }
};

void ffi_linear_omp(const KernelArgs& a) {
  by_index<FfiLinear>(a, a.in[1].dtype);
}
void ffi_grad_weight_omp(const KernelArgs& a) {
  by_index<FfiGradWeight>(a, a.in[2].dtype);
}
void ffi_grad_input_rowwise_omp(const KernelArgs& a) {
  by_index<FfiGradInputRowwise>(a, a.in[1].dtype);
}
void ffi_grad_input_transposed_omp(const KernelArgs& a) {
  by_index<FfiGradInputTransposed>(a, a.in[1].dtype);
}

// ---- scatter_add_rows ---------------------------------------------------------
//
// out = dense (unless in place), then the listed rows of g added to theirs.
// The ids are distinct (the producer lists each row once), so each listed row
// is one piece: no two threads touch the same element. A count outside
// [0, R] is clamped and an id outside [0, F) skipped, as in the reference.

void scatter_add_rows_omp(const KernelArgs& a) {
  if (!all_f32(a)) return;
  const TensorView& dv = a.in[0];
  const int64_t f = dv.ndim == 2 ? dv.shape[0] : 0;
  const int64_t o = dv.ndim == 2 ? dv.shape[1] : 0;
  const float* dense = dv.as<const float>();
  float* out = a.out[0].as<float>();
  const int threads = threads_of(a);
  if (out != dense && f * o > 0) {
    // Copied in fixed slices of rows; a copy is memory-bound, so a few
    // threads suffice.
    const int64_t pieces = std::min<int64_t>(f, std::max<int64_t>(1, f * o / kGrain));
#pragma omp parallel for num_threads(threads) if (pieces > 1) schedule(static)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t r0 = f * p / pieces, r1 = f * (p + 1) / pieces;
      std::memcpy(out + r0 * o, dense + r0 * o, static_cast<size_t>((r1 - r0) * o) * sizeof(float));
    }
  }
  const int64_t cap = a.in[1].numel() - 1;
  if (cap <= 0 || o == 0) return;
  const int32_t* rows = a.in[1].as<const int32_t>();
  const int64_t n = std::clamp<int64_t>(rows[0], 0, cap);
  const float* g = a.in[2].as<const float>();
#pragma omp parallel for num_threads(threads) if (n * o > kGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[1 + i];
    if (r < 0 || r >= f) continue;
    float* dst = out + r * o;
    const float* src = g + i * o;
    for (int64_t j = 0; j < o; ++j) dst[j] += src[j];
  }
}

// ---- supports ----------------------------------------------------------------

// Entry ids, rows and group starts are int32 in the workspace.
bool supports_sparse_grad_weight(const KernelArgs& a) {
  return f32_operands(a) && a.in[1].shape[0] < kInt32Max && fits_int32(a.in[3].shape[0]);
}
bool supports_ffi_forward(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype);
}
// The index is input 1 of ffi_grad_input, input 2 of ffi_grad_weight.
bool supports_ffi_grad_input(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[1].dtype);
}
// The slot lists are int32 offsets into L·K slots, one start per hidden unit.
bool supports_ffi_grad_input_transposed(const KernelArgs& a) {
  return supports_ffi_grad_input(a) && fits_int32(a.in[1].numel()) && a.out[0].shape[1] < kInt32Max;
}
bool supports_ffi_grad_weight(const KernelArgs& a) {
  return f32_operands(a) && is_index_dtype(a.in[2].dtype);
}
// Positions go out as int32.
bool supports_topk(const KernelArgs& a) {
  return f32_operands(a) && fits_int32(a.in[0].shape[1]);
}

}  // namespace

std::vector<KernelVariant> cpu_sparse_kernels() {
  std::vector<KernelVariant> v = {
      {"sparse_linear", "omp", sparse_linear_omp, nullptr, true, f32_operands},
      {"sparse_linear_grad_weight", "omp", sparse_linear_grad_weight_omp,
       sparse_linear_grad_weight_ws, true, supports_sparse_grad_weight},
      {"ffi_linear", "omp", ffi_linear_omp, ffi_linear_ws, true, supports_ffi_forward},
      {"ffi_grad_input", "rowwise", ffi_grad_input_rowwise_omp, ffi_grad_input_rowwise_ws, true,
       supports_ffi_grad_input},
      {"ffi_grad_input", "transposed", ffi_grad_input_transposed_omp, ffi_grad_input_transposed_ws,
       true, supports_ffi_grad_input_transposed},
      {"ffi_grad_weight", "omp", ffi_grad_weight_omp, ffi_grad_weight_ws, true,
       supports_ffi_grad_weight},
      {"topk", "omp", topk_heap, nullptr, true, supports_topk},
      {"scatter_add_rows", "omp", scatter_add_rows_omp, nullptr, true, f32_operands},
  };
  // The fused output layer's kernels (ffi_head.cpp) belong to this family.
  for (const KernelVariant& f : cpu_ffi_head_kernels()) v.push_back(f);
  return v;
}

}  // namespace pooch::kern
