#include "layouts.h"

#include <fmt/format.h>

#include <numeric>

#include "../../kernels/common/layout.h"
#include "../core/error.h"

namespace pooch {
namespace {

using kern::Layout;

constexpr uint32_t bit(Layout l) {
  return uint32_t{1} << static_cast<int>(l);
}

// The blocked layouts a tensor may lie in by what it holds (a bit per Layout).
uint32_t candidates(const TensorDesc& d) {
  if (d.dtype != DType::f32 || d.shape.size() != 4) return 0;
  const int64_t* s = d.shape.data();
  uint32_t m = 0;
  if ((d.role == Role::activation || d.role == Role::gradient) &&
      kern::fits_layout(Layout::nchw16c, s, 4))
    m |= bit(Layout::nchw16c);
  if ((persistent(d) || d.role == Role::gradient) && kern::fits_layout(Layout::oihw16i16o, s, 4))
    m |= bit(Layout::oihw16i16o);
  return m;
}

// The blocked layouts a launch takes for the operand of `operand_bit`.
uint32_t taken(const LaunchLayouts& k, uint32_t operand_bit) {
  return ((k.nchw16c & operand_bit) ? bit(Layout::nchw16c) : 0) |
         ((k.oihw16i16o & operand_bit) ? bit(Layout::oihw16i16o) : 0);
}

// The first blocked layout of a mask (nchw16c before oihw16i16o); plain if none.
Layout first_of(uint32_t mask) {
  for (Layout l : {Layout::nchw16c, Layout::oihw16i16o})
    if (mask & bit(l)) return l;
  return Layout::plain;
}

// Tensors joined by same_layout kernels: one layout per class.
struct Classes {
  std::vector<TensorId> parent;
  explicit Classes(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), TensorId{0}); }
  TensorId find(TensorId t) {
    while (parent[static_cast<size_t>(t)] != t)
      t = parent[static_cast<size_t>(t)] =
          parent[static_cast<size_t>(parent[static_cast<size_t>(t)])];
    return t;
  }
  void join(TensorId a, TensorId b) { parent[static_cast<size_t>(find(a))] = find(b); }
};

}  // namespace

LaunchLayouts launch_layouts(const kern::KernelVariant* k, const kern::KernelArgs& a) {
  if (k == nullptr) return {};
  LaunchLayouts out{k->blocked, k->blocked_weights, k->same_layout};
  if (k->supports == nullptr) return out;
  // Each operand alone in its blocked layout, where its shape allows one.
  auto ask = [&](uint32_t& mask, Layout l) {
    for (int b = 0; b < 32; ++b) {
      const uint32_t operand_bit = uint32_t{1} << b;
      if (!(mask & operand_bit)) continue;
      kern::KernelArgs one = a;
      const bool is_out = b >= kern::kOutBit;
      const int i = is_out ? b - kern::kOutBit : b;
      if (i >= (is_out ? a.n_out : a.n_in)) continue;
      kern::TensorView& v = is_out ? one.out[i] : one.in[i];
      if (!kern::fits_layout(l, v.shape, v.ndim)) continue;
      v.layout = l;
      if (!k->supports(one)) mask &= ~operand_bit;
    }
  };
  ask(out.nchw16c, Layout::nchw16c);
  ask(out.oihw16i16o, Layout::oihw16i16o);
  return out;
}

std::vector<Layout> choose_layouts(const Graph& g, const ProgramRequest& req, const Aliases& al,
                                   const LayoutLaunches& launches, bool blocked,
                                   std::span<const Layout> fixed) {
  const size_t n = g.num_tensors();
  std::vector<Layout> out(n, Layout::plain);
  if (!blocked) return out;
  auto root = [&](TensorId t) { return al.root[static_cast<size_t>(t)]; };
  auto held = [&](size_t t) { return !fixed.empty() && persistent(g.tensor(t)); };
  // Per tensor: the blocked layouts still open to it.
  std::vector<uint32_t> open(n, 0);
  for (size_t t = 0; t < n; ++t) {
    if (al.root[t] != static_cast<TensorId>(t) || al.has_alias[t]) continue;
    open[t] = candidates(g.tensor(t));
    if (held(t)) open[t] &= fixed[t] == Layout::plain ? 0 : bit(fixed[t]);
  }
  for (TensorId t : req.outputs) open[static_cast<size_t>(root(t))] = 0;
  Classes cls(n);
  // Each launch narrows its operands to what its kernel takes there; a
  // same_layout kernel's blocked operands share one class.
  auto visit = [&](const Node& nd, const LaunchLayouts& k) {
    TensorId first = kNoTensor;
    auto operand = [&](TensorId x, uint32_t operand_bit) {
      const TensorId r = root(x);
      const uint32_t takes = taken(k, operand_bit);
      open[static_cast<size_t>(r)] &= takes;
      if (takes == 0 || !k.same) return;
      if (first == kNoTensor)
        first = r;
      else
        cls.join(r, first);
    };
    for (size_t i = 0; i < nd.inputs.size(); ++i)
      operand(nd.inputs[i], kern::in_bit(static_cast<int>(i)));
    for (size_t j = 0; j < nd.outputs.size(); ++j)
      operand(nd.outputs[j], kern::out_bit(static_cast<int>(j)));
  };
  const std::vector<Node>& nodes = g.nodes();
  for (size_t p = 0; p < req.nodes.size(); ++p) {
    visit(nodes[static_cast<size_t>(req.nodes[p])], launches.kernel[p]);
    if (launches.replay[p]) visit(*launches.replay[p], launches.replay_kernel[p]);
  }
  // A class takes a layout all its tensors may take.
  std::vector<uint32_t> class_open(n, ~uint32_t{0});
  for (size_t t = 0; t < n; ++t) {
    if (al.root[t] != static_cast<TensorId>(t)) continue;
    class_open[static_cast<size_t>(cls.find(static_cast<TensorId>(t)))] &= open[t];
  }
  for (size_t t = 0; t < n; ++t) {
    const auto r = static_cast<size_t>(al.root[t]);
    if (open[r] == 0) continue;
    out[t] = first_of(class_open[static_cast<size_t>(cls.find(static_cast<TensorId>(r)))]);
  }
  for (size_t t = 0; t < n; ++t)
    if (held(t) && out[t] != fixed[t])
      throw Error(
          POOCH_ERR_UNSUPPORTED,
          fmt::format("the session holds '{}' in a blocked layout (kern::Layout {}) and "
                      "this program needs it in layout {} (it copies out a tensor its "
                      "update reads, or views it); plan the session with blocked "
                      "layouts off (SessionConfig::blocked_layouts = false)",
                      g.tensor(t).name, static_cast<int>(fixed[t]), static_cast<int>(out[t])));
  return out;
}

std::vector<Layout> persistent_layouts(const Graph& g,
                                       std::span<const ProgramRequest* const> programs,
                                       std::span<const std::vector<Layout>> chosen) {
  const size_t n = g.num_tensors();
  std::vector<Layout> out(n, Layout::plain);
  std::vector<char> seen(n, 0), agree(n, 1);
  for (size_t i = 0; i < programs.size(); ++i) {
    std::vector<char> touched(n, 0);
    for (int ni : programs[i]->nodes) {
      const Node& nd = g.nodes()[static_cast<size_t>(ni)];
      for (TensorId x : nd.inputs) touched[static_cast<size_t>(x)] = 1;
      for (TensorId y : nd.outputs) touched[static_cast<size_t>(y)] = 1;
    }
    for (size_t t = 0; t < n; ++t) {
      if (!touched[t] || !persistent(g.tensor(t))) continue;
      const Layout l = chosen[i][t];
      if (!seen[t]) out[t] = l;
      agree[t] = agree[t] && l == out[t];
      seen[t] = 1;
    }
  }
  for (size_t t = 0; t < n; ++t)
    if (!agree[t]) out[t] = Layout::plain;
  return out;
}

}  // namespace pooch
