// A model's architecture as data: read from a JSON spec or made from the
// common flags (--hidden, --bottleneck, --fan-in, --loss), saved inside every
// .pooch file so a model file rebuilds itself.
//
// JSON form (docs/CLI.md has the reference):
//   {"input": {"kind": "sparse", "width": 5000}, "labels": 3993,
//    "layers": [{"type": "linear", "width": 512, "activation": "relu"},
//               {"type": "dropout", "p": 0.1}, {"type": "layernorm"},
//               {"type": "ffi", "fan_in": 32}],
//    "loss": "squared-hinge"}
// The last layer is the output layer: "ffi" (fixed fan-in) or "dense", both
// `labels` wide. "skip": true (xmc, sparse input) adds a linear path from the
// input straight to the labels, summed with the output layer's logits: a
// one-vs-all linear model (what linear XMC methods are) beside the network.
//
// The same form describes the "mlp" family (dense regression or
// classification): {"family": "mlp", "input": {"kind": "dense", "width": 8},
// "outputs": 3, "layers": [..., {"type": "dense"}], "loss": "mse" | "softmax"}.
//
// The "gpt" family (GPT-2 language models) has fields of its own instead of
// layers: {"family": "gpt", "size": "gpt2", "batch": 4, "seq": 256} or
// {"family": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 16,
//  "vocab_size": 97, "dropout": 0.0, "layer_norm_epsilon": 1e-5}
// (a size gives the defaults; explicit fields override them; gpt_spec.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cnn_spec.h"

namespace pooch {

enum class InputKind { sparse, dense };
enum class LossKind { bce, squared_hinge, softmax, mse };
enum class Family { xmc, mlp, gpt, resnet, vgg };
enum class LayerKind { linear, dropout, layernorm, ffi_head, dense_head };

struct LayerSpec {
  LayerKind kind = LayerKind::linear;
  int64_t width = 0;                // linear
  std::string activation = "relu";  // linear: relu, gelu or none
  double p = 0;                     // dropout
  int64_t fan_in = 0;               // ffi head
};

// How a model runs, apart from its architecture: rows per step, the
// nonzeros a sparse batch may hold (0: batch * 64), the positive labels a
// batch may hold (0: batch * 32), the most labels predict returns.
struct RunShape {
  int64_t batch = 64;
  int64_t seq = 0;  // gpt: tokens per row (0: the context length n_ctx)
  int64_t max_nnz = 0;
  int64_t max_labels = 0;
  int topk = 5;
};

// A GPT-2 architecture (Hugging Face GPT2Config's names): pre-norm blocks,
// learned positions, input and output embeddings tied. The defaults are
// GPT-2 124M ("gpt2").
// LoRA (Hu et al. 2021): each chosen linear y = xWᵀ + b becomes
// y = xWᵀ + b + (alpha/rank)·(xAᵀ)Bᵀ with A [rank, in] and B [out, rank] the
// only trainable weights; every base weight is frozen (no gradient, no
// optimizer state). Targets: "attn" (attn.c_attn, attn.c_proj), "mlp"
// (mlp.c_fc, mlp.c_proj).
struct LoraSpec {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 0;  // the scale's numerator; 0 means alpha = rank (scale 1)
  bool attn = true;  // adapters on the attention's two linears
  bool mlp = false;  // adapters on the MLP's two linears
  double scale() const { return (alpha > 0 ? alpha : static_cast<double>(rank)) / rank; }
};

struct GptSpec {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t n_ctx = 1024;  // the block size: positions the model has embeddings for
  int64_t vocab_size = 50257;
  double dropout = 0.0;  // on embeddings, attention output and MLP output (training only)
  double layer_norm_epsilon = 1e-5;
  LoraSpec lora;
};

struct ModelSpec {
  Family family = Family::xmc;
  InputKind input = InputKind::sparse;
  int64_t input_width = 0;
  int64_t labels = 0;
  std::vector<LayerSpec> layers;
  LossKind loss = LossKind::bce;
  GptSpec gpt;  // family gpt only
  RunShape run;
  uint64_t seed = 1;
  bool skip = false;  // a linear input -> labels path added to the head's logits
  // A fixed fan-in output layer runs fused with its loss and top-k (no [B, L]
  // logits; ffi_loss, ffi_topk) unless this is false ("fused_head": false in
  // JSON): the unfused ops are the reference the fused ones are checked by.
  bool fused_head = true;
  CnnSpec cnn;  // resnet, vgg (cnn_spec.h); labels holds the classes
};

inline bool is_cnn(Family f) {
  return f == Family::resnet || f == Family::vgg;
}

// The common shape: input -> linear(hidden, relu) [-> linear(bottleneck,
// relu)] [-> dropout] -> ffi(fan_in) or dense head.
ModelSpec spec_from_flags(InputKind input, int64_t input_width, int64_t labels, int64_t hidden,
                          int64_t bottleneck, int64_t fan_in, LossKind loss, double dropout);

// The out-of-core planner's test and benchmark chain: dense input ->
// `layers` x linear(width, gelu) -> dense head, MSE loss.
ModelSpec mlp_chain_spec(int layers, int64_t input_width, int64_t width, int64_t labels,
                         int64_t batch);

// Parses a JSON spec; errors (POOCH_ERR_BAD_INPUT) name `source` and the
// offending field, e.g. "model.json: layers[2].fan_in must be positive".
ModelSpec spec_from_json(const std::string& text, const std::string& source);
std::string spec_to_json(const ModelSpec& s);

// Checks the architecture (Error POOCH_ERR_INVALID_ARG naming the field).
void validate_spec(const ModelSpec& s);

const char* loss_name(LossKind k);
LossKind parse_loss(const std::string& name);  // "bce", "squared-hinge", "softmax", "mse"
const char* family_name(Family f);
// The prefix of the names of the output layer's weights, which finetuning on
// a new label set replaces: "head." (xmc, mlp), "fc." (resnet),
// "classifier.6." (vgg, torchvision's last Linear).
const char* head_prefix(Family f);

// The GPT-2 sizes by name: "gpt2" (124M), "gpt2-medium" (355M), "gpt2-large"
// (774M), "gpt2-xl" (1.5B); any case. Error POOCH_ERR_INVALID_ARG naming the
// known sizes otherwise.
GptSpec gpt_size(const std::string& name);
// A gpt spec of that size for this run shape.
ModelSpec gpt_spec(const GptSpec& g, int64_t batch, int64_t seq, uint64_t seed = 1);

}  // namespace pooch
