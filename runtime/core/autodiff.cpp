#include "autodiff.h"

#include <fmt/format.h>

#include <vector>

#include "error.h"
#include "op_registry.h"

namespace pooch {

namespace {

bool row_sparse(const Graph& g, TensorId t) {
  return g.tensor(t).sparse_rows != kNoTensor;
}

// dense + the rows of a row-sparse gradient, as a dense gradient of x.
TensorId scatter_into(Graph& g, TensorId x, TensorId dense, TensorId sparse) {
  return g.add_op1("scatter_add_rows", {dense, g.tensor(sparse).sparse_rows, sparse}, {},
                   grad_name(g, x), Role::gradient);
}

// The gradients of one tensor read by several ops, summed as they arrive.
// Two dense ones are added. A row-sparse one (a sparse layer's weight
// gradient) and a dense one (the same weight read by a dense op: tied
// weights) make a dense sum, the rows added into the dense gradient (in
// place when nothing else reads it); the optimizer then updates the weight
// densely. Row-sparse gradients that meet no dense one yet wait for it.
struct GradSum {
  TensorId sum = kNoTensor;       // dense, or the first row-sparse one
  std::vector<TensorId> waiting;  // further row-sparse ones

  void add(Graph& g, TensorId x, TensorId d) {
    if (sum == kNoTensor) {
      sum = d;
      return;
    }
    const bool sum_sparse = row_sparse(g, sum), d_sparse = row_sparse(g, d);
    if (sum_sparse && d_sparse) {
      waiting.push_back(d);
      return;
    }
    if (!sum_sparse && !d_sparse)
      sum = g.add_op1("add", {sum, d}, {}, grad_name(g, x), Role::gradient);
    else
      sum = sum_sparse ? scatter_into(g, x, d, sum) : scatter_into(g, x, sum, d);
    for (TensorId w : waiting) sum = scatter_into(g, x, sum, w);
    waiting.clear();
  }

  // Every gradient of x, summed; called once all have arrived.
  TensorId total(const Graph& g, TensorId x) const {
    if (!waiting.empty())
      throw Error(POOCH_ERR_UNSUPPORTED,
                  fmt::format("'{}' is read by {} ops that give it a row-sparse gradient and by "
                              "none that gives it a dense one; summing row-sparse gradients "
                              "alone is not supported",
                              g.tensor(x).name, waiting.size() + 1));
    return sum;
  }
};

}  // namespace

std::vector<WeightGrad> build_backward(Graph& g, TensorId loss) {
  const size_t n_fwd = g.nodes().size();
  const size_t n_t = g.num_tensors();

  // The loss must come from a loss op: its backward needs no incoming gradient.
  int loss_node = -1;
  for (size_t i = 0; i < n_fwd; ++i)
    for (TensorId o : g.nodes()[i].outputs)
      if (o == loss) loss_node = static_cast<int>(i);
  if (loss_node < 0 || !op_registry().get(g.nodes()[static_cast<size_t>(loss_node)].op).is_loss)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cannot differentiate '{}': it is not the output of a loss op",
                            g.tensor(loss).name));

  // Forward: which tensors depend on a trainable weight.
  std::vector<char> depends(n_t, 0);
  for (size_t t = 0; t < n_t; ++t)
    depends[t] = g.tensor(static_cast<TensorId>(t)).trainable ? 1 : 0;
  for (size_t i = 0; i < n_fwd; ++i) {
    const Node& nd = g.nodes()[i];
    if (!op_registry().get(nd.op).backward) continue;
    bool any = false;
    for (TensorId x : nd.inputs) any = any || depends[static_cast<size_t>(x)];
    if (any)
      for (TensorId o : nd.outputs) depends[static_cast<size_t>(o)] = 1;
  }

  std::vector<GradSum> grad(n_t);
  for (int i = loss_node; i >= 0; --i) {
    const Node fwd = g.nodes()[static_cast<size_t>(i)];  // a copy: add_op grows nodes
    const OpDef& def = op_registry().get(fwd.op);
    if (!def.backward) continue;
    std::vector<TensorId> dy;
    bool any_dy = i == loss_node;
    for (TensorId o : fwd.outputs) {
      // Every reader of o comes after this node: all its gradients are in.
      dy.push_back(grad[static_cast<size_t>(o)].total(g, o));
      any_dy = any_dy || dy.back() != kNoTensor;
    }
    if (!any_dy) continue;
    std::vector<char> needs;
    bool any_need = false;
    for (TensorId x : fwd.inputs) {
      needs.push_back(depends[static_cast<size_t>(x)]);
      any_need = any_need || depends[static_cast<size_t>(x)];
    }
    if (!any_need) continue;
    std::vector<TensorId> dx(fwd.inputs.size(), kNoTensor);
    def.backward(g, fwd, dy, needs, dx);
    for (size_t k = 0; k < dx.size(); ++k) {
      if (dx[k] == kNoTensor || !needs[k]) continue;
      grad[static_cast<size_t>(fwd.inputs[k])].add(g, fwd.inputs[k], dx[k]);
    }
  }

  std::vector<WeightGrad> out;
  for (size_t t = 0; t < n_t; ++t) {
    const auto id = static_cast<TensorId>(t);
    if (!g.tensor(id).trainable) continue;
    const TensorId total = grad[t].total(g, id);
    if (total != kNoTensor) out.push_back({id, total});
  }
  return out;
}

TensorId training_loss(const Graph& g, TensorId loss) {
  for (size_t t = 0; t < g.num_tensors(); ++t)
    if (g.tensor(static_cast<TensorId>(t)).repeats == loss) return static_cast<TensorId>(t);
  return loss;
}

}  // namespace pooch
