#include "autodiff.h"

#include <fmt/format.h>

#include "error.h"
#include "op_registry.h"

namespace pooch {

namespace {

// The gradient of `x`, read by several ops, as the sum of two of theirs. Two
// dense ones are added. A row-sparse one (a sparse layer's weight gradient)
// and a dense one (the same weight read by a dense op: tied weights) make a
// dense sum, the sparse rows added into the dense gradient (in place when
// nothing else reads it); the optimizer then updates the weight densely.
TensorId sum_gradients(Graph& g, TensorId x, TensorId a, TensorId b) {
  const TensorId a_rows = g.tensor(a).sparse_rows, b_rows = g.tensor(b).sparse_rows;
  if (a_rows == kNoTensor && b_rows == kNoTensor)
    return g.add_op1("add", {a, b}, {}, grad_name(g, x), Role::gradient);
  if (a_rows != kNoTensor && b_rows != kNoTensor)
    throw Error(POOCH_ERR_UNSUPPORTED,
                fmt::format("'{}' is read by two ops that both give it a row-sparse gradient "
                            "('{}' and '{}'); summing two row-sparse gradients is not supported",
                            g.tensor(x).name, g.tensor(a).name, g.tensor(b).name));
  const TensorId dense = a_rows == kNoTensor ? a : b;
  const TensorId sparse = a_rows == kNoTensor ? b : a;
  return g.add_op1("scatter_add_rows", {dense, g.tensor(sparse).sparse_rows, sparse}, {},
                   grad_name(g, x), Role::gradient);
}

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

  std::vector<TensorId> grad(n_t, kNoTensor);
  for (int i = loss_node; i >= 0; --i) {
    const Node fwd = g.nodes()[static_cast<size_t>(i)];  // a copy: add_op grows nodes
    const OpDef& def = op_registry().get(fwd.op);
    if (!def.backward) continue;
    std::vector<TensorId> dy;
    bool any_dy = i == loss_node;
    for (TensorId o : fwd.outputs) {
      dy.push_back(grad[static_cast<size_t>(o)]);
      any_dy = any_dy || grad[static_cast<size_t>(o)] != kNoTensor;
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
      const auto x = static_cast<size_t>(fwd.inputs[k]);
      if (grad[x] == kNoTensor) {
        grad[x] = dx[k];
        continue;
      }
      grad[x] = sum_gradients(g, static_cast<TensorId>(x), grad[x], dx[k]);
    }
  }

  std::vector<WeightGrad> out;
  for (size_t t = 0; t < n_t; ++t)
    if (g.tensor(static_cast<TensorId>(t)).trainable && grad[t] != kNoTensor)
      out.push_back({static_cast<TensorId>(t), grad[t]});
  return out;
}

}  // namespace pooch
