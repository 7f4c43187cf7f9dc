// The gpt family: GPT-2 (Radford et al. 2019) as Hugging Face's
// GPT2LMHeadModel computes it. Token and position embeddings, n_layer
// pre-norm blocks (layernorm -> fused q,k,v projection -> causal multi-head
// attention -> output projection -> residual; layernorm -> 4C linear ->
// tanh GELU -> C linear -> residual), a final layernorm, and the output
// projection tied to the token embedding, fused with the softmax
// cross-entropy so the [tokens x vocabulary] logits are never stored.
//
// Weight names are Hugging Face's state-dict keys without "transformer.":
// wte.weight [V,C], wpe.weight [n_ctx,C], h.{i}.ln_1.weight|bias,
// h.{i}.attn.c_attn.weight [3C,C]|bias [3C], h.{i}.attn.c_proj.weight
// [C,C]|bias, h.{i}.ln_2.weight|bias, h.{i}.mlp.c_fc.weight [4C,C]|bias,
// h.{i}.mlp.c_proj.weight [C,4C]|bias, ln_f.weight|bias. Linear weights are
// [out, in] (nn.Linear's layout; HF's Conv1D stores them transposed). One
// non-trainable tensor, pos.ids i32[B,T], holds each token's position.
//
// Inputs: batch.tokens i32[B,T] (padding rows 0), batch.targets i32[B,T]
// (the next token of each position; -1 ignored, padding rows -1). Outputs:
// loss (mean cross-entropy over counted positions) and, when asked for,
// logits f32[B,T,V].
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model.h"
#include "model_spec.h"

namespace pooch {

struct GptBuildOptions {
  bool logits = false;  // also output logits [B,T,V] (tests, scoring; costs B·T·V floats)
};

std::unique_ptr<Model> build_gpt_model(const ModelSpec& spec, const GptBuildOptions& opt = {});

// The same model as one step of incremental decoding over a KV cache: for
// each of `batch` sequences one token in, the next token's logits out.
// Inputs: decode.tokens i32[B,1] and decode.pos i32[B,1] (the token's
// position, 0-based; at most n_ctx - 1). Output: logits f32[B,1,V]. Weights
// have the training model's names (copied from a trained session or a model
// file); each layer adds its cache, h.{i}.attn.kv_cache f32[B, n_ctx, 2C]
// (zeros at start), a persistent tensor planned in the arena like a weight,
// so its size is fixed by the context length. A step writes its k and v at
// its position and attends over positions 0..pos: positions past it hold
// stale values that are never read, so a new prompt needs no clearing.
std::unique_ptr<Model> build_gpt_decoder(const ModelSpec& spec, int64_t batch = 1);

// The decoder's cache tensors end with this.
inline constexpr const char* kKvCacheSuffix = ".attn.kv_cache";

// Tokens per row the spec runs with (its seq, or n_ctx when 0).
int64_t gpt_seq(const ModelSpec& spec);

// A LoRA adapter's weight: "<linear>.lora_A.weight" [rank, in] or
// "<linear>.lora_B.weight" [out, rank] (model_spec.h, LoraSpec).
bool is_lora_weight(std::string_view name);

// The spec's LoRA targets: the names of the linears that carry adapters.
std::vector<std::string> lora_linears(const ModelSpec& spec);

}  // namespace pooch
