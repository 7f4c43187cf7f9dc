#include "model_spec.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "../../kernels/common/util.h"
#include "../core/error.h"
#include "../core/strict_json.h"
#include "gpt_spec.h"

namespace pooch {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

const char* layer_type(LayerKind k) {
  switch (k) {
    case LayerKind::linear:
      return "linear";
    case LayerKind::dropout:
      return "dropout";
    case LayerKind::layernorm:
      return "layernorm";
    case LayerKind::ffi_head:
      return "ffi";
    case LayerKind::dense_head:
      return "dense";
  }
  return "?";
}

int64_t get_int(const json& o, const char* key, const std::string& path, const std::string& src) {
  if (!o.contains(key)) bad(src, fmt::format("{}.{} is missing", path, key));
  const json& v = o.at(key);
  if (!v.is_number_integer()) bad(src, fmt::format("{}.{} must be an integer", path, key));
  return v.get<int64_t>();
}

// A misspelt key ("activaton") must not fall back to a default silently.
void only_known(const json& o, std::initializer_list<const char*> known, const std::string& path,
                const std::string& src) {
  for (const auto& [key, value] : o.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      bad(src, fmt::format("{}: unknown field \"{}\" (known: {})", path, key, list));
    }
  }
}

}  // namespace

const char* loss_name(LossKind k) {
  switch (k) {
    case LossKind::bce:
      return "bce";
    case LossKind::squared_hinge:
      return "squared-hinge";
    case LossKind::softmax:
      return "softmax";
    case LossKind::mse:
      return "mse";
  }
  return "?";
}

const char* family_name(Family f) {
  return f == Family::mlp      ? "mlp"
         : f == Family::gpt    ? "gpt"
         : f == Family::resnet ? "resnet"
         : f == Family::vgg    ? "vgg"
                               : "xmc";
}

const char* head_prefix(Family f) {
  return f == Family::resnet ? "fc." : f == Family::vgg ? "classifier.6." : "head.";
}

LossKind parse_loss(const std::string& name) {
  const std::string n = ascii_lower(name);  // names match without regard to case
  if (n == "bce") return LossKind::bce;
  if (n == "squared-hinge" || n == "squared_hinge") return LossKind::squared_hinge;
  if (n == "softmax") return LossKind::softmax;
  if (n == "mse") return LossKind::mse;
  throw Error(POOCH_ERR_INVALID_ARG,
              fmt::format("unknown loss '{}': use bce, squared-hinge, softmax or mse", name));
}

ModelSpec spec_from_flags(InputKind input, int64_t input_width, int64_t labels, int64_t hidden,
                          int64_t bottleneck, int64_t fan_in, LossKind loss, double dropout) {
  ModelSpec s;
  s.input = input;
  s.input_width = input_width;
  s.labels = labels;
  s.loss = loss;
  s.layers.push_back({LayerKind::linear, hidden, "relu", 0, 0});
  if (bottleneck > 0) s.layers.push_back({LayerKind::linear, bottleneck, "relu", 0, 0});
  if (dropout > 0) s.layers.push_back({LayerKind::dropout, 0, "none", dropout, 0});
  if (fan_in > 0)
    s.layers.push_back({LayerKind::ffi_head, 0, "none", 0, fan_in});
  else
    s.layers.push_back({LayerKind::dense_head, 0, "none", 0, 0});
  return s;
}

ModelSpec mlp_chain_spec(int layers, int64_t input_width, int64_t width, int64_t labels,
                         int64_t batch) {
  ModelSpec s;
  s.family = Family::mlp;
  s.input = InputKind::dense;
  s.input_width = input_width;
  s.labels = labels;
  s.loss = LossKind::mse;
  for (int i = 0; i < layers; ++i) s.layers.push_back({LayerKind::linear, width, "gelu", 0, 0});
  s.layers.push_back({LayerKind::dense_head, 0, "none", 0, 0});
  s.run.batch = batch;
  return s;
}

void validate_spec(const ModelSpec& s) {
  if (is_cnn(s.family)) return validate_cnn_spec(s);
  if (s.family == Family::gpt) return validate_gpt_spec(s);
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw Error(POOCH_ERR_INVALID_ARG, what);
  };
  // Indices, offsets and the nonzero and label budgets of a batch are i32.
  constexpr int64_t kMax = INT32_MAX;
  auto in_range = [&](const char* field, int64_t v, int64_t lo, int64_t hi, const char* why) {
    req(v >= lo && v <= hi,
        fmt::format("{} is {}; it must be from {} to {}{}", field, v, lo, hi, why));
  };
  const char* i32 = " (indices are 32-bit)";
  in_range("input.width", s.input_width, 1, kMax, i32);
  in_range(s.family == Family::mlp ? "outputs" : "labels", s.labels, 1, kMax, i32);
  in_range("max_nnz", s.run.max_nnz, 0, kMax, " (a batch's nonzeros are counted in 32 bits)");
  in_range("max_labels", s.run.max_labels, 0, kMax, " (a batch's labels are counted in 32 bits)");
  // The default budgets are 64 nonzeros and 32 labels per row.
  const int64_t per_row = s.run.max_nnz == 0 ? 64 : s.run.max_labels == 0 ? 32 : 1;
  in_range("batch", s.run.batch, 1, kMax / per_row,
           per_row == 64   ? " (with max_nnz 0 a batch may hold 64 nonzeros per row, counted in "
                             "32 bits)"
           : per_row == 32 ? " (with max_labels 0 a batch may hold 32 labels per row, counted in "
                             "32 bits)"
                           : "");
  in_range("topk", s.run.topk, 1, kMax, "");
  req(!s.layers.empty(), "the model needs at least an output layer");
  if (s.family == Family::mlp) {
    req(s.input == InputKind::dense, "an mlp model takes dense input");
    req(s.loss == LossKind::mse || s.loss == LossKind::softmax,
        fmt::format("an mlp model's loss must be mse or softmax, got '{}'", loss_name(s.loss)));
    req(s.layers.back().kind == LayerKind::dense_head,
        "an mlp model's last layer must be a dense output layer");
  } else {
    req(s.loss != LossKind::mse, "the mse loss is for mlp models (\"family\": \"mlp\")");
  }
  req(!s.skip || (s.family == Family::xmc && s.input == InputKind::sparse),
      "skip: the linear input -> labels path is for xmc models with sparse input");
  req(!s.skip || s.layers.size() > 1,
      "skip: the model is already linear (its only layer is the output layer); drop \"skip\"");
  int64_t width = s.input_width;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSpec& l = s.layers[i];
    const bool last = i + 1 == s.layers.size();
    const bool head = l.kind == LayerKind::ffi_head || l.kind == LayerKind::dense_head;
    req(head == last,
        last ? fmt::format("layers[{}]: the last layer must be the output layer (ffi or dense)", i)
             : fmt::format("layers[{}]: an output layer ({}) must be the last layer", i,
                           layer_type(l.kind)));
    if (i == 0 && s.input == InputKind::sparse)
      req(l.kind == LayerKind::linear || l.kind == LayerKind::dense_head,
          "layers[0]: a sparse input must be followed by a linear layer");
    switch (l.kind) {
      case LayerKind::linear:
        in_range(fmt::format("layers[{}].width", i).c_str(), l.width, 1, kMax, i32);
        req(l.activation == "relu" || l.activation == "gelu" || l.activation == "none",
            fmt::format("layers[{}].activation must be relu, gelu or none, got '{}'", i,
                        l.activation));
        width = l.width;
        break;
      case LayerKind::dropout:
        req(l.p >= 0 && l.p < 1, fmt::format("layers[{}].p must be in [0, 1), got {}", i, l.p));
        break;
      case LayerKind::layernorm:
        break;
      case LayerKind::ffi_head:
        req(l.fan_in > 0 && l.fan_in <= width,
            fmt::format("layers[{}].fan_in must be between 1 and the width before it ({}), got {}",
                        i, width, l.fan_in));
        req(!(i == 0 && s.input == InputKind::sparse),
            "layers[0]: a fixed fan-in head cannot read a sparse input directly; put a linear "
            "layer first");
        req(l.fan_in <= kMax / s.labels,
            fmt::format("layers[{}].fan_in is {}: {} labels x {} inputs is more than the 2^31-1 "
                        "slots a fixed fan-in index may hold; with {} labels fan_in can be at "
                        "most {}",
                        i, l.fan_in, s.labels, l.fan_in, s.labels, kMax / s.labels));
        break;
      case LayerKind::dense_head:
        break;
    }
  }
}

namespace {
ModelSpec spec_from_json_unguarded(const std::string& text, const std::string& src);
}  // namespace

// A value of the wrong type that a field's own check did not catch (a
// number where a string belongs: nlohmann-json's value() and get() throw
// type_error) is bad input too, never an exception out of the library
// (found by fuzz_model_spec: {"input": {"kind": 4294967297}}).
ModelSpec spec_from_json(const std::string& text, const std::string& src) {
  try {
    return spec_from_json_unguarded(text, src);
  } catch (const json::exception& e) {
    bad(src, fmt::format("a field holds a value of the wrong type or range ({})", e.what()));
  }
}

namespace {
ModelSpec spec_from_json_unguarded(const std::string& text, const std::string& src) {
  json j;
  // JSON allows a key twice in an object and the parser keeps the last, so
  // {"loss": "bce", "loss": "softmax"} would pass for a spec that says one
  // thing: a repeated key is an error, as an unknown one is.
  std::string repeated;
  try {
    j = parse_json_noting_repeats(text, &repeated);
  } catch (const json::parse_error& e) {
    bad(src, fmt::format("not valid JSON (byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    bad(src, fmt::format("not valid JSON: {}", e.what()));
  }
  if (!repeated.empty())
    bad(src,
        fmt::format("the key \"{}\" appears twice in one object; give each field once", repeated));
  if (!j.is_object()) bad(src, "the model spec must be a JSON object");
  if (j.contains("family") && j["family"].is_string() &&
      ascii_lower(j["family"].get<std::string>()) == "gpt")
    return gpt_spec_from_json(j, src);
  ModelSpec s;
  if (!j.contains("input") || !j["input"].is_object()) bad(src, "\"input\" must be an object");
  if (j.contains("family")) {
    if (!j["family"].is_string()) bad(src, "family must be a string");
    const std::string f = ascii_lower(j["family"].get<std::string>());
    if (f == "mlp")
      s.family = Family::mlp;
    else if (f == "resnet" || f == "vgg")
      s.family = f == "resnet" ? Family::resnet : Family::vgg;
    else if (f != "xmc")
      bad(src, fmt::format("family '{}' is not one of xmc, mlp, gpt, resnet, vgg", f));
  }
  if (is_cnn(s.family)) {
    cnn_spec_from_json(text, src, s);
    return s;
  }
  const char* width_key = s.family == Family::mlp ? "outputs" : "labels";
  only_known(j,
             {"family", "input", width_key, "layers", "loss", "batch", "max_nnz", "max_labels",
              "topk", "seed", "skip", "fused_head"},
             "the spec", src);
  if (s.family == Family::mlp) s.input = InputKind::dense;
  const json& in = j["input"];
  only_known(in, {"kind", "width"}, "input", src);
  // Names match without regard to case; the spec keeps the canonical spelling.
  const std::string kind =
      ascii_lower(in.value("kind", s.family == Family::mlp ? "dense" : "sparse"));
  if (kind != "sparse" && kind != "dense") bad(src, "input.kind must be \"sparse\" or \"dense\"");
  s.input = kind == "sparse" ? InputKind::sparse : InputKind::dense;
  s.input_width = get_int(in, "width", "input", src);
  s.labels = get_int(j, width_key, "spec", src);
  if (j.contains("loss")) {
    if (!j["loss"].is_string()) bad(src, "loss must be a string");
    try {
      s.loss = parse_loss(j["loss"].get<std::string>());
    } catch (const Error& e) {
      bad(src, e.what());
    }
  }
  for (const char* key : {"batch", "max_nnz", "max_labels", "topk", "seed"})
    if (j.contains(key) && !j[key].is_number_integer())
      bad(src, fmt::format("{} must be an integer", key));
  s.run.batch = j.value("batch", s.run.batch);
  s.run.max_nnz = j.value("max_nnz", s.run.max_nnz);
  s.run.max_labels = j.value("max_labels", s.run.max_labels);
  const int64_t topk = j.value("topk", int64_t{s.run.topk});
  if (topk < 1 || topk > INT32_MAX)
    bad(src, fmt::format("topk is {}; it must be from 1 to {}", topk, INT32_MAX));
  s.run.topk = static_cast<int>(topk);
  if (j.contains("seed") && !j["seed"].is_number_unsigned())
    bad(src, fmt::format("seed is {}; it must be from 0 to {}", j["seed"].dump(), UINT64_MAX));
  s.seed = j.value("seed", s.seed);
  if (j.contains("skip")) {
    if (!j["skip"].is_boolean()) bad(src, "skip must be true or false");
    s.skip = j["skip"].get<bool>();
  }
  if (j.contains("fused_head")) {
    if (!j["fused_head"].is_boolean()) bad(src, "fused_head must be true or false");
    s.fused_head = j["fused_head"].get<bool>();
  }
  if (!j.contains("layers") || !j["layers"].is_array()) bad(src, "\"layers\" must be an array");
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const json& l = j["layers"][i];
    const std::string path = fmt::format("layers[{}]", i);
    if (!l.is_object() || !l.contains("type") || !l["type"].is_string())
      bad(src, path + " must be an object with a \"type\"");
    const std::string typed = l["type"].get<std::string>();
    const std::string type = ascii_lower(typed);
    if (type == "linear")
      only_known(l, {"type", "width", "activation"}, path, src);
    else if (type == "dropout")
      only_known(l, {"type", "p"}, path, src);
    else if (type == "ffi")
      only_known(l, {"type", "fan_in"}, path, src);
    else if (type == "layernorm" || type == "dense")
      only_known(l, {"type"}, path, src);
    LayerSpec ls;
    if (type == "linear") {
      ls.kind = LayerKind::linear;
      ls.width = get_int(l, "width", path, src);
      if (l.contains("activation")) {
        if (!l["activation"].is_string()) bad(src, path + ".activation must be a string");
        ls.activation = ascii_lower(l["activation"].get<std::string>());
      }
    } else if (type == "dropout") {
      ls.kind = LayerKind::dropout;
      if (!l.contains("p") || !l["p"].is_number()) bad(src, path + ".p must be a number");
      ls.p = l["p"].get<double>();
    } else if (type == "layernorm") {
      ls.kind = LayerKind::layernorm;
    } else if (type == "ffi") {
      ls.kind = LayerKind::ffi_head;
      ls.fan_in = get_int(l, "fan_in", path, src);
    } else if (type == "dense") {
      ls.kind = LayerKind::dense_head;
    } else {
      bad(src, fmt::format("{}.type '{}' is not one of linear, dropout, layernorm, ffi, dense",
                           path, typed));
    }
    s.layers.push_back(ls);
  }
  try {
    validate_spec(s);
  } catch (const Error& e) {
    bad(src, e.what());
  }
  return s;
}
}  // namespace

std::string spec_to_json(const ModelSpec& s) {
  if (is_cnn(s.family)) return cnn_spec_to_json(s);
  if (s.family == Family::gpt) return gpt_spec_to_json(s);
  json j;
  if (s.family != Family::xmc) j["family"] = family_name(s.family);
  j["input"] = {{"kind", s.input == InputKind::sparse ? "sparse" : "dense"},
                {"width", s.input_width}};
  j[s.family == Family::mlp ? "outputs" : "labels"] = s.labels;
  j["loss"] = loss_name(s.loss);
  j["batch"] = s.run.batch;
  j["max_nnz"] = s.run.max_nnz;
  j["max_labels"] = s.run.max_labels;
  j["topk"] = s.run.topk;
  j["seed"] = s.seed;
  if (s.skip) j["skip"] = true;  // absent at the defaults: older files stay byte-identical
  if (!s.fused_head) j["fused_head"] = false;
  json layers = json::array();
  for (const LayerSpec& l : s.layers) {
    json o{{"type", layer_type(l.kind)}};
    if (l.kind == LayerKind::linear) {
      o["width"] = l.width;
      o["activation"] = l.activation;
    }
    if (l.kind == LayerKind::dropout) o["p"] = l.p;
    if (l.kind == LayerKind::ffi_head) o["fan_in"] = l.fan_in;
    layers.push_back(o);
  }
  j["layers"] = layers;
  return j.dump(2);
}

}  // namespace pooch
