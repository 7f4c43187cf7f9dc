#include "optimizer.h"

#include <fmt/format.h>

#include <cmath>

#include "error.h"

namespace pooch {

namespace {

TensorId add_state(Graph& g, TensorId w, const char* suffix) {
  const TensorDesc& wd = g.tensor(w);
  return g.add_tensor(
      TensorDesc{wd.name + "." + suffix, wd.dtype, wd.shape, Role::optimizer_state});
}

// ‖g‖² of every gradient: a chain in reverse weight order, the order the
// backward pass completes them, so each link can run as its gradient is done.
TensorId add_grad_norm(Graph& g, const std::vector<WeightGrad>& grads) {
  TensorId acc = kNoTensor;
  for (auto it = grads.rbegin(); it != grads.rend(); ++it) {
    if (g.tensor(it->grad).sparse_rows != kNoTensor)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("gradient clipping needs dense gradients; weight '{}' has a "
                              "row-sparse one (a sparse input layer): train it without clipping",
                              g.tensor(it->weight).name));
    std::vector<TensorId> in{it->grad};
    if (acc != kNoTensor) in.push_back(acc);
    acc = g.add_op1("grad_sumsq", in, {}, g.unique_name("grad_norm.sumsq"), Role::gradient);
  }
  return acc;
}

}  // namespace

void append_optimizer(Graph& g, const std::vector<WeightGrad>& grads, const OptimizerConfig& cfg) {
  if (!(cfg.clip_norm >= 0 && std::isfinite(cfg.clip_norm)))
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("clip_norm must be finite and >= 0 (0: no clipping), got {}", cfg.clip_norm));
  const TensorId sumsq = cfg.clip_norm > 0 ? add_grad_norm(g, grads) : kNoTensor;
  for (const WeightGrad& wg : grads) {
    const TensorId rows = g.tensor(wg.grad).sparse_rows;
    const bool sparse = rows != kNoTensor;
    const bool decays = cfg.decay_vectors || g.tensor(wg.weight).shape.size() >= 2;
    const double wd = decays ? cfg.weight_decay : 0.0;
    if (cfg.kind == OptimizerConfig::Kind::sgd) {
      Attrs a{{"lr", cfg.lr}, {"momentum", cfg.momentum}, {"weight_decay", wd}};
      const TensorId mom = add_state(g, wg.weight, "momentum");
      if (sparse) {
        g.add_op("sgd_update_rows", {wg.weight, rows, wg.grad, mom}, a);
      } else if (sumsq != kNoTensor) {
        a.set("max_norm", cfg.clip_norm);
        g.add_op("sgd_update", {wg.weight, wg.grad, mom, sumsq}, a);
      } else {
        g.add_op("sgd_update", {wg.weight, wg.grad, mom}, a);
      }
      continue;
    }
    Attrs a{
        {"lr", cfg.lr},       {"beta1", cfg.beta1},
        {"beta2", cfg.beta2}, {"eps", cfg.eps},
        {"weight_decay", wd}, {"decoupled", cfg.kind == OptimizerConfig::Kind::adamw ? 1.0 : 0.0}};
    const TensorId m = add_state(g, wg.weight, "m");
    const TensorId v = add_state(g, wg.weight, "v");
    if (sparse) {
      g.add_op("adam_update_rows", {wg.weight, rows, wg.grad, m, v}, a);
    } else if (sumsq != kNoTensor) {
      a.set("max_norm", cfg.clip_norm);
      g.add_op("adam_update", {wg.weight, wg.grad, m, v, sumsq}, a);
    } else {
      g.add_op("adam_update", {wg.weight, wg.grad, m, v}, a);
    }
  }
}

}  // namespace pooch
