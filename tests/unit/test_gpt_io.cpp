// Import of HF and llm.c GPT-2 checkpoints into .pooch model files and
// export back to the HF layout. The builder here emits the weights of the
// agreed gpt names alone (the family's builder plugs in the same way).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "formats/pooch_file.h"
#include "runtime/core/error.h"
#include "runtime/train/gpt_io.h"
#include "runtime/train/model_io.h"

using namespace pooch;
namespace gc = pooch::gpt_ckpt;
namespace fs = std::filesystem;

std::string fmt_spec(const pooch::gpt_ckpt::GptConfig& c);

namespace {

const std::string kDir = POOCH_GOLDEN_DIR;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / ("pooch_gptio_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A model holding the weights of `c` (and `extra`, less `skip`); `n_head`
// false leaves the head count out of its spec.
GptBuilder weights_only(std::string skip = {}, std::string extra = {}, bool n_head = true) {
  return [=](const gc::GptConfig& c) {
    auto m = std::make_unique<Model>();
    for (const auto& [name, shape] : gc::weight_shapes(c))
      if (name != skip) m->graph.add_tensor({name, DType::f32, shape, Role::weight, true});
    if (!extra.empty()) m->graph.add_tensor({extra, DType::f32, {2}, Role::weight, true});
    m->family = "gpt";
    m->spec_json = n_head ? fmt_spec(c) : std::string("{\"family\":\"gpt\"}");
    return m;
  };
}

void expect_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace

std::string fmt_spec(const gc::GptConfig& c) {
  return "{\"family\":\"gpt\",\"n_layer\":" + std::to_string(c.n_layer) +
         ",\"n_head\":" + std::to_string(c.n_head) + ",\"n_embd\":" + std::to_string(c.n_embd) +
         ",\"n_ctx\":" + std::to_string(c.n_ctx) +
         ",\"vocab_size\":" + std::to_string(c.vocab_size) + "}";
}

TEST(GptIo, ImportsHfAndLlmcIntoTheSameModelFile) {
  std::map<std::string, std::vector<float>> want;
  gc::read_hf(kDir + "/hf_tiny", [&](gc::Weight&& w) { want[w.name] = w.data; });
  for (const std::string& src : {kDir + "/hf_tiny", kDir + "/llmc_tiny_f32.bin"}) {
    SCOPED_TRACE(src);
    const std::string out = temp("m.pooch");
    const gc::GptConfig c = import_gpt(src, out, weights_only());
    EXPECT_EQ(c.n_layer, 2);
    // (load_model_file would also rebuild the spec: the gpt family's builder does that.)
    const PoochFile f = read_pooch_file(out);
    EXPECT_EQ(f.metadata().get_string(meta_keys::kModelFamily), "gpt");
    EXPECT_EQ(f.metadata().get_string(meta_keys::kKind), "model");
    ASSERT_EQ(f.tensors().size(), want.size());
    for (const auto& [name, v] : want) {
      const TensorEntry* e = f.find(name);
      ASSERT_TRUE(e) << name;
      const auto bytes = f.data(*e);
      ASSERT_EQ(bytes.size(), v.size() * 4);
      EXPECT_EQ(std::memcmp(bytes.data(), v.data(), bytes.size()), 0) << name;
    }
    fs::remove(out);
  }
}

TEST(GptIo, ExportsTheGoldenThatFromPretrainedLoads) {
  const std::string model = temp("e.pooch"), dir = temp("export");
  import_gpt(kDir + "/hf_tiny", model, weights_only());
  const gc::GptConfig c = export_gpt(model, dir);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_ctx, 16);
  EXPECT_EQ(c.vocab_size, 50);
  for (const char* f : {"config.json", "model.safetensors"})
    EXPECT_EQ(slurp(dir + "/" + f), slurp(kDir + "/pooch_export/" + f)) << f;
  fs::remove(model);
  fs::remove_all(dir);
}

TEST(GptIo, RefusesMismatchedModels) {
  const std::string out = temp("bad.pooch");
  expect_error([&] { import_gpt(kDir + "/hf_tiny", out, weights_only("ln_f.bias")); },
               "'ln_f.bias' has no place in the model");
  expect_error([&] { import_gpt(kDir + "/hf_tiny", out, weights_only({}, "lora.a")); },
               "has no weight for the model's 'lora.a'");
  EXPECT_FALSE(fs::exists(out));
  import_gpt(kDir + "/hf_tiny", out, weights_only({}, {}, false));
  expect_error([&] { export_gpt(out, temp("x")); }, "has no 'n_head'");
  fs::remove(out);
}
