#include "gpt.h"

#include <fmt/format.h>

#include <cmath>

#include "layers.h"

namespace pooch {

int64_t gpt_seq(const ModelSpec& spec) {
  return spec.run.seq > 0 ? spec.run.seq : spec.gpt.n_ctx;
}

bool is_lora_weight(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::vector<std::string> lora_linears(const ModelSpec& spec) {
  std::vector<std::string> out;
  const LoraSpec& l = spec.gpt.lora;
  if (l.rank == 0) return out;
  for (int64_t i = 0; i < spec.gpt.n_layer; ++i) {
    if (l.attn)
      for (const char* n : {"attn.c_attn", "attn.c_proj"})
        out.push_back(fmt::format("h.{}.{}", i, n));
    if (l.mlp)
      for (const char* n : {"mlp.c_fc", "mlp.c_proj"}) out.push_back(fmt::format("h.{}.{}", i, n));
  }
  return out;
}

namespace {

// GPT-2's initialisation (Hugging Face GPT2PreTrainedModel._init_weights):
// weights normal(0, 0.02), the projections into the residual stream scaled
// by 1/√(2·n_layer), biases zero, layernorm gains one.
constexpr double kInitStd = 0.02;

struct Builder {
  Graph& g;
  const AddWeight& weight;
  const GptSpec& s;
  uint32_t next_key = 1;  // dropout keys, one per dropout
  bool trainable = true;
  // Decoding: the attention reads and extends each layer's KV cache.
  TensorId decode_pos = kNoTensor;
  int64_t decode_batch = 0;

  // With adapters every base weight is frozen: only the adapters train.
  bool base_trainable() const { return trainable && s.lora.rank == 0; }

  // `adapt`: the linear is one of the spec's LoRA targets.
  TensorId linear(TensorId x, const std::string& name, int64_t out, int64_t in, double std,
                  bool adapt = false) {
    const bool t = base_trainable();
    const TensorId w =
        weight(name + ".weight", DType::f32, {out, in}, t, WeightInit::Kind::normal, std);
    const TensorId b = weight(name + ".bias", DType::f32, {out}, t, WeightInit::Kind::zeros, 0);
    const TensorId y = g.add_op1("linear", {x, w, b}, {}, name + ".out");
    if (!adapt || s.lora.rank == 0) return y;
    // peft's initialisation: A as nn.Linear's default (Kaiming uniform with
    // a = √5, a bound of 1/√in), B zeros, so training starts from the base
    // model. The scale goes on the rank-r activation, the narrowest tensor.
    const int64_t r = s.lora.rank;
    const TensorId a = weight(name + ".lora_A.weight", DType::f32, {r, in}, trainable,
                              WeightInit::Kind::uniform, 1.0 / std::sqrt(static_cast<double>(in)));
    const TensorId bw = weight(name + ".lora_B.weight", DType::f32, {out, r}, trainable,
                               WeightInit::Kind::zeros, 0);
    const TensorId xa = g.add_op1("linear", {x, a}, {}, name + ".lora_A.out");
    const TensorId scaled =
        g.add_op1("scale", {xa}, {{"s", s.lora.scale()}}, name + ".lora.scaled");
    const TensorId d = g.add_op1("linear", {scaled, bw}, {}, name + ".lora_B.out");
    return g.add_op1("add", {y, d}, {}, name + ".lora.sum");
  }

  TensorId layernorm(TensorId x, const std::string& name) {
    const int64_t C = s.n_embd;
    const bool t = base_trainable();
    const TensorId gamma =
        weight(name + ".weight", DType::f32, {C}, t, WeightInit::Kind::constant, 1.0);
    const TensorId beta = weight(name + ".bias", DType::f32, {C}, t, WeightInit::Kind::zeros, 0);
    return g.add_op("layernorm", {x, gamma, beta}, {{"eps", s.layer_norm_epsilon}},
                    {name + ".out", name + ".mean", name + ".rstd"})[0];
  }

  TensorId dropout(TensorId x, const std::string& name) {
    if (s.dropout <= 0) return x;
    return g.add_op1("dropout", {x}, {{"p", s.dropout}, {"key", double(next_key++)}}, name);
  }

  TensorId block(TensorId h, int64_t i) {
    const std::string p = fmt::format("h.{}", i);
    const int64_t C = s.n_embd;
    const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(s.n_layer));
    const bool attn = s.lora.attn, mlp = s.lora.mlp;
    const TensorId qkv =
        linear(layernorm(h, p + ".ln_1"), p + ".attn.c_attn", 3 * C, C, kInitStd, attn);
    const Attrs heads{{"heads", double(s.n_head)}};
    TensorId att;
    if (decode_pos == kNoTensor) {
      att = g.add_op("causal_attention", {qkv}, heads, {p + ".attn.out", p + ".attn.lse"})[0];
    } else {
      const TensorId cache = weight(p + kKvCacheSuffix, DType::f32, {decode_batch, s.n_ctx, 2 * C},
                                    false, WeightInit::Kind::zeros, 0);
      att = g.add_op1("attention_decode", {qkv, cache, decode_pos}, heads, p + ".attn.out");
    }
    const TensorId a =
        dropout(linear(att, p + ".attn.c_proj", C, C, proj_std, attn), p + ".attn.drop");
    h = g.add_op1("add", {h, a}, {}, p + ".res1");
    const TensorId fc = linear(layernorm(h, p + ".ln_2"), p + ".mlp.c_fc", 4 * C, C, kInitStd, mlp);
    const TensorId act = g.add_op1("gelu_tanh", {fc}, {}, p + ".mlp.act");
    const TensorId m =
        dropout(linear(act, p + ".mlp.c_proj", C, 4 * C, proj_std, mlp), p + ".mlp.drop");
    return g.add_op1("add", {h, m}, {}, p + ".res2");
  }
};

}  // namespace

std::unique_ptr<Model> build_gpt_model(const ModelSpec& spec, const GptBuildOptions& opt) {
  ModelSpec s = spec;
  s.family = Family::gpt;
  validate_spec(s);
  auto m = new_model(s);
  Graph& g = m->graph;
  const GptSpec& c = s.gpt;
  const int64_t B = s.run.batch, T = gpt_seq(s), C = c.n_embd, V = c.vocab_size;
  const AddWeight weight = weight_adder(*m);
  Builder b{g, weight, c};

  const TensorId tokens = g.add_tensor({"batch.tokens", DType::i32, {B, T}, Role::input});
  const TensorId targets = g.add_tensor({"batch.targets", DType::i32, {B, T}, Role::input});
  m->inputs.push_back({"batch.tokens", tokens, 0, 0.0, false, V});
  m->inputs.push_back({"batch.targets", targets, 0, -1.0, false, V});

  const bool base = b.base_trainable();
  const TensorId wte =
      weight("wte.weight", DType::f32, {V, C}, base, WeightInit::Kind::normal, kInitStd);
  const TensorId wpe =
      weight("wpe.weight", DType::f32, {c.n_ctx, C}, base, WeightInit::Kind::normal, kInitStd);
  const TensorId pos = weight("pos.ids", DType::i32, {B, T}, false, WeightInit::Kind::positions, 0);
  const TensorId te = g.add_op1("embedding", {tokens, wte}, {}, "wte.out");
  // Every batch touches every position up to T: a dense gradient, updated
  // as PyTorch's AdamW updates it.
  const TensorId pe = g.add_op1("embedding", {pos, wpe}, {{"dense_grad", 1}}, "wpe.out");
  TensorId h = b.dropout(g.add_op1("add", {te, pe}, {}, "embed"), "embed.drop");
  for (int64_t i = 0; i < c.n_layer; ++i) h = b.block(h, i);
  const TensorId hf = b.layernorm(h, "ln_f");
  // The output projection is wte itself (tied): its gradient is the head's
  // dense one with the embedding's rows added in.
  const TensorId loss =
      g.add_op("linear_xent_index", {hf, wte, targets}, {}, {"loss", "loss.lse"})[0];
  g.mark_output(loss);
  m->losses.push_back(loss);
  if (opt.logits) {
    const TensorId logits = g.add_op1("linear", {hf, wte}, {}, "logits");
    g.mark_output(logits);
    m->outputs.push_back({"logits", logits, 0});
  }
  m->outputs.push_back({"loss", loss});
  return m;
}

}  // namespace pooch

namespace pooch {

std::unique_ptr<Model> build_gpt_decoder(const ModelSpec& spec, int64_t batch) {
  ModelSpec s = spec;
  s.family = Family::gpt;
  s.run.batch = batch;
  s.run.seq = 1;
  s.gpt.dropout = 0;  // inference
  validate_spec(s);
  auto m = new_model(s);
  Graph& g = m->graph;
  const GptSpec& c = s.gpt;
  const int64_t B = batch, C = c.n_embd, V = c.vocab_size;
  const AddWeight weight = weight_adder(*m);
  Builder b{g, weight, c};
  b.trainable = false;

  const TensorId tokens = g.add_tensor({"decode.tokens", DType::i32, {B, 1}, Role::input});
  const TensorId pos = g.add_tensor({"decode.pos", DType::i32, {B, 1}, Role::input});
  m->inputs.push_back({"decode.tokens", tokens, 0, 0.0, false, V});
  m->inputs.push_back({"decode.pos", pos, 0, 0.0, false, c.n_ctx});
  b.decode_pos = pos;
  b.decode_batch = B;
  const TensorId wte =
      weight("wte.weight", DType::f32, {V, C}, false, WeightInit::Kind::normal, kInitStd);
  const TensorId wpe =
      weight("wpe.weight", DType::f32, {c.n_ctx, C}, false, WeightInit::Kind::normal, kInitStd);
  const TensorId te = g.add_op1("embedding", {tokens, wte}, {}, "wte.out");
  const TensorId pe = g.add_op1("embedding", {pos, wpe}, {}, "wpe.out");
  TensorId h = g.add_op1("add", {te, pe}, {}, "embed");
  for (int64_t i = 0; i < c.n_layer; ++i) h = b.block(h, i);
  const TensorId logits = g.add_op1("linear", {b.layernorm(h, "ln_f"), wte}, {}, "logits");
  g.mark_output(logits);
  m->outputs.push_back({"logits", logits, 0});
  return m;
}

}  // namespace pooch
