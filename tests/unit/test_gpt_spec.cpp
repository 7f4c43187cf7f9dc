// The gpt family's spec: sizes by name, JSON in and out, validation.
#include <gtest/gtest.h>

#include "runtime/core/error.h"
#include "runtime/models/model_spec.h"

namespace pooch {
namespace {

TEST(GptSpec, SizesByName) {
  const GptSpec s = gpt_size("gpt2");
  EXPECT_EQ(s.n_layer, 12);
  EXPECT_EQ(s.n_head, 12);
  EXPECT_EQ(s.n_embd, 768);
  EXPECT_EQ(s.n_ctx, 1024);
  EXPECT_EQ(s.vocab_size, 50257);
  EXPECT_EQ(gpt_size("GPT2-Medium").n_embd, 1024);
  EXPECT_EQ(gpt_size("gpt2-large").n_layer, 36);
  EXPECT_EQ(gpt_size("gpt2-xl").n_head, 25);
  EXPECT_EQ(gpt_size("gpt2-xl").n_embd, 1600);
  try {
    gpt_size("gpt3");
    FAIL() << "gpt3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2-medium"), std::string::npos) << e.what();
  }
}

TEST(GptSpec, JsonRoundTrip) {
  const ModelSpec s = spec_from_json(
      R"({"family": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 16,
          "vocab_size": 97, "dropout": 0.1, "batch": 3, "seq": 8, "seed": 7})",
      "spec.json");
  EXPECT_EQ(s.family, Family::gpt);
  EXPECT_EQ(s.gpt.n_layer, 2);
  EXPECT_EQ(s.gpt.n_embd, 32);
  EXPECT_EQ(s.gpt.vocab_size, 97);
  EXPECT_DOUBLE_EQ(s.gpt.dropout, 0.1);
  EXPECT_EQ(s.run.batch, 3);
  EXPECT_EQ(s.run.seq, 8);
  EXPECT_EQ(s.seed, 7u);
  const ModelSpec r = spec_from_json(spec_to_json(s), "again");
  EXPECT_EQ(spec_to_json(r), spec_to_json(s));
  // A size gives defaults; explicit fields override them.
  const ModelSpec z = spec_from_json(R"({"family": "gpt", "size": "gpt2", "n_ctx": 256})", "z");
  EXPECT_EQ(z.gpt.n_layer, 12);
  EXPECT_EQ(z.gpt.n_ctx, 256);
}

void expect_refused(const char* json, const char* words) {
  try {
    spec_from_json(json, "bad.json");
    FAIL() << "accepted: " << json;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.json"), std::string::npos) << m;
    EXPECT_NE(m.find(words), std::string::npos) << m;
  }
}

TEST(GptSpec, BadSpecsNameTheField) {
  expect_refused(R"({"family": "gpt", "n_embd": 30, "n_head": 4})", "n_head");
  expect_refused(R"({"family": "gpt", "n_ctx": 16, "seq": 17})", "seq");
  expect_refused(R"({"family": "gpt", "dropout": 1.0})", "dropout");
  expect_refused(R"({"family": "gpt", "vocab_size": 0})", "vocab_size");
  expect_refused(R"({"family": "gpt", "layers": []})", "unknown field \"layers\"");
  expect_refused(R"({"family": "gpt", "size": "huge"})", "unknown gpt size");
  expect_refused(R"({"family": "gpt", "n_layer": 1.5})", "n_layer must be an integer");
  // fuzz_model_spec: 100 000 layers of width 1 took 2 GiB and 40 s to build.
  expect_refused(R"({"family": "gpt", "n_layer": 100000, "n_head": 1, "n_embd": 1})",
                 "n_layer is 100000; it must be from 1 to 1024");
}

TEST(GptSpec, LoraRoundTripsAndDefaults) {
  const ModelSpec s = spec_from_json(
      R"({"family": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_ctx": 16,
          "lora": {"rank": 4, "alpha": 8, "targets": ["MLP", "attn"]}})",
      "lora.json");
  EXPECT_EQ(s.gpt.lora.rank, 4);
  EXPECT_DOUBLE_EQ(s.gpt.lora.scale(), 2.0);
  EXPECT_TRUE(s.gpt.lora.attn);
  EXPECT_TRUE(s.gpt.lora.mlp);
  EXPECT_EQ(spec_to_json(spec_from_json(spec_to_json(s), "again")), spec_to_json(s));
  // Without alpha the scale is 1; without targets, the attention's linears.
  const ModelSpec d = spec_from_json(R"({"family": "gpt", "n_embd": 32, "n_head": 2,
                                         "lora": {"rank": 8}})",
                                     "d");
  EXPECT_DOUBLE_EQ(d.gpt.lora.scale(), 1.0);
  EXPECT_TRUE(d.gpt.lora.attn);
  EXPECT_FALSE(d.gpt.lora.mlp);
  // No lora: the spec's JSON has none, as before adapters existed.
  EXPECT_EQ(spec_to_json(spec_from_json(R"({"family": "gpt"})", "p")).find("lora"),
            std::string::npos);
}

TEST(GptSpec, BadLoraFieldsAreNamed) {
  expect_refused(R"({"family": "gpt", "n_embd": 32, "n_head": 2, "lora": {"rank": 33}})",
                 "lora.rank is 33");
  expect_refused(R"({"family": "gpt", "lora": {"rank": -1}})", "lora.rank");
  expect_refused(R"({"family": "gpt", "lora": {"rank": 4, "alpha": -2}})", "lora.alpha");
  expect_refused(R"({"family": "gpt", "lora": {"rank": 4, "targets": ["ffn"]}})", "'ffn'");
  expect_refused(R"({"family": "gpt", "lora": {"rank": 4, "targets": []}})", "lora.targets");
  expect_refused(R"({"family": "gpt", "lora": {"rank": 4, "dropout": 0.1}})", "lora.dropout");
  expect_refused(R"({"family": "gpt", "lora": 4})", "lora must be an object");
}

}  // namespace
}  // namespace pooch
