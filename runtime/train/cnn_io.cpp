#include "cnn_io.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../../formats/pooch_file.h"
#include "../../formats/safetensors.h"
#include "../../formats/scratch_file.h"
#include "../core/error.h"
#include "../models/build.h"
#include "model_io.h"

namespace pooch {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, what);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// torchvision's counter of batches seen, which pooch does not keep.
bool ignored(const std::string& name) {
  return ends_with(name, ".num_batches_tracked");
}

json parse_given(const std::string& given) {
  if (given.empty()) return json::object();
  json j = json::parse(given, nullptr, false);
  if (!j.is_object()) bad(fmt::format("the import's spec fields must be a JSON object: {}", given));
  return j;
}

// The shape of tensor `name`, or empty when the file has none.
std::vector<int64_t> shape_of(const safetensors::Header& h, const std::string& name) {
  const safetensors::TensorInfo* t = h.find(name);
  return t ? t->shape : std::vector<int64_t>{};
}

void infer_resnet(const safetensors::Header& h, const std::string& from, json& j) {
  const std::vector<int64_t> conv1 = shape_of(h, "conv1.weight"), fc = shape_of(h, "fc.weight");
  if (conv1.size() == 4) {
    if (!j.contains("width")) j["width"] = conv1[0];
    if (!j["input"].contains("channels")) j["input"]["channels"] = conv1[1];
    if (!j.contains("stem")) j["stem"] = conv1[2] == 3 ? "small" : "imagenet";
  }
  if (fc.size() == 2 && !j.contains("classes")) j["classes"] = fc[0];
  if (j.contains("depth")) return;
  const bool bottleneck = h.find("layer1.0.conv3.weight") != nullptr;
  int blocks[4];
  for (int l = 0; l < 4; ++l) {
    blocks[l] = 0;
    while (h.find(fmt::format("layer{}.{}.conv1.weight", l + 1, blocks[l]))) ++blocks[l];
  }
  const std::map<std::vector<int>, int> depths = {{{0, 2, 2, 2, 2}, 18},
                                                  {{0, 3, 4, 6, 3}, 34},
                                                  {{1, 3, 4, 6, 3}, 50},
                                                  {{1, 3, 4, 23, 3}, 101},
                                                  {{1, 3, 8, 36, 3}, 152}};
  const std::vector<int> key = {bottleneck ? 1 : 0, blocks[0], blocks[1], blocks[2], blocks[3]};
  const auto it = depths.find(key);
  if (it == depths.end())
    bad(fmt::format(
        "{}: a resnet with {} blocks of {} ({}, {}, {}, {} per stage) is none of "
        "resnet-18, 34, 50, 101, 152",
        from, blocks[0] + blocks[1] + blocks[2] + blocks[3], bottleneck ? "bottleneck" : "basic",
        blocks[0], blocks[1], blocks[2], blocks[3]));
  j["depth"] = it->second;
}

void infer_vgg(const safetensors::Header& h, const std::string& from, json& j) {
  // torchvision's features Sequential: conv [bn] relu ... pool, numbered in order.
  int convs = 0;
  bool batchnorm = false;
  int64_t last_channels = 0;
  for (int i = 0; i < 4096; ++i) {
    const std::vector<int64_t> w = shape_of(h, fmt::format("features.{}.weight", i));
    if (h.find(fmt::format("features.{}.running_mean", i))) batchnorm = true;
    if (w.size() == 4) {
      ++convs;
      last_channels = w[0];
    }
  }
  const std::vector<int64_t> f0 = shape_of(h, "features.0.weight"),
                             c0 = shape_of(h, "classifier.0.weight"),
                             c6 = shape_of(h, "classifier.6.weight");
  if (!j.contains("depth")) {
    if (convs + 3 != 11 && convs + 3 != 13 && convs + 3 != 16 && convs + 3 != 19)
      bad(fmt::format("{}: a vgg with {} convolutions is none of vgg-11, 13, 16, 19", from, convs));
    j["depth"] = convs + 3;
  }
  if (!j.contains("batchnorm")) j["batchnorm"] = batchnorm;
  if (f0.size() == 4) {
    if (!j.contains("width")) j["width"] = f0[0];
    if (!j["input"].contains("channels")) j["input"]["channels"] = f0[1];
  }
  if (c0.size() == 2 && !j.contains("hidden")) j["hidden"] = c0[0];
  if (c6.size() == 2 && !j.contains("classes")) j["classes"] = c6[0];
  // The classifier takes the last feature map flattened: its side is the
  // image's over 32 (five 2x2 poolings). A square map gives the image size.
  if (c0.size() == 2 && last_channels > 0 && c0[1] % last_channels == 0 &&
      !j["input"].contains("height") && !j["input"].contains("width")) {
    const int64_t cells = c0[1] / last_channels;
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(cells))));
    if (side * side == cells) {
      j["input"]["height"] = side * 32;
      j["input"]["width"] = side * 32;
    }
  }
}

}  // namespace

std::string infer_cnn_spec(const std::string& from, const std::string& given) {
  const safetensors::Reader r(from);
  const safetensors::Header& h = r.header();
  json j = parse_given(given);
  if (!j.contains("family")) {
    if (h.find("conv1.weight") && h.find("fc.weight"))
      j["family"] = "resnet";
    else if (h.find("features.0.weight") && h.find("classifier.0.weight"))
      j["family"] = "vgg";
    else
      bad(
          fmt::format("{}: not a torchvision resnet (conv1.weight, fc.weight) or vgg "
                      "(features.0.weight, classifier.0.weight) state dict; {} tensors, the "
                      "first '{}'",
                      from, h.tensors.size(), h.tensors.empty() ? "" : h.tensors[0].name));
  }
  if (!j["family"].is_string() || (j["family"] != "resnet" && j["family"] != "vgg"))
    bad(fmt::format("{}: import reads resnet and vgg state dicts, not family {}", from,
                    j["family"].dump()));
  if (!j.contains("input")) j["input"] = json::object();
  if (!j["input"].is_object()) bad("the import's input field must be an object");
  if (j["family"] == "resnet")
    infer_resnet(h, from, j);
  else
    infer_vgg(h, from, j);
  if (!j["input"].contains("height")) j["input"]["height"] = 224;
  if (!j["input"].contains("width")) j["input"]["width"] = j["input"]["height"];
  return j.dump();
}

std::string import_cnn(const std::string& from, const std::string& given, const std::string& out) {
  const std::string spec_json = infer_cnn_spec(from, given);
  const ModelSpec spec = spec_from_json(spec_json, from + " (the spec inferred from it)");
  const std::unique_ptr<Model> m = build_model(spec);
  const std::string model_name = fmt::format("{}-{} (width {})", family_name(spec.family),
                                             spec.cnn.depth, spec.cnn.base_width);
  const safetensors::Reader r(from);
  const safetensors::Header& h = r.header();

  // The file's tensors the model has no place for (a renamed one shows up
  // here as well as missing: the message names both).
  std::set<std::string> model_names;
  for (const TensorDesc& d : m->graph.tensors())
    if (d.role == Role::weight) model_names.insert(d.name);
  std::string first_unused;
  for (const safetensors::TensorInfo& t : h.tensors)
    if (!ignored(t.name) && !model_names.count(t.name) && first_unused.empty())
      first_unused = t.name;

  // Every weight in the model's order: checked, then converted to a scratch
  // file beside `out`, one tensor in memory at a time.
  for (const TensorDesc& d : m->graph.tensors()) {
    if (d.role != Role::weight) continue;
    const safetensors::TensorInfo* t = h.find(d.name);
    if (!t)
      bad(fmt::format(
          "{}: has no tensor '{}' {}, which {} needs{}", from, d.name, shape_str(d.shape),
          model_name,
          first_unused.empty()
              ? ""
              : fmt::format(" (the file has '{}', which it has no place for)", first_unused)));
    if (Shape(t->shape) != d.shape)
      bad(fmt::format("{}: tensor '{}' is {} but {} needs {}{}", from, d.name,
                      shape_str(Shape(t->shape)), model_name, shape_str(d.shape),
                      spec.family == Family::vgg && d.name == "classifier.0.weight"
                          ? fmt::format(" for {}x{} images", spec.cnn.height, spec.cnn.width)
                          : std::string()));
  }
  if (!first_unused.empty())
    bad(fmt::format("{}: tensor '{}' {} has no place in {}", from, first_unused,
                    shape_str(Shape(h.find(first_unused)->shape)), model_name));

  const size_t slash = out.find_last_of('/');
  file_io::ScratchFile scratch(slash == std::string::npos ? "." : out.substr(0, slash + 1),
                               "the imported weights");
  std::map<std::string, std::pair<uint64_t, size_t>> where;
  for (const TensorDesc& d : m->graph.tensors()) {
    if (d.role != Role::weight) continue;
    const std::vector<float> v = r.read_f32(*h.find(d.name));
    where[d.name] = {scratch.append(v.data(), v.size() * 4), v.size() * 4};
  }
  scratch.map();
  std::map<std::string, std::span<const std::byte>, std::less<>> weights;
  for (const auto& [name, at] : where) weights[name] = scratch.bytes(at.first, at.second);
  save_model(*m, out, weights);
  return spec_to_json(spec);
}

void export_cnn(const std::string& model_path, const std::string& out_file) {
  const LoadedFile lf = load_model_file(model_path);
  if (!lf.has_spec || (lf.spec.family != Family::resnet && lf.spec.family != Family::vgg))
    bad(
        fmt::format("{}: is a {} model; export writes resnet and vgg models as torchvision "
                    "state dicts",
                    model_path, lf.model ? lf.model->family : "?"));
  const PoochFile& f = lf.file;
  // The model's weights in its graph's order, which is torchvision's.
  std::vector<safetensors::TensorOut> tensors;
  for (const TensorDesc& d : lf.model->graph.tensors()) {
    if (d.role != Role::weight) continue;
    const TensorEntry* e = f.find(d.name);
    if (!e || e->dtype != DType::f32)
      bad(fmt::format("{}: has no float32 tensor '{}'", model_path, d.name));
    tensors.push_back({d.name, safetensors::DType::F32,
                       std::vector<int64_t>(e->shape.begin(), e->shape.end()), nullptr});
  }
  safetensors::write_file_streaming(out_file, tensors, [&](size_t i, std::byte* dst) {
    const auto bytes = f.data(*f.find(tensors[i].name));
    std::memcpy(dst, bytes.data(), bytes.size());
  });
}

}  // namespace pooch
