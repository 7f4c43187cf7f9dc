#include "layouts.h"

#include <numeric>

namespace pooch {
namespace {

bool may_block(const TensorDesc& d) {
  return d.dtype == DType::f32 && d.shape.size() == 4 && d.shape[1] > 0 && d.shape[1] % 16 == 0 &&
         (d.role == Role::activation || d.role == Role::gradient);
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

std::vector<kern::Layout> choose_layouts(const Graph& g, const ProgramRequest& req,
                                         const Aliases& al, const LayoutLaunches& launches,
                                         bool blocked) {
  const size_t n = g.num_tensors();
  std::vector<kern::Layout> out(n, kern::Layout::plain);
  if (!blocked) return out;
  auto root = [&](TensorId t) { return al.root[static_cast<size_t>(t)]; };
  std::vector<char> ok(n, 0);
  for (size_t t = 0; t < n; ++t)
    ok[t] = al.root[t] == static_cast<TensorId>(t) && !al.has_alias[t] && may_block(g.tensor(t));
  for (TensorId t : req.outputs) ok[static_cast<size_t>(root(t))] = 0;
  Classes cls(n);
  // Every operand of a launch whose kernel does not take nchw16c there stays
  // plain; a same_layout kernel's blocked operands share one class.
  auto visit = [&](const Node& nd, const kern::KernelVariant* k) {
    TensorId first = kNoTensor;
    auto operand = [&](TensorId x, uint32_t bit) {
      const TensorId r = root(x);
      if (k == nullptr || !(k->blocked & bit)) {
        ok[static_cast<size_t>(r)] = 0;
        return;
      }
      if (!k->same_layout) return;
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
  // A class is blocked when all its tensors may be.
  std::vector<char> class_ok(n, 1);
  for (size_t t = 0; t < n; ++t)
    if (!ok[t]) class_ok[static_cast<size_t>(cls.find(static_cast<TensorId>(t)))] = 0;
  for (size_t t = 0; t < n; ++t) {
    const auto r = static_cast<size_t>(al.root[t]);
    if (ok[r] && class_ok[static_cast<size_t>(cls.find(static_cast<TensorId>(r)))])
      out[t] = kern::Layout::nchw16c;
  }
  return out;
}

}  // namespace pooch
