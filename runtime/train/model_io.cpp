#include "model_io.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "../core/error.h"
#include "../models/build.h"
#include "../models/gpt.h"

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
  if (!o.decay_vectors) j["decay_vectors"] = false;   // absent: every weight decays
  if (o.clip_norm > 0) j["clip_norm"] = o.clip_norm;  // absent: no clipping
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
    if (j.contains("decay_vectors")) o.decay_vectors = j.at("decay_vectors").get<bool>();
    if (j.contains("clip_norm")) o.clip_norm = j.at("clip_norm").get<double>();
    if (!(o.clip_norm >= 0 && std::isfinite(o.clip_norm)))
      throw Error(
          POOCH_ERR_BAD_INPUT,
          fmt::format("{}: clip_norm is {}; it must be finite and >= 0", source, o.clip_norm));
  } catch (const nlohmann::json::exception& e) {
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: the optimizer settings are malformed: {}", source, e.what()));
  }
  return o;
}

namespace {

std::string io_to_json(const Model& m, const Graph& full) {
  auto list = [&](const std::vector<IoTensor>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const IoTensor& t : v)
      a.push_back({{"name", t.name},
                   {"tensor", full.tensor(t.id).name},
                   {"batch_dim", t.batch_dim},
                   {"pad", t.pad},
                   {"row_mask", t.row_mask},
                   {"index_bound", t.index_bound}});
    return a;
  };
  nlohmann::json losses = nlohmann::json::array();
  for (TensorId l : m.losses) losses.push_back(full.tensor(l).name);
  return nlohmann::json{{"inputs", list(m.inputs)},
                        {"outputs", list(m.outputs)},
                        {"losses", losses},
                        {"forward_tensors", m.graph.num_tensors()},
                        {"forward_nodes", m.graph.nodes().size()},
                        {"seed", m.seed},
                        {"batch", m.batch}}
      .dump();
}

// The model a file's graph and "model.io" describe.
std::shared_ptr<Model> model_from_io(const PoochFile& f, const std::string& text) {
  const std::string src = f.path() + " (model.io)";
  auto m = std::make_shared<Model>();
  try {
    const auto j = nlohmann::json::parse(text);
    m->graph = f.graph().prefix(j.at("forward_tensors").get<size_t>(),
                                j.at("forward_nodes").get<size_t>());
    auto tensor = [&](const std::string& name) {
      const auto id = m->graph.find(name);
      if (!id)
        throw Error(
            POOCH_ERR_BAD_INPUT,
            fmt::format("{}: names tensor '{}', which the graph's forward part lacks", src, name));
      return *id;
    };
    auto list = [&](const nlohmann::json& a, std::vector<IoTensor>& out) {
      for (const auto& e : a)
        out.push_back({e.at("name").get<std::string>(), tensor(e.at("tensor").get<std::string>()),
                       e.at("batch_dim").get<int>(), e.at("pad").get<double>(),
                       e.at("row_mask").get<bool>(), e.value("index_bound", int64_t{0})});
    };
    list(j.at("inputs"), m->inputs);
    list(j.at("outputs"), m->outputs);
    for (const auto& l : j.at("losses")) m->losses.push_back(tensor(l.get<std::string>()));
    m->seed = j.at("seed").get<uint64_t>();
    m->batch = j.at("batch").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: malformed: {}", src, e.what()));
  }
  for (const IoTensor& t : m->inputs)
    if (m->graph.tensor(t.id).role != Role::input)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: input '{}' is not an input tensor of the graph", src, t.name));
  const Metadata& meta = f.metadata();
  if (meta.has(meta_keys::kModelFamily)) m->family = meta.get_string(meta_keys::kModelFamily);
  if (meta.has(meta_keys::kModelSpec)) m->spec_json = meta.get_string(meta_keys::kModelSpec);
  return m;
}

}  // namespace

void save_session(const Session& s, const std::string& path, bool checkpoint,
                  const Metadata& extra) {
  const Graph& g = s.graph();
  const Model& model = s.model();
  Metadata meta = extra;
  meta.set_string(meta_keys::kKind, checkpoint ? "checkpoint" : "model");
  if (!model.spec_json.empty()) meta.set_string(meta_keys::kModelSpec, model.spec_json);
  if (!model.family.empty()) meta.set_string(meta_keys::kModelFamily, model.family);
  meta.set_string(meta_keys::kModelIo, io_to_json(model, g));
  meta.set_u64(meta_keys::kStep, s.optimizer_step());
  // On the CPU the arena is host memory: the writer reads the tensors in
  // place. A tensor elsewhere, or in a blocked layout, is read out (plain)
  // as the writer comes to it, one at a time.
  std::vector<TensorData> data;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const auto id = static_cast<TensorId>(t);
    const TensorDesc& d = g.tensor(id);
    if (!carried(d.role, checkpoint)) continue;
    TensorData td{id, s.host_view(id), d.bytes(), {}};
    if (!td.data) td.fill = [&s, id](std::byte* to) { s.read_tensor_to(id, to); };
    data.push_back(std::move(td));
  }
  write_pooch_file(path, meta, g, data);
}

void save_model(const Model& m, const std::string& path,
                const std::map<std::string, std::span<const std::byte>, std::less<>>& weights) {
  const Graph& g = m.graph;
  Metadata meta;
  meta.set_string(meta_keys::kKind, "model");
  if (!m.spec_json.empty()) meta.set_string(meta_keys::kModelSpec, m.spec_json);
  if (!m.family.empty()) meta.set_string(meta_keys::kModelFamily, m.family);
  meta.set_string(meta_keys::kModelIo, io_to_json(m, g));
  meta.set_u64(meta_keys::kStep, 0);
  std::vector<TensorData> data;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const auto id = static_cast<TensorId>(t);
    const TensorDesc& d = g.tensor(id);
    if (d.role != Role::weight) continue;
    const auto it = weights.find(d.name);
    if (it == weights.end() || it->second.size() != d.bytes())
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cannot write '{}': weight '{}' ({} {}) {}", path, d.name,
                              dtype_name(d.dtype), shape_str(d.shape),
                              it == weights.end() ? "has no data"
                                                  : fmt::format("has {} bytes of data, not {}",
                                                                it->second.size(), d.bytes())));
    data.push_back({id, it->second.data(), it->second.size(), {}});
  }
  write_pooch_file(path, meta, g, data);
}

LoadedFile load_model_file(const std::string& path) {
  PoochFile f = read_pooch_file(path);
  LoadedFile out{std::move(f), nullptr, false, {}, false, {}};
  const Metadata& meta = out.file.metadata();
  if (meta.has(meta_keys::kModelSpec)) {
    out.spec = spec_from_json(meta.get_string(meta_keys::kModelSpec), path + " (model.spec)");
    out.has_spec = true;
  }
  if (meta.has(meta_keys::kModelIo))
    out.model = model_from_io(out.file, meta.get_string(meta_keys::kModelIo));
  else if (out.has_spec)
    out.model = build_model(out.spec);  // written before model.io: an xmc model
  else
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: not a pooch model or checkpoint (no '{}' or '{}' metadata)", path,
                            meta_keys::kModelIo, meta_keys::kModelSpec));
  out.checkpoint = meta.has(meta_keys::kKind) && meta.get_string(meta_keys::kKind) == "checkpoint";
  if (out.checkpoint && meta.has(meta_keys::kOptimizer))
    out.optimizer = optimizer_from_json(meta.get_string(meta_keys::kOptimizer), path);
  return out;
}

namespace {

// The width an index tensor addresses (the input of the fixed fan-in layer it
// feeds, fused or not), or -1 when it feeds none. Kernels trust index values, so values
// from a file are checked against it before they reach the arena.
int64_t index_bound(const Graph& g, TensorId t) {
  for (const Node& n : g.nodes())
    if ((n.op == "ffi_linear" || n.op == "ffi_loss" || n.op == "ffi_topk") && n.inputs.size() > 1 &&
        n.inputs[1] == t)
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

void restore_tensors(Session& s, const PoochFile& f, bool with_state, std::string_view skip_prefix,
                     bool fresh_adapters) {
  const Graph& g = s.graph();
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (!carried(d.role, with_state)) continue;
    if (!skip_prefix.empty() && d.name.rfind(skip_prefix, 0) == 0) continue;
    // A constant the builder computes from the run shape (the gpt family's
    // pos.ids [batch, seq]) keeps the session's own value: the file's is for
    // the run shape it was written with, which a finetune may change.
    if (!d.trainable)
      if (const auto init = s.model().init.find(d.name);
          init != s.model().init.end() && init->second.kind == WeightInit::Kind::positions)
        continue;
    const TensorEntry* e = f.find(d.name);
    if (!e && fresh_adapters && is_lora_weight(d.name)) continue;
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
    s.write_tensor(d.name, bytes.data(), bytes.size());
  }
}

}  // namespace pooch
