#include "cnn_spec.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>

#include "../core/error.h"
#include "model_spec.h"

namespace pooch {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& src, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", src, what));
}

void known_fields(const json& o, std::initializer_list<const char*> known, const char* path,
                  const std::string& src) {
  for (const auto& [key, v] : o.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) fail(src, fmt::format("{}: unknown field \"{}\"", path, key));
  }
}

int64_t integer(const json& o, const char* key, int64_t fallback, const char* path,
                const std::string& src) {
  if (!o.contains(key)) return fallback;
  if (!o[key].is_number_integer()) fail(src, fmt::format("{}{} must be an integer", path, key));
  return o[key].get<int64_t>();
}

}  // namespace

void cnn_spec_from_json(const std::string& text, const std::string& src, ModelSpec& s) {
  const json j = json::parse(text);  // the caller parsed it once already
  known_fields(j,
               {"family", "depth", "input", "classes", "width", "stem", "batchnorm", "hidden",
                "dropout", "normalize", "batch", "topk", "seed"},
               "the spec", src);
  CnnSpec& c = s.cnn;
  s.input = InputKind::dense;
  s.loss = LossKind::softmax;
  c.depth = static_cast<int>(integer(j, "depth", s.family == Family::vgg ? 16 : 18, "", src));
  if (!j.contains("input") || !j["input"].is_object()) fail(src, "\"input\" must be an object");
  const json& in = j["input"];
  known_fields(in, {"channels", "height", "width"}, "input", src);
  c.channels = integer(in, "channels", c.channels, "input.", src);
  c.height = integer(in, "height", c.height, "input.", src);
  c.width = integer(in, "width", c.width, "input.", src);
  if (!j.contains("classes")) fail(src, "classes is missing");
  s.labels = integer(j, "classes", 0, "", src);
  c.base_width = integer(j, "width", c.base_width, "", src);
  if (j.contains("stem")) {
    if (!j["stem"].is_string()) fail(src, "stem must be a string");
    c.stem = j["stem"].get<std::string>();
  }
  if (j.contains("batchnorm")) {
    if (!j["batchnorm"].is_boolean()) fail(src, "batchnorm must be true or false");
    c.batchnorm = j["batchnorm"].get<bool>();
  }
  c.hidden = integer(j, "hidden", c.hidden, "", src);
  if (j.contains("dropout")) {
    if (!j["dropout"].is_number()) fail(src, "dropout must be a number");
    c.dropout = j["dropout"].get<double>();
  }
  if (j.contains("normalize")) {
    const json& n = j["normalize"];
    if (!n.is_object()) fail(src, "normalize must be an object {\"mean\": [...], \"std\": [...]}");
    known_fields(n, {"mean", "std"}, "normalize", src);
    for (const char* key : {"mean", "std"}) {
      if (!n.contains(key) || !n[key].is_array())
        fail(src, fmt::format("normalize.{} must be an array of numbers", key));
      std::vector<double>& v = std::string_view(key) == "mean" ? c.mean : c.std;
      for (size_t i = 0; i < n[key].size(); ++i) {
        if (!n[key][i].is_number())
          fail(src, fmt::format("normalize.{}[{}] must be a number", key, i));
        v.push_back(n[key][i].get<double>());
      }
    }
  }
  s.run.batch = integer(j, "batch", s.run.batch, "", src);
  s.run.topk = static_cast<int>(integer(j, "topk", s.run.topk, "", src));
  if (j.contains("seed") && !j["seed"].is_number_unsigned())
    fail(src, fmt::format("seed is {}; it must be from 0 to {}", j["seed"].dump(), UINT64_MAX));
  s.seed = j.value("seed", s.seed);
  try {
    validate_cnn_spec(s);
  } catch (const Error& e) {
    fail(src, e.what());
  }
}

std::string cnn_spec_to_json(const ModelSpec& s) {
  const CnnSpec& c = s.cnn;
  json j;
  j["family"] = family_name(s.family);
  j["depth"] = c.depth;
  j["input"] = {{"channels", c.channels}, {"height", c.height}, {"width", c.width}};
  j["classes"] = s.labels;
  j["width"] = c.base_width;
  if (s.family == Family::resnet) {
    j["stem"] = c.stem;
  } else {
    j["batchnorm"] = c.batchnorm;
    j["hidden"] = c.hidden;
    j["dropout"] = c.dropout;
  }
  if (!c.mean.empty()) j["normalize"] = {{"mean", c.mean}, {"std", c.std}};
  j["batch"] = s.run.batch;
  j["topk"] = s.run.topk;
  j["seed"] = s.seed;
  return j.dump(2);
}

void validate_cnn_spec(const ModelSpec& s) {
  const CnnSpec& c = s.cnn;
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw Error(POOCH_ERR_INVALID_ARG, what);
  };
  constexpr int64_t kMax = INT32_MAX;
  auto range = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    req(v >= lo && v <= hi, fmt::format("{} is {}; it must be from {} to {}", field, v, lo, hi));
  };
  if (s.family == Family::resnet)
    req(c.depth == 18 || c.depth == 34 || c.depth == 50 || c.depth == 101 || c.depth == 152,
        fmt::format("depth {} is not a ResNet depth (18, 34, 50, 101 or 152)", c.depth));
  else
    req(c.depth == 11 || c.depth == 13 || c.depth == 16 || c.depth == 19,
        fmt::format("depth {} is not a VGG depth (11, 13, 16 or 19)", c.depth));
  range("input.channels", c.channels, 1, 1 << 16);
  range("input.height", c.height, 1, 1 << 16);
  range("input.width", c.width, 1, 1 << 16);
  range("classes", s.labels, 1, kMax);
  range("width", c.base_width, 1, 1 << 14);
  range("hidden", c.hidden, 1, kMax);
  range("batch", s.run.batch, 1, kMax);
  range("topk", s.run.topk, 1, kMax);
  req(c.stem == "imagenet" || c.stem == "small",
      fmt::format("stem must be \"imagenet\" or \"small\", got \"{}\"", c.stem));
  req(c.mean.size() == c.std.size() &&
          (c.mean.empty() || static_cast<int64_t>(c.mean.size()) == c.channels),
      fmt::format("normalize holds {} means and {} deviations; the image has {} channels",
                  c.mean.size(), c.std.size(), c.channels));
  for (size_t i = 0; i < c.std.size(); ++i)
    req(std::isfinite(c.mean[i]) && std::isfinite(c.std[i]) && c.std[i] > 0,
        fmt::format("normalize: channel {} has mean {} and std {}; both must be finite and std "
                    "> 0",
                    i, c.mean[i], c.std[i]));
  req(c.dropout >= 0 && c.dropout < 1, fmt::format("dropout must be in [0, 1), got {}", c.dropout));
  // VGG halves the image with five unpadded 2x2 poolings (ResNet's padded
  // windows fit any size).
  if (s.family == Family::vgg)
    req(c.height >= 32 && c.width >= 32,
        fmt::format("a {}x{} image is too small for vgg-{}: its five 2x2 poolings need at least "
                    "32x32",
                    c.height, c.width, c.depth));
}

}  // namespace pooch
