// The tiny GPT-2 the unit tests train: 2 layers, 2 heads, width 16, context
// 12, a vocabulary of 23 tokens (attention, layernorm, GELU, the fused output
// projection and cross-entropy, and dropout where asked), small enough to
// train in milliseconds.
#pragma once
#include <cstdint>

#include "runtime/models/model_spec.h"

namespace pooch {

inline ModelSpec tiny_gpt_spec(int64_t batch, int64_t seq, double dropout = 0.0) {
  GptSpec g;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 16;
  g.n_ctx = 12;
  g.vocab_size = 23;
  g.dropout = dropout;
  return gpt_spec(g, batch, seq, 3);
}

}  // namespace pooch
