// The gpt family: the builder's weights (names, shapes, GPT-2's
// initialisation), and a tiny model trained through the generic Session.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "runtime/models/build.h"
#include "runtime/models/gpt.h"
#include "runtime/session/session.h"
#include "tiny_gpt.h"

namespace pooch {
namespace {

TEST(Gpt, WeightsFollowHuggingFaceNames) {
  auto m = build_model(tiny_gpt_spec(2, 8));
  EXPECT_EQ(m->family, "gpt");
  std::map<std::string, Shape> w;
  for (const TensorDesc& d : m->graph.tensors())
    if (d.role == Role::weight && d.trainable) w[d.name] = d.shape;
  EXPECT_EQ(w.size(), 4u + 2 * 12);
  EXPECT_EQ(w.at("wte.weight"), (Shape{23, 16}));
  EXPECT_EQ(w.at("wpe.weight"), (Shape{12, 16}));
  EXPECT_EQ(w.at("h.1.attn.c_attn.weight"), (Shape{48, 16}));
  EXPECT_EQ(w.at("h.1.attn.c_attn.bias"), (Shape{48}));
  EXPECT_EQ(w.at("h.0.attn.c_proj.weight"), (Shape{16, 16}));
  EXPECT_EQ(w.at("h.0.mlp.c_fc.weight"), (Shape{64, 16}));
  EXPECT_EQ(w.at("h.0.mlp.c_proj.weight"), (Shape{16, 64}));
  EXPECT_EQ(w.at("h.1.ln_2.bias"), (Shape{16}));
  EXPECT_EQ(w.at("ln_f.weight"), (Shape{16}));
  EXPECT_FALSE(w.count("lm_head.weight")) << "the output projection is tied to wte";
  ASSERT_NE(m->find_input("batch.tokens"), nullptr);
  ASSERT_NE(m->find_input("batch.targets"), nullptr);
  EXPECT_EQ(m->find_input("batch.targets")->pad, -1.0);
}

// Normal(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer).
TEST(Gpt, InitialisedAsGpt2) {
  GptSpec g;
  g.n_layer = 8;
  g.n_head = 4;
  g.n_embd = 128;
  g.n_ctx = 64;
  g.vocab_size = 500;
  auto m = build_gpt_model(gpt_spec(g, 1, 8));
  auto stddev = [&](const std::string& name) {
    const TensorDesc& d = m->graph.tensor(*m->graph.find(name));
    const std::vector<std::byte> b = initial_value(d, m->init.at(name), m->seed);
    const auto* f = reinterpret_cast<const float*>(b.data());
    const size_t n = static_cast<size_t>(d.numel());
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; ++i) {
      s += f[i];
      s2 += double(f[i]) * f[i];
    }
    EXPECT_NEAR(s / n, 0.0, 0.003) << name;
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  EXPECT_NEAR(stddev("wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.3.mlp.c_fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.3.mlp.c_proj.weight"), 0.02 / 4.0, 0.0003);
  EXPECT_NEAR(stddev("h.0.attn.c_proj.weight"), 0.02 / 4.0, 0.0003);
}

// A repeating sequence is learnable: 40 AdamW steps take the loss from
// about log(V) to well below it.
TEST(Gpt, TinyModelTrainsThroughTheSession) {
  for (const double dropout : {0.0, 0.1}) {
    const int64_t B = 4, T = 10, V = 23;
    SessionConfig cfg;
    cfg.device = DeviceKind::cpu;
    cfg.threads = 2;
    cfg.optimizer.kind = OptimizerConfig::Kind::adamw;
    cfg.optimizer.lr = 1e-2;
    cfg.optimizer.weight_decay = 0.1;
    cfg.optimizer.decay_vectors = false;
    Session s(std::shared_ptr<Model>(build_gpt_model(tiny_gpt_spec(B, T, dropout))), cfg);
    // Biases and norms get no decay; matrices do.
    for (const Node& n : s.graph().nodes()) {
      if (n.op != "adam_update" && n.op != "adam_update_rows") continue;
      const TensorDesc& w = s.graph().tensor(n.inputs[0]);
      EXPECT_EQ(n.attrs.get("weight_decay", -1), w.shape.size() >= 2 ? 0.1 : 0.0) << w.name;
    }
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        tokens[b * T + t] = static_cast<int32_t>((3 * b + 5 * t) % V);
        targets[b * T + t] = static_cast<int32_t>((3 * b + 5 * (t + 1)) % V);
      }
    s.set_input("batch.tokens", tokens.data(), tokens.size() * 4);
    s.set_input("batch.targets", targets.data(), targets.size() * 4);
    float first = 0, last = 0;
    for (int i = 0; i < 40; ++i) {
      s.run(ProgramKind::train_step);
      s.get_output("loss", &last, 4);
      if (i == 0) first = last;
    }
    EXPECT_NEAR(first, std::log(double(V)), 0.3) << "dropout " << dropout;
    EXPECT_LT(last, 0.5 * first) << "dropout " << dropout;
  }
}

}  // namespace
}  // namespace pooch
