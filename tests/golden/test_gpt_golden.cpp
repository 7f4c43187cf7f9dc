// A golden test against Hugging Face transformers: make_gpt_train_golden.py built a
// tiny GPT2LMHeadModel with random weights and wrote its weights, a batch,
// the logits, the loss, every weight gradient, the losses of 10 AdamW steps
// and greedy generation's tokens to gpt_tiny.safetensors (the reference
// values from a float64 run). This test builds the same model with pooch's
// gpt builder on the CPU backend, loads the weights and compares.
//
// Tolerance, for every float compared: |pooch - reference| <= 1e-5 ·
// max(|reference|, floor), the floor being the compared tensor's largest
// magnitude: a tensor agrees to 1e-5 of its scale (an element far below the
// scale carries the rounding of the large ones it was summed from; PyTorch's
// own f32 run differs from the f64 reference by as much: make_gpt_train_golden.py
// prints its figure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/autodiff.h"
#include "runtime/core/error.h"
#include "runtime/core/optimizer.h"
#include "runtime/models/gpt.h"
#include "runtime/session/session.h"
#include "runtime/train/generate.h"
#include "runtime/train/lora.h"
#include "runtime/train/model_io.h"

using namespace pooch;

namespace {

constexpr double kRelTol = 1e-5;
// Relative to max(|element|, kFloor·(the tensor's largest magnitude)).
// Float32 sums carry rounding relative to the magnitudes summed, not to a
// result that cancels to near zero: an element 1000 times below its
// tensor's scale is compared absolutely, at 1e-5 of that scale.
constexpr double kFloor = 1.0;

// The few lines of safetensors this test needs: an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, data.
struct Tensors {
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<std::byte>>> t;

  template <class T>
  std::vector<T> get(const std::string& name) const {
    const auto it = t.find(name);
    if (it == t.end()) throw std::runtime_error("the golden file has no tensor " + name);
    std::vector<T> v(it->second.second.size() / sizeof(T));
    std::memcpy(v.data(), it->second.second.data(), v.size() * sizeof(T));
    return v;
  }
  bool has(const std::string& name) const { return t.count(name) != 0; }
};

Tensors read_golden(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Tensors out;
  const nlohmann::json h = nlohmann::json::parse(header);
  for (const auto& [name, d] : h.items()) {
    if (name == "__metadata__") continue;
    const size_t a = d["data_offsets"][0], b = d["data_offsets"][1];
    std::vector<std::byte> bytes(b - a);
    std::memcpy(bytes.data(), data.data() + a, b - a);
    out.t[name] = {d["shape"].get<std::vector<int64_t>>(), std::move(bytes)};
  }
  return out;
}

const Tensors& golden() {
  static const Tensors g = read_golden(POOCH_GPT_GOLDEN);
  return g;
}

const Tensors& lora_golden() {
  static const Tensors g = read_golden(POOCH_GPT_LORA_GOLDEN);
  return g;
}

double& worst_seen() {
  static double w = 0;
  return w;
}

void expect_close(const std::string& what, const float* got, const std::vector<float>& want) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  const double floor = std::max(scale * kFloor, 1e-30);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e =
        std::fabs(double(got[i]) - want[i]) / std::max(std::fabs(double(want[i])), floor);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  double& w = worst_seen();
  w = std::max(w, worst);
  EXPECT_LE(worst, kRelTol) << what << ": element " << at << " is " << got[at]
                            << ", the reference has " << want[at] << " (relative error " << worst
                            << ")";
}

ModelSpec tiny_spec(int64_t batch) {
  GptSpec g;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 32;
  g.n_ctx = 16;
  g.vocab_size = 97;
  return gpt_spec(g, batch, 16);
}

// Writes every weight from the file ("w.<name>") but the positions (the
// builder's constant); the file must hold each one, with the weight's size.
template <class S>
void load_weights(S& s, const Graph& g, const Tensors& j = golden()) {
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight || d.name == "pos.ids") continue;
    const std::vector<float> w = j.get<float>("w." + d.name);
    ASSERT_EQ(static_cast<int64_t>(w.size()), d.numel()) << d.name;
    s.write_tensor(d.name, w.data(), w.size() * 4);
  }
}

SessionConfig cpu_config(int threads) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = threads;
  cfg.train = false;
  return cfg;
}

// Builds `spec` with logits, loads the golden weights, and compares the
// loss, logits and the gradient of every trainable weight (`trainable` of
// them, each in the file), then the losses of 10 AdamW steps.
void expect_training_matches(const Tensors& j, const ModelSpec& spec, int threads, int trainable,
                             double clip_norm = 0, const char* losses = "adamw.losses") {
  auto model = build_gpt_model(spec, {.logits = true});
  Graph g = model->graph;
  const TensorId loss = model->losses[0];
  const TensorId logits = model->find_output("logits")->id;
  const std::vector<WeightGrad> grads = build_backward(g, loss);
  OptimizerConfig opt;
  opt.kind = OptimizerConfig::Kind::adamw;
  opt.lr = 1e-3;
  opt.beta1 = 0.9;
  opt.beta2 = 0.999;
  opt.eps = 1e-8;
  opt.weight_decay = 0.1;
  opt.decay_vectors = false;
  opt.clip_norm = clip_norm;
  append_optimizer(g, grads, opt);
  for (const WeightGrad& wg : grads) g.mark_output(wg.grad);
  Model m = model_from_graph(g);
  m.init = model->init;  // pos.ids: each token's position
  Session s(std::make_shared<Model>(std::move(m)), cpu_config(threads));
  load_weights(s, g, j);
  const std::vector<int32_t> tokens = j.get<int32_t>("tokens"), targets = j.get<int32_t>("targets");
  s.set_input("batch.tokens", tokens.data(), tokens.size() * 4);
  s.set_input("batch.targets", targets.data(), targets.size() * 4);

  std::vector<TensorId> wanted{loss, logits};
  for (const WeightGrad& wg : grads) wanted.push_back(wg.grad);
  const int fwd = s.compile(wanted, false, false);
  s.run_compiled(fwd);
  expect_close("loss", static_cast<const float*>(s.staged(loss)), j.get<float>("loss"));
  expect_close("logits", static_cast<const float*>(s.staged(logits)), j.get<float>("logits"));
  // Every trainable weight has a gradient, and the file has every one.
  int compared = 0;
  for (const WeightGrad& wg : grads) {
    const std::string name = g.tensor(wg.weight).name;
    ASSERT_EQ(g.tensor(wg.grad).sparse_rows, kNoTensor) << name << ": a dense gradient expected";
    expect_close("grad " + name, static_cast<const float*>(s.staged(wg.grad)),
                 j.get<float>("g." + name));
    ++compared;
  }
  EXPECT_EQ(compared, trainable);

  // 10 AdamW steps on the batch: the loss before each update.
  const int step = s.compile({loss}, true, true);
  const std::vector<float> want = j.get<float>(losses);
  std::vector<float> got;
  for (size_t i = 0; i < want.size(); ++i) {
    s.run_compiled(step);
    got.push_back(*static_cast<const float*>(s.staged(loss)));
  }
  expect_close("adamw losses", got.data(), want);
  // A frozen weight is the file's, bit for bit, after the steps.
  for (const TensorDesc& d : g.tensors()) {
    if (d.role != Role::weight || d.trainable || d.name == "pos.ids") continue;
    const std::vector<float> w = j.get<float>("w." + d.name);
    const std::vector<std::byte> now = s.read_tensor(d.name);
    EXPECT_EQ(std::memcmp(now.data(), w.data(), now.size()), 0) << d.name << " changed";
  }
  std::printf("largest error relative to the tensor's scale: %.3g\n", worst_seen());
}

class GptGolden : public testing::TestWithParam<int> {};

TEST_P(GptGolden, LogitsLossGradientsAndAdamWMatchTransformers) {
  // wte, wpe, ln_f (2) and 12 tensors per block.
  expect_training_matches(golden(), tiny_spec(2), GetParam(), 4 + 2 * 12);
}

// Gradient clipping by global norm 0.5 before each AdamW step, as
// torch.nn.utils.clip_grad_norm_ (every one of the 10 steps clips).
TEST_P(GptGolden, ClippedAdamWMatchesTransformers) {
  expect_training_matches(golden(), tiny_spec(2), GetParam(), 4 + 2 * 12, 0.5, "adamw_clip.losses");
}

// LoRA, rank 4 and alpha 8 on the four linears of each block: the base
// weights frozen, the adapters' gradients and AdamW steps as peft computes
// them (make_gpt_lora_golden.py writes the computation out).
ModelSpec lora_spec(int64_t batch) {
  ModelSpec s = tiny_spec(batch);
  s.gpt.lora.rank = 4;
  s.gpt.lora.alpha = 8;
  s.gpt.lora.attn = s.gpt.lora.mlp = true;
  return s;
}

TEST_P(GptGolden, LoraAdaptersMatchTransformers) {
  const auto model = build_gpt_model(lora_spec(2));
  int adapters = 0;
  for (const TensorDesc& d : model->graph.tensors()) {
    if (d.role != Role::weight) continue;
    EXPECT_EQ(d.trainable, is_lora_weight(d.name)) << d.name << ": only adapters train";
    adapters += is_lora_weight(d.name) ? 1 : 0;
  }
  EXPECT_EQ(adapters, 2 * 4 * 2) << "A and B on four linears in each of two blocks";
  expect_training_matches(lora_golden(), lora_spec(2), GetParam(), adapters);
}

INSTANTIATE_TEST_SUITE_P(Threads, GptGolden, testing::Values(1, 2),
                         [](const testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_threads";
                         });

// Greedy decoding through the full forward pass (every step re-reads the
// whole prefix): the tokens model.generate(do_sample=False) gave.
TEST(GptGolden, GreedyDecodingMatchesGenerate) {
  const Tensors& j = golden();
  auto model = build_gpt_model(tiny_spec(1), {.logits = true});
  Session s(std::shared_ptr<Model>(std::move(model)), cpu_config(1));
  load_weights(s, s.graph());
  std::vector<int32_t> seq = j.get<int32_t>("prompt");
  const std::vector<int32_t> want = j.get<int32_t>("generated");
  const int64_t V = 97, T = 16;
  std::vector<float> logits(static_cast<size_t>(T * V));
  std::vector<int32_t> got;
  for (size_t k = 0; k < want.size(); ++k) {
    std::vector<int32_t> tokens(T, 0), targets(T, -1);
    std::copy(seq.begin(), seq.end(), tokens.begin());
    s.set_input("batch.tokens", tokens.data(), tokens.size() * 4);
    s.set_input("batch.targets", targets.data(), targets.size() * 4);
    s.run(ProgramKind::forward);
    s.get_output("logits", logits.data(), logits.size() * 4);
    const float* row = logits.data() + (seq.size() - 1) * V;
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + V) - row);
    got.push_back(next);
    seq.push_back(next);
  }
  EXPECT_EQ(got, want);
}

}  // namespace

namespace {

// The decoder with the golden weights: every weight but the KV caches.
void load_decoder(Generator& gen) {
  const Graph& g = gen.session().graph();
  for (const TensorDesc& d : g.tensors()) {
    if (d.role != Role::weight || d.name.find(kKvCacheSuffix) != std::string::npos) continue;
    const std::vector<float> w = golden().get<float>("w." + d.name);
    ASSERT_EQ(static_cast<int64_t>(w.size()), d.numel()) << d.name;
    gen.session().write_tensor(d.name, w.data(), w.size() * 4);
  }
}

// Incremental decoding over the KV cache, one token at a time, gives the
// logits of the full forward pass at every position.
TEST(GptGolden, KvCacheDecodingGivesTheLogits) {
  const Tensors& j = golden();
  Generator gen(tiny_spec(1), cpu_config(1));
  load_decoder(gen);
  const std::vector<int32_t> tokens = j.get<int32_t>("tokens");
  const std::vector<float> logits = j.get<float>("logits");
  const int64_t V = 97, T = 16;
  for (int row = 0; row < 2; ++row)  // the second row overwrites the first's cache
    for (int64_t t = 0; t < T; ++t) {
      const int32_t tok = tokens[static_cast<size_t>(row * T + t)], pos = static_cast<int32_t>(t);
      gen.session().set_input("decode.tokens", &tok, 4);
      gen.session().set_input("decode.pos", &pos, 4);
      gen.session().run(ProgramKind::forward);
      const auto* got = static_cast<const float*>(gen.session().output_buffer("logits"));
      const auto at = logits.begin() + (row * T + t) * V;
      expect_close("decoder logits row " + std::to_string(row) + " position " + std::to_string(t),
                   got, std::vector<float>(at, at + V));
    }
}

// Greedy generation through the KV cache: model.generate's tokens.
TEST(GptGolden, GreedyGenerationMatchesGenerate) {
  const Tensors& j = golden();
  Generator gen(tiny_spec(1), cpu_config(2));
  load_decoder(gen);
  SamplingConfig c;
  c.temperature = 0;
  const std::vector<int32_t> want = j.get<int32_t>("generated");
  c.max_tokens = static_cast<int64_t>(want.size());
  std::vector<int32_t> streamed;
  StopReason why{};
  const std::vector<int32_t> got = gen.generate(
      j.get<int32_t>("prompt"), c,
      [&](int32_t tok, int64_t i) {
        EXPECT_EQ(i, static_cast<int64_t>(streamed.size()));
        streamed.push_back(tok);
        return true;
      },
      &why);
  EXPECT_EQ(got, want);
  EXPECT_EQ(streamed, want);
  EXPECT_EQ(why, StopReason::max_tokens);
}

}  // namespace

namespace {

std::vector<float> forward_logits(Session& s, const Tensors& j) {
  const std::vector<int32_t> tokens = j.get<int32_t>("tokens"), targets = j.get<int32_t>("targets");
  s.set_input("batch.tokens", tokens.data(), tokens.size() * 4);
  s.set_input("batch.targets", targets.data(), targets.size() * 4);
  s.run(ProgramKind::forward);
  std::vector<float> logits(j.get<float>("logits").size());
  s.get_output("logits", logits.data(), logits.size() * 4);
  return logits;
}

// merge_lora folds the adapters into the weights: the merged file is a
// plain gpt model (no adapter tensors, no lora in its spec) whose logits
// are the adapted model's, and the golden ones.
TEST(GptLoraMerge, TheMergedModelComputesTheAdaptedModelsLogits) {
  const Tensors& j = lora_golden();
  Session adapted(std::shared_ptr<Model>(build_gpt_model(lora_spec(2), {.logits = true})),
                  cpu_config(1));
  load_weights(adapted, adapted.graph(), j);
  const std::vector<float> want = forward_logits(adapted, j);
  expect_close("adapted logits", want.data(), j.get<float>("logits"));

  const std::string dir = testing::TempDir();
  const std::string with = dir + "/lora_adapted.pooch", merged = dir + "/lora_merged.pooch";
  save_session(adapted, with, false);
  const LoraMergeReport rep = merge_lora(with, merged);
  EXPECT_EQ(rep.linears, 8);
  EXPECT_EQ(rep.rank, 4);
  EXPECT_DOUBLE_EQ(rep.scale, 2.0);

  const LoadedFile f = load_model_file(merged);
  ASSERT_TRUE(f.has_spec);
  EXPECT_EQ(f.spec.gpt.lora.rank, 0);
  for (const TensorEntry& e : f.file.tensors())
    EXPECT_FALSE(is_lora_weight(e.name)) << e.name << " left in the merged file";
  Session plain(std::shared_ptr<Model>(build_gpt_model(f.spec, {.logits = true})), cpu_config(1));
  restore_tensors(plain, f.file, false);
  const std::vector<float> got = forward_logits(plain, j);
  expect_close("merged logits", got.data(), want);

  // Merging a plain model is an error that names the file; nothing is written.
  const std::string again = dir + "/lora_merged_twice.pooch";
  try {
    merge_lora(merged, again);
    ADD_FAILURE() << "a model without adapters was merged";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find(merged), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::ifstream(again).good());
  std::remove(with.c_str());
  std::remove(merged.c_str());
}

}  // namespace
