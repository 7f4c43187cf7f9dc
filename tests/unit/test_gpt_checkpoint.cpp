// GPT-2 checkpoints: a Hugging Face save_pretrained directory and llm.c's
// float32 and bfloat16 files of the same weights read into pooch's names and
// layouts (Conv1D weights transposed), written back in the HF layout
// byte-identical to the committed export that from_pretrained was shown to
// load (tests/golden/make_gpt_golden.py --check), and broken files refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "formats/gpt_checkpoint.h"
#include "formats/safetensors.h"
#include "runtime/core/error.h"

using namespace pooch;
namespace gc = pooch::gpt_ckpt;
namespace fs = std::filesystem;

namespace {

const std::string kDir = POOCH_GOLDEN_DIR;

using Weights = std::map<std::string, gc::Weight>;

Weights collect_hf(const std::string& dir, gc::GptConfig* cfg = nullptr) {
  Weights w;
  const gc::GptConfig c = gc::read_hf(dir, [&](gc::Weight&& x) { w[x.name] = std::move(x); });
  if (cfg) *cfg = c;
  return w;
}

Weights collect_llmc(const std::string& path) {
  Weights w;
  gc::read_llmc(path, [&](gc::Weight&& x) { w[x.name] = std::move(x); });
  return w;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void spit(const std::string& path, const std::string& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

std::string temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("pooch_gpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& want) {
  try {
    f();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    for (const std::string& s : want)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << " lacks " << s;
  }
}

}  // namespace

TEST(GptCheckpoint, ReadsHuggingFaceWithConv1DTransposed) {
  gc::GptConfig c;
  const Weights w = collect_hf(kDir + "/hf_tiny", &c);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_embd, 8);
  EXPECT_EQ(c.n_ctx, 16);
  EXPECT_EQ(c.vocab_size, 50);
  ASSERT_EQ(w.size(), gc::weight_shapes(c).size());
  for (const auto& [name, shape] : gc::weight_shapes(c)) EXPECT_EQ(w.at(name).shape, shape) << name;
  // Against the raw file: pooch [out, in] is HF's [in, out] transposed.
  const safetensors::Reader r(kDir + "/hf_tiny/model.safetensors");
  const std::vector<float> raw = r.read_f32(r.at("transformer.h.1.attn.c_attn.weight"));  // [8, 24]
  const gc::Weight& p = w.at("h.1.attn.c_attn.weight");                                   // [24, 8]
  ASSERT_EQ(p.shape, (std::vector<int64_t>{24, 8}));
  for (int o = 0; o < 24; ++o)
    for (int i = 0; i < 8; ++i) EXPECT_EQ(p.data[o * 8 + i], raw[i * 24 + o]);
  EXPECT_EQ(w.at("wte.weight").data, r.read_f32(r.at("transformer.wte.weight")));
  EXPECT_EQ(w.at("h.0.ln_2.bias").data, r.read_f32(r.at("transformer.h.0.ln_2.bias")));
}

TEST(GptCheckpoint, LlmcFilesHoldTheSameWeights) {
  const Weights hf = collect_hf(kDir + "/hf_tiny");
  const Weights f32 = collect_llmc(kDir + "/llmc_tiny_f32.bin");
  ASSERT_EQ(f32.size(), hf.size());
  for (const auto& [name, x] : hf) {
    EXPECT_EQ(f32.at(name).shape, x.shape) << name;
    EXPECT_EQ(f32.at(name).data, x.data) << name;  // exact: both float32
  }
  const Weights bf = collect_llmc(kDir + "/llmc_tiny_bf16.bin");
  for (const auto& [name, x] : hf)
    for (size_t i = 0; i < x.data.size(); ++i)
      EXPECT_NEAR(bf.at(name).data[i], x.data[i], std::fabs(x.data[i]) / 128 + 1e-30) << name;
}

TEST(GptCheckpoint, ExportsWhatFromPretrainedLoads) {
  gc::GptConfig c;
  const Weights w = collect_hf(kDir + "/hf_tiny", &c);
  const std::string out = temp_dir("export");
  gc::write_hf(out, c, [&](const std::string& n) { return w.at(n).data; });
  const Weights back = collect_hf(out);
  for (const auto& [name, x] : w) EXPECT_EQ(back.at(name).data, x.data) << name;
  // The committed export was loaded by GPT2LMHeadModel.from_pretrained with
  // equal weights and logits (make_gpt_golden.py --check); the writer must
  // keep producing those bytes.
  const std::string golden = kDir + "/pooch_export";
  if (std::getenv("POOCH_WRITE_GOLDEN")) {
    fs::create_directories(golden);
    for (const char* f : {"config.json", "model.safetensors"})
      spit(golden + "/" + f, slurp(out + "/" + f));
  }
  for (const char* f : {"config.json", "model.safetensors"})
    EXPECT_EQ(slurp(out + "/" + f), slurp(golden + "/" + f)) << f;
  fs::remove_all(out);
}

TEST(GptCheckpoint, RefusesBrokenConfigs) {
  const std::string ok =
      R"({"model_type":"gpt2","n_layer":2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})";
  EXPECT_EQ(gc::parse_hf_config(ok, "c").n_ctx, 16);
  EXPECT_EQ(
      gc::parse_hf_config(R"({"n_layer":1,"n_head":1,"n_embd":4,"n_ctx":7,"vocab_size":3})", "c")
          .n_ctx,
      7);
  expect_error([] { gc::parse_hf_config("{", "config.json"); }, {"config.json", "does not parse"});
  expect_error(
      [] {
        gc::parse_hf_config(R"({"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})",
                            "config.json");
      },
      {"config.json", "'n_layer' is missing"});
  expect_error(
      [] {
        gc::parse_hf_config(
            R"({"n_layer":-2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})", "c");
      },
      {"'n_layer' is -2"});
  expect_error(
      [] {
        gc::parse_hf_config(
            R"({"n_layer":2,"n_head":3,"n_embd":8,"n_positions":16,"vocab_size":50})", "c");
      },
      {"not a multiple of 'n_head' 3"});
  expect_error([] { gc::parse_hf_config(R"({"model_type":"llama","n_layer":2})", "c"); },
               {"'model_type'"});
  expect_error(
      [&] {
        gc::parse_hf_config(
            R"({"activation_function":"relu","n_layer":2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})",
            "c");
      },
      {"'activation_function'"});
  expect_error(
      [&] {
        gc::parse_hf_config(
            R"({"n_inner":64,"n_layer":2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})",
            "c");
      },
      {"'n_inner' is 64"});
  expect_error(
      [&] {
        gc::parse_hf_config(
            R"({"tie_word_embeddings":false,"n_layer":2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50})",
            "c");
      },
      {"'tie_word_embeddings'"});
}

TEST(GptCheckpoint, RefusesBrokenHfDirectories) {
  gc::GptConfig c;
  const Weights w = collect_hf(kDir + "/hf_tiny", &c);
  const std::string dir = temp_dir("broken");
  const std::string cfg = slurp(kDir + "/hf_tiny/config.json");
  spit(dir + "/config.json", cfg);
  auto write = [&](std::vector<safetensors::TensorOut> t) {
    safetensors::write_file(dir + "/model.safetensors", t, {{"format", "pt"}});
  };
  auto all = [&](const std::string& skip) {
    std::vector<safetensors::TensorOut> t;
    for (const auto& [name, shape] : gc::weight_shapes(c)) {
      if (name == skip) continue;
      std::vector<int64_t> s = shape;
      if (name.find("c_attn.weight") != std::string::npos ||
          name.find("c_proj.weight") != std::string::npos ||
          name.find("c_fc.weight") != std::string::npos)
        std::swap(s[0], s[1]);
      t.push_back({"transformer." + name, safetensors::DType::F32, s, w.at(name).data.data()});
    }
    return t;
  };
  auto read = [&] { collect_hf(dir); };
  write(all("h.1.mlp.c_fc.bias"));
  expect_error(read, {"model.safetensors", "'transformer.h.1.mlp.c_fc.bias' is missing"});
  auto t = all("");
  t[5].shape = {3, 8};  // h.0.attn.c_attn.bias [24] -> [3, 8]
  write(t);
  expect_error(read, {"'transformer.h.0.attn.c_attn.bias' has shape [3,8]", "implies [24]"});
  t = all("");
  const float extra = 1;
  t.push_back({"transformer.h.0.attn.rotary", safetensors::DType::F32, {1}, &extra});
  write(t);
  expect_error(read, {"'transformer.h.0.attn.rotary' is not a GPT-2 weight"});
  // A causal-mask buffer (older transformers) is skipped; an lm_head equal to wte is accepted.
  t = all("");
  t.push_back({"transformer.h.0.attn.bias", safetensors::DType::F32, {1}, &extra});
  t.push_back({"lm_head.weight", safetensors::DType::F32, {50, 8}, w.at("wte.weight").data.data()});
  write(t);
  EXPECT_EQ(collect_hf(dir).size(), w.size());
  t = all("");
  t.push_back({"lm_head.weight", safetensors::DType::F32, {50, 8}, w.at("wpe.weight").data.data()});
  std::vector<float> other(400, 0.5f);
  t.back().data = other.data();
  write(t);
  expect_error(read, {"'lm_head.weight' differs from wte"});
  fs::remove(dir + "/model.safetensors");
  EXPECT_THROW(read(), Error);
  fs::remove_all(dir);
}

TEST(GptCheckpoint, RefusesBrokenLlmcFiles) {
  const std::string good = slurp(kDir + "/llmc_tiny_f32.bin");
  const std::string path = temp_dir("llmc") + "/m.bin";
  auto with = [&](size_t at, int32_t v) {
    std::string b = good;
    std::memcpy(b.data() + at, &v, 4);
    spit(path, b);
  };
  auto read = [&] { collect_llmc(path); };
  with(0, 20240520);
  expect_error(read, {"'magic' (bytes 0-3) is 20240520", "token file"});
  with(4, 4);
  expect_error(read, {"'version' (bytes 4-7) is 4"});
  with(8, 17);  // max_seq_len 17: wpe no longer fits the file
  expect_error(read, {"cut short"});
  with(16, 0);
  expect_error(read, {"'num_layers' (bytes 16-19) is 0"});
  with(28, 49);
  expect_error(read, {"'padded_vocab_size' (bytes 28-31) is 49"});
  with(24, 9);
  expect_error(read, {"not a multiple of 'n_head'"});
  spit(path, good + "x");
  expect_error(read, {"bytes follow the parameters"});
  spit(path, good.substr(0, 100));
  expect_error(read, {"fewer than the 1024-byte header"});
  fs::remove_all(fs::path(path).parent_path());
}

TEST(GptCheckpoint, ReadsHalfPrecisionAndRefusesIntegerTensors) {
  gc::GptConfig c;
  const Weights w = collect_hf(kDir + "/hf_tiny", &c);
  const std::string dir = temp_dir("half");
  fs::copy_file(kDir + "/hf_tiny/config.json", dir + "/config.json");
  // Every weight as bfloat16 (truncated): read back as float32 of those values.
  std::vector<std::vector<uint16_t>> half;
  std::vector<safetensors::TensorOut> t;
  for (const auto& [name, shape] : gc::weight_shapes(c)) {
    std::vector<float> v = w.at(name).data;
    std::vector<int64_t> s = shape;
    if (name.find("c_attn.weight") != std::string::npos ||
        name.find("c_proj.weight") != std::string::npos ||
        name.find("c_fc.weight") != std::string::npos) {
      std::vector<float> tr(v.size());
      for (int64_t r = 0; r < shape[0]; ++r)
        for (int64_t k = 0; k < shape[1]; ++k) tr[k * shape[0] + r] = v[r * shape[1] + k];
      v = tr;
      std::swap(s[0], s[1]);
    }
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      h[i] = static_cast<uint16_t>(u >> 16);
    }
    half.push_back(std::move(h));
    t.push_back({"transformer." + name, safetensors::DType::BF16, s, half.back().data()});
  }
  safetensors::write_file(dir + "/model.safetensors", t, {{"format", "pt"}});
  const Weights back = collect_hf(dir);
  for (const auto& [name, x] : w)
    for (size_t i = 0; i < x.data.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &x.data[i], 4);
      u &= 0xFFFF0000u;
      float want;
      std::memcpy(&want, &u, 4);
      ASSERT_EQ(back.at(name).data[i], want) << name << " " << i;
    }
  // An integer tensor where a weight belongs is refused naming it.
  std::vector<int32_t> ints(8, 1);
  t[t.size() - 1] = {"transformer.ln_f.bias", safetensors::DType::I32, {8}, ints.data()};
  safetensors::write_file(dir + "/model.safetensors", t, {{"format", "pt"}});
  expect_error([&] { collect_hf(dir); }, {"'transformer.ln_f.bias' is I32, not a float tensor"});
  fs::remove_all(dir);
}
