// Appends optimizer update ops (and their state tensors) to a graph.
#pragma once
#include <vector>

#include "autodiff.h"
#include "graph.h"

namespace pooch {

struct OptimizerConfig {
  enum class Kind { sgd, adam, adamw };
  Kind kind = Kind::adam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.9;  // SGD
  // The weight-decay mask. false: only weights of rank 2 and more decay
  // (matrices and embedding tables), biases and norm gains do not, as GPT-2
  // and most transformers are trained.
  bool decay_vectors = true;
  // Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_): when
  // > 0, every gradient is scaled by min(1, clip_norm / (‖g‖ + 1e-6)), ‖g‖
  // the norm of all of them together. Every update then waits for every
  // gradient (they all stay live until the updates run).
  double clip_norm = 0.0;
};

// One update op per weight: dense gradients use sgd_update/adam_update,
// row-sparse ones the lazy *_rows variants. State tensors (zeros at start)
// are named "<weight>.m", "<weight>.v" or "<weight>.momentum". Each update
// carries its weight's decay (0 where the mask exempts the weight). With
// clip_norm, a chain of grad_sumsq ops sums ‖g‖² over the gradients in the
// order backward completes them, and every update reads the total; row-sparse
// gradients cannot be clipped (POOCH_ERR_INVALID_ARG naming the weight).
void append_optimizer(Graph& g, const std::vector<WeightGrad>& grads, const OptimizerConfig& cfg);

}  // namespace pooch
