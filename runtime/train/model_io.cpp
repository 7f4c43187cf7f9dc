#include "model_io.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "../core/error.h"

namespace pooch {

namespace {

bool carried(Role r, bool checkpoint) {
  return r == Role::weight || (checkpoint && r == Role::optimizer_state);
}

}  // namespace

std::string optimizer_to_json(const OptimizerConfig& o) {
  const char* kind = o.kind == OptimizerConfig::Kind::sgd     ? "sgd"
                     : o.kind == OptimizerConfig::Kind::adamw ? "adamw"
                                                              : "adam";
  nlohmann::json j{{"kind", kind},          {"lr", o.lr},   {"beta1", o.beta1},
                   {"beta2", o.beta2},      {"eps", o.eps}, {"weight_decay", o.weight_decay},
                   {"momentum", o.momentum}};
  return j.dump();
}

OptimizerConfig optimizer_from_json(const std::string& text, const std::string& source) {
  OptimizerConfig o;
  try {
    const auto j = nlohmann::json::parse(text);
    const std::string kind = j.at("kind").get<std::string>();
    if (kind == "sgd")
      o.kind = OptimizerConfig::Kind::sgd;
    else if (kind == "adamw")
      o.kind = OptimizerConfig::Kind::adamw;
    else if (kind == "adam")
      o.kind = OptimizerConfig::Kind::adam;
    else
      throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: unknown optimizer '{}'", source, kind));
    o.lr = j.at("lr").get<double>();
    o.beta1 = j.at("beta1").get<double>();
    o.beta2 = j.at("beta2").get<double>();
    o.eps = j.at("eps").get<double>();
    o.weight_decay = j.at("weight_decay").get<double>();
    o.momentum = j.at("momentum").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: the optimizer settings are malformed: {}", source, e.what()));
  }
  return o;
}

void save_session(const XmcSession& s, const std::string& path, bool checkpoint,
                  const Metadata& extra) {
  const Graph& g = s.model().graph;
  Metadata meta = extra;
  meta.set_string(meta_keys::kKind, checkpoint ? "checkpoint" : "model");
  meta.set_string(kMetaModelSpec, spec_to_json(s.model().spec));
  meta.set_u64(meta_keys::kStep, s.step());
  // On the CPU the arena is host memory: the writer reads the tensors in
  // place. Elsewhere each is copied out first (the file's size in host memory).
  std::vector<std::vector<std::byte>> copies;
  std::vector<TensorData> data;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const auto id = static_cast<TensorId>(t);
    const TensorDesc& d = g.tensor(id);
    if (!carried(d.role, checkpoint)) continue;
    const void* p = s.executor().host_view(id);
    if (!p) {
      copies.push_back(s.read(d.name));
      p = copies.back().data();
    }
    data.push_back({id, p, d.bytes()});
  }
  write_pooch_file(path, meta, g, data);
}

LoadedFile load_model_file(const std::string& path) {
  PoochFile f = read_pooch_file(path);
  const Metadata& m = f.metadata();
  if (!m.has(kMetaModelSpec))
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: not a pooch model or checkpoint (no '{}' metadata)", path,
                            kMetaModelSpec));
  ModelSpec spec = spec_from_json(m.get_string(kMetaModelSpec), path + " (model.spec)");
  const bool checkpoint = m.has(meta_keys::kKind) && m.get_string(meta_keys::kKind) == "checkpoint";
  OptimizerConfig opt;
  if (checkpoint && m.has(meta_keys::kOptimizer))
    opt = optimizer_from_json(m.get_string(meta_keys::kOptimizer), path);
  return LoadedFile{std::move(f), std::move(spec), checkpoint, opt};
}

namespace {

// The width an index tensor addresses (the input of the fixed fan-in layer it
// feeds), or -1 when it feeds none. Kernels trust index values, so values
// from a file are checked against it before they reach the arena.
int64_t index_bound(const Graph& g, TensorId t) {
  for (const Node& n : g.nodes())
    if (n.op == "ffi_linear" && n.inputs.size() > 1 && n.inputs[1] == t)
      return g.tensor(n.inputs[0]).shape.back();
  return -1;
}

void check_index_values(const PoochFile& f, const TensorDesc& d, std::span<const std::byte> bytes,
                        int64_t bound) {
  const auto n = static_cast<size_t>(d.numel());
  for (size_t i = 0; i < n; ++i) {
    int64_t v;
    if (d.dtype == DType::u16) {
      uint16_t x;
      std::memcpy(&x, bytes.data() + i * 2, 2);
      v = x;
    } else {
      int32_t x;
      std::memcpy(&x, bytes.data() + i * 4, 4);
      v = x;
    }
    if (v < 0 || v >= bound)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: tensor '{}' element {} is {}, outside the layer's input width "
                              "[0, {}); the file is damaged or was not written by pooch",
                              f.path(), d.name, i, v, bound));
  }
}

}  // namespace

void restore_tensors(XmcSession& s, const PoochFile& f, bool with_state,
                     std::string_view skip_prefix) {
  const Graph& g = s.model().graph;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (!carried(d.role, with_state)) continue;
    if (!skip_prefix.empty() && d.name.rfind(skip_prefix, 0) == 0) continue;
    const TensorEntry* e = f.find(d.name);
    if (!e)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: has no tensor '{}' ({}), which the model needs", f.path(),
                              d.name, role_name(d.role)));
    if (e->dtype != d.dtype || e->shape != d.shape)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: tensor '{}' is {} {} in the file but the model needs {} {}",
                              f.path(), d.name, dtype_name(e->dtype), shape_str(e->shape),
                              dtype_name(d.dtype), shape_str(d.shape)));
    const auto bytes = f.data(*e);
    if (d.dtype == DType::u16 || d.dtype == DType::i32)
      if (const int64_t bound = index_bound(g, static_cast<TensorId>(t)); bound >= 0)
        check_index_values(f, d, bytes, bound);
    s.write(d.name, bytes.data(), bytes.size());
  }
}

}  // namespace pooch
