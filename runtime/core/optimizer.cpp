#include "optimizer.h"

namespace pooch {

namespace {

TensorId add_state(Graph& g, TensorId w, const char* suffix) {
  const TensorDesc& wd = g.tensor(w);
  return g.add_tensor(
      TensorDesc{wd.name + "." + suffix, wd.dtype, wd.shape, Role::optimizer_state});
}

}  // namespace

void append_optimizer(Graph& g, const std::vector<WeightGrad>& grads, const OptimizerConfig& cfg) {
  for (const WeightGrad& wg : grads) {
    const TensorId rows = g.tensor(wg.grad).sparse_rows;
    const bool sparse = rows != kNoTensor;
    const bool decays = cfg.decay_vectors || g.tensor(wg.weight).shape.size() >= 2;
    const double wd = decays ? cfg.weight_decay : 0.0;
    if (cfg.kind == OptimizerConfig::Kind::sgd) {
      Attrs a{{"lr", cfg.lr}, {"momentum", cfg.momentum}, {"weight_decay", wd}};
      const TensorId mom = add_state(g, wg.weight, "momentum");
      if (sparse)
        g.add_op("sgd_update_rows", {wg.weight, rows, wg.grad, mom}, a);
      else
        g.add_op("sgd_update", {wg.weight, wg.grad, mom}, a);
      continue;
    }
    Attrs a{{"lr", cfg.lr},
            {"beta1", cfg.beta1},
            {"beta2", cfg.beta2},
            {"eps", cfg.eps},
            {"weight_decay", wd},
            {"decoupled", cfg.kind == OptimizerConfig::Kind::adamw ? 1.0 : 0.0}};
    const TensorId m = add_state(g, wg.weight, "m");
    const TensorId v = add_state(g, wg.weight, "v");
    if (sparse)
      g.add_op("adam_update_rows", {wg.weight, rows, wg.grad, m, v}, a);
    else
      g.add_op("adam_update", {wg.weight, wg.grad, m, v}, a);
  }
}

}  // namespace pooch
