// Generation: sampling (greedy, temperature, top-k, top-p, seeds), the
// per-token callback, the context limit, and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/core/error.h"
#include "runtime/models/gpt.h"
#include "runtime/train/generate.h"

namespace pooch {
namespace {

std::vector<std::pair<float, int32_t>> scratch;

int32_t draw(const std::vector<float>& logits, const SamplingConfig& c, uint64_t index) {
  return sample_token(logits.data(), static_cast<int64_t>(logits.size()), c, index, scratch);
}

TEST(Sampling, GreedyTakesTheFirstLargest) {
  SamplingConfig c;
  c.temperature = 0;
  EXPECT_EQ(draw({0.f, 3.f, 1.f, 3.f}, c, 0), 1);
  c.temperature = 1;
  c.top_k = 1;
  EXPECT_EQ(draw({0.f, 3.f, 1.f, 3.f}, c, 5), 1);
}

// Frequencies over many draws follow softmax(logits / T), restricted and
// renormalised by top-k and top-p.
TEST(Sampling, FrequenciesFollowTheDistribution) {
  const std::vector<float> logits{2.0f, 1.0f, 0.0f, -1.0f, 0.5f};
  auto freqs = [&](const SamplingConfig& c) {
    std::vector<double> f(logits.size(), 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i)
      f[static_cast<size_t>(draw(logits, c, static_cast<uint64_t>(i)))] += 1.0 / n;
    return f;
  };
  auto softmax = [&](double T, const std::vector<int>& keep) {
    std::vector<double> p(logits.size(), 0);
    double z = 0;
    for (int k : keep) z += std::exp(logits[static_cast<size_t>(k)] / T);
    for (int k : keep) p[static_cast<size_t>(k)] = std::exp(logits[static_cast<size_t>(k)] / T) / z;
    return p;
  };
  SamplingConfig c;
  c.temperature = 0.7;
  std::vector<double> f = freqs(c), p = softmax(0.7, {0, 1, 2, 3, 4});
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(f[i], p[i], 0.01) << "T=0.7, id " << i;
  c.temperature = 1;
  c.top_k = 2;
  f = freqs(c);
  p = softmax(1, {0, 1});
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(f[i], p[i], 0.01) << "top_k=2, id " << i;
  // softmax(T=1): 0.52, 0.19, 0.07, 0.03, 0.12 -> top_p 0.7 keeps ids 0 and 1 (0.71).
  c.top_k = 0;
  c.top_p = 0.7;
  f = freqs(c);
  p = softmax(1, {0, 1});
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(f[i], p[i], 0.01) << "top_p=0.7, id " << i;
}

TEST(Sampling, DeterministicPerSeed) {
  const std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.0f, 0.25f, 0.15f};
  SamplingConfig a, b;
  a.seed = 11;
  b.seed = 12;
  std::vector<int32_t> x, y, z;
  for (uint64_t i = 0; i < 64; ++i) {
    x.push_back(draw(logits, a, i));
    y.push_back(draw(logits, a, i));
    z.push_back(draw(logits, b, i));
  }
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
}

TEST(Sampling, BadSettingsNameTheField) {
  auto refused = [](SamplingConfig c, const char* field) {
    try {
      validate_sampling(c);
      ADD_FAILURE() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SamplingConfig c;
  c.temperature = -1;
  refused(c, "temperature");
  c = {};
  c.top_p = 0;
  refused(c, "top_p");
  c = {};
  c.top_k = -2;
  refused(c, "top_k");
  c = {};
  c.max_tokens = -1;
  refused(c, "max_tokens");
}

ModelSpec tiny() {
  GptSpec g;
  g.n_layer = 1;
  g.n_head = 2;
  g.n_embd = 8;
  g.n_ctx = 6;
  g.vocab_size = 11;
  return gpt_spec(g, 1, 6, 5);
}

SessionConfig cpu() {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 1;
  return cfg;
}

TEST(Generator, StopsAtTheCallbackAndTheContext) {
  Generator gen(tiny(), cpu());
  SamplingConfig c;
  c.max_tokens = 100;
  c.seed = 3;
  StopReason why{};
  // Prompt 2 + 4 new fills the 6 positions: the 5th new token has no place.
  const std::vector<int32_t> all = gen.generate(std::vector<int32_t>{1, 2}, c, {}, &why);
  EXPECT_EQ(why, StopReason::context_full);
  EXPECT_EQ(all.size(), 5u) << "4 fed back through the cache, and the last one sampled";
  int calls = 0;
  const std::vector<int32_t> two = gen.generate(
      std::vector<int32_t>{1, 2}, c, [&](int32_t, int64_t) { return ++calls < 2; }, &why);
  EXPECT_EQ(why, StopReason::callback);
  EXPECT_EQ(two, std::vector<int32_t>(all.begin(), all.begin() + 2))
      << "the same seed gives the same tokens, whatever the cache held before";
  // Bad prompts.
  EXPECT_THROW(gen.generate(std::vector<int32_t>{}, c, {}), Error);
  EXPECT_THROW(gen.generate(std::vector<int32_t>{11}, c, {}), Error);
  EXPECT_THROW(gen.generate(std::vector<int32_t>(7, 1), c, {}), Error);
}

// A decoder set up without initialisers (cfg.initialise false, as
// pooch_generate's) starts from zeros, and once copy_weights has run it
// generates exactly what an initialised one given the same weights does.
TEST(Generator, SkipsItsInitialisersWhenTheWeightsAreCopiedIn) {
  SessionConfig bare = cpu();
  bare.initialise = false;
  Generator zero(tiny(), bare), drawn(tiny(), cpu());
  bool any_nonzero = false;
  for (const TensorDesc& d : zero.session().graph().tensors()) {
    if (d.role != Role::weight) continue;
    for (std::byte b : zero.session().read_tensor(d.name)) EXPECT_EQ(b, std::byte{0}) << d.name;
    for (std::byte b : drawn.session().read_tensor(d.name)) any_nonzero |= b != std::byte{0};
  }
  EXPECT_TRUE(any_nonzero) << "the initialised decoder draws its weights";
  // A training session of the same model, its own draw (another seed).
  ModelSpec other = tiny();
  other.seed = 99;
  const Session source(std::shared_ptr<Model>(build_gpt_model(other)), cpu());
  zero.copy_weights(source);
  drawn.copy_weights(source);
  SamplingConfig c;
  c.max_tokens = 4;
  c.seed = 5;
  EXPECT_EQ(zero.generate(std::vector<int32_t>{1, 2}, c, {}),
            drawn.generate(std::vector<int32_t>{1, 2}, c, {}));
}

}  // namespace
}  // namespace pooch

#include "runtime/train/lr_schedule.h"

namespace pooch {
namespace {

TEST(LrSchedule, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(cosine_lr_scale(1, 10, 111, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(5, 10, 111, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(10, 10, 111, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(11, 10, 111, 0.1), 1.0);
  EXPECT_NEAR(cosine_lr_scale(61, 10, 111, 0.1), 0.55, 1e-12);  // half way: the mean
  EXPECT_NEAR(cosine_lr_scale(111, 10, 111, 0.1), 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(500, 10, 111, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(0, 0, 100, 0.0), 1.0);  // step 0 counts as the first
  EXPECT_DOUBLE_EQ(cosine_lr_scale(7, 10, 5, 0.0), 0.7);
  EXPECT_DOUBLE_EQ(cosine_lr_scale(20, 10, 5, 0.0), 1.0);
  double last = 2;
  for (uint64_t s = 11; s <= 111; ++s) {  // decreasing after the warm-up
    const double f = cosine_lr_scale(s, 10, 111, 0.1);
    EXPECT_LT(f, last) << "step " << s;
    last = f;
  }
}

}  // namespace
}  // namespace pooch
