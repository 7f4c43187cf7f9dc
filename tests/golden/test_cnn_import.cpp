// torchvision state dicts into pooch model files, through the C API that
// pooch-run import calls: tests/golden/make_cnn_import_golden.py wrote three
// small torchvision-layout networks (resnet-18, resnet-50 with bottleneck
// blocks, vgg-11 with batch normalisation; channels scaled down) with
// safetensors.torch.save_file, and the logits PyTorch computes from them in
// eval mode. Each is imported with nothing but the file (family, depth,
// widths, classes told from the names and shapes), run forward, and its
// logits compared within 1e-4 relative. Then: files whose names or shapes
// do not fit are refused naming the tensor, and export writes the same
// tensors back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "pooch/pooch.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace st = pooch::safetensors;

const std::string kDir = POOCH_CNN_IMPORT_DIR;

const json& golden() {
  static const json j = [] {
    std::ifstream f(kDir + "/cnn_import.json");
    if (!f) throw std::runtime_error("cannot open " + kDir + "/cnn_import.json");
    return json::parse(f);
  }();
  return j;
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / ("pooch_cnnio_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// The model's logits for the golden batch, in eval mode.
std::vector<float> forward(const std::string& model_path, int64_t rows) {
  pooch_model* m = nullptr;
  EXPECT_EQ(pooch_model_load(model_path.c_str(), &m), POOCH_OK) << pooch_last_error();
  pooch_session_params p;
  pooch_session_default_params(&p);
  p.device = POOCH_DEVICE_CPU;
  p.threads = 2;
  pooch_session* s = nullptr;
  EXPECT_EQ(pooch_session_create(m, &p, &s), POOCH_OK) << pooch_last_error();
  std::vector<float> x;
  for (const json& v : golden()["x"]) x.push_back(v.get<float>());
  EXPECT_EQ(pooch_session_set_input(s, "batch.x", x.data(), x.size() * 4), POOCH_OK)
      << pooch_last_error();
  EXPECT_EQ(pooch_session_run(s, POOCH_PROGRAM_FORWARD), POOCH_OK) << pooch_last_error();
  pooch_tensor_info info;
  for (int i = 0; i < pooch_model_output_count(m); ++i) {
    pooch_model_output_info(m, i, &info);
    if (std::string(info.name) == "prediction") break;
  }
  std::vector<float> all(info.bytes / 4);
  EXPECT_EQ(pooch_session_get_output(s, "prediction", all.data(), info.bytes), POOCH_OK);
  all.resize(static_cast<size_t>(rows) * (info.bytes / 4 / static_cast<size_t>(info.max_rows)));
  pooch_session_free(&s);
  pooch_model_free(&m);
  return all;
}

class Import : public testing::TestWithParam<std::string> {};

TEST_P(Import, LogitsMatchPyTorchInEvalMode) {
  const std::string name = GetParam();
  const json& g = golden()["models"][name];
  const std::string out = temp(name + ".pooch");
  char* spec = nullptr;
  // Only the run shape and a resnet's image size (no shape holds it) are
  // given: everything else comes from the file.
  const std::string given = g["spec"]["family"] == "resnet"
                                ? R"({"batch": 2, "input": {"height": 32, "width": 32}})"
                                : R"({"batch": 2})";
  ASSERT_EQ(pooch_cnn_import((kDir + "/" + name + ".safetensors").c_str(), given.c_str(),
                             out.c_str(), &spec),
            POOCH_OK)
      << pooch_last_error();
  const json got_spec = json::parse(spec);
  pooch_string_free(&spec);
  for (const auto& [k, v] : g["spec"].items())
    EXPECT_EQ(got_spec[k], v) << name << ": spec field " << k << " inferred as " << got_spec[k];

  const std::vector<float> logits = forward(out, golden()["batch"].get<int64_t>());
  ASSERT_EQ(logits.size(), g["logits"].size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double want = g["logits"][i].get<double>();
    diff += (logits[i] - want) * (logits[i] - want);
    norm += want * want;
  }
  const double rel = std::sqrt(diff / norm);
  std::printf("%s: logits relative error %.3g\n", name.c_str(), rel);
  EXPECT_LE(rel, 1e-4) << name;

  // Export writes every tensor back, bit for bit (num_batches_tracked aside).
  const std::string back = temp(name + ".back.safetensors");
  ASSERT_EQ(pooch_cnn_export(out.c_str(), back.c_str()), POOCH_OK) << pooch_last_error();
  const st::Reader orig(kDir + "/" + name + ".safetensors"), exp(back);
  size_t kept = 0;
  for (const st::TensorInfo& t : orig.header().tensors) {
    if (t.name.find("num_batches_tracked") != std::string::npos) continue;
    ++kept;
    const st::TensorInfo* e = exp.find(t.name);
    ASSERT_TRUE(e) << "export lost " << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    EXPECT_EQ(exp.read_f32(*e), orig.read_f32(t)) << t.name;
  }
  EXPECT_EQ(exp.header().tensors.size(), kept);
  fs::remove(out);
  fs::remove(back);
}

INSTANTIATE_TEST_SUITE_P(Torchvision, Import,
                         testing::Values("resnet18_tiny", "resnet50_tiny", "vgg11bn_tiny"));

// resnet18_tiny's tensors, changed by `edit`, written to a new file.
std::string edited(const std::string& tag,
                   const std::function<void(std::vector<st::TensorOut>&)>& edit,
                   std::vector<std::vector<float>>& keep) {
  const st::Reader r(kDir + "/resnet18_tiny.safetensors");
  std::vector<st::TensorOut> ts;
  keep.clear();
  keep.reserve(r.header().tensors.size() + 1);
  for (const st::TensorInfo& t : r.header().tensors) {
    if (t.dtype != st::DType::F32) continue;  // num_batches_tracked (I64) left out
    keep.push_back(r.read_f32(t));
    ts.push_back({t.name, st::DType::F32, t.shape, keep.back().data()});
  }
  edit(ts);
  const std::string path = temp(tag + ".safetensors");
  st::write_file(path, ts);
  return path;
}

void expect_refused(const std::string& path, const char* given,
                    const std::vector<std::string>& wants) {
  const std::string out = temp("refused.pooch");
  EXPECT_EQ(pooch_cnn_import(path.c_str(), given, out.c_str(), nullptr), POOCH_ERR_BAD_INPUT)
      << path;
  const std::string msg = pooch_last_error();
  for (const std::string& w : wants)
    EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  EXPECT_FALSE(fs::exists(out)) << "a refused import wrote " << out;
}

TEST(ImportRefuses, RenamedTensorNamingBoth) {
  std::vector<std::vector<float>> keep;
  const std::string p = edited(
      "renamed",
      [](std::vector<st::TensorOut>& ts) {
        for (auto& t : ts)
          if (t.name == "layer2.0.bn1.running_mean") t.name = "layer2.0.bn1.running_avg";
      },
      keep);
  expect_refused(p, nullptr, {"'layer2.0.bn1.running_mean'", "'layer2.0.bn1.running_avg'"});
  fs::remove(p);
}

TEST(ImportRefuses, WrongShapeNamingTheTensorAndBothShapes) {
  std::vector<std::vector<float>> keep;
  const std::string p = edited(
      "shape",
      [](std::vector<st::TensorOut>& ts) {
        for (auto& t : ts)
          if (t.name == "layer3.1.conv2.weight") t.shape = {t.shape[0], t.shape[1], 9, 1};
      },
      keep);
  expect_refused(p, nullptr, {"'layer3.1.conv2.weight'", "[16,16,9,1]", "[16,16,3,3]"});
  fs::remove(p);
}

TEST(ImportRefuses, MissingTensor) {
  std::vector<std::vector<float>> keep;
  const std::string p = edited(
      "missing",
      [](std::vector<st::TensorOut>& ts) {
        std::erase_if(ts,
                      [](const st::TensorOut& t) { return t.name == "layer4.1.bn2.running_var"; });
      },
      keep);
  expect_refused(p, nullptr, {"has no tensor 'layer4.1.bn2.running_var'"});
  fs::remove(p);
}

TEST(ImportRefuses, ExtraTensor) {
  std::vector<std::vector<float>> keep;
  static const float two[2] = {1, 2};
  const std::string p = edited(
      "extra",
      [](std::vector<st::TensorOut>& ts) {
        ts.push_back({"fc.scale", st::DType::F32, {2}, two});
      },
      keep);
  expect_refused(p, nullptr, {"'fc.scale'", "has no place"});
  fs::remove(p);
}

TEST(ImportRefuses, GivenDepthThatTheNamesDoNotFit) {
  // resnet-34's first stage has a third block the resnet-18 file lacks.
  expect_refused(kDir + "/resnet18_tiny.safetensors", "{\"depth\": 34}",
                 {"has no tensor 'layer1.2.conv1.weight'", "resnet-34"});
}

TEST(ImportRefuses, GivenImageSizeAVggClassifierDoesNotFit) {
  expect_refused(kDir + "/vgg11bn_tiny.safetensors", "{\"input\": {\"height\": 64}}",
                 {"'classifier.0.weight'", "for 64x64 images"});
}

TEST(ImportRefuses, AFileOfAnotherKind) {
  expect_refused(kDir + "/gpt_tiny.safetensors", nullptr, {"not a torchvision resnet"});
}

TEST(ImportRefuses, NullArguments) {
  EXPECT_EQ(pooch_cnn_import(nullptr, nullptr, "x", nullptr), POOCH_ERR_INVALID_ARG);
  EXPECT_EQ(pooch_cnn_export("x", nullptr), POOCH_ERR_INVALID_ARG);
}

}  // namespace
