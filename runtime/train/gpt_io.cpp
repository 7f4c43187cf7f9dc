#include "gpt_io.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../../formats/pooch_file.h"
#include "../../formats/scratch_file.h"
#include "../core/error.h"
#include "model_io.h"

namespace pooch {

gpt_ckpt::GptConfig import_gpt(const std::string& from, const std::string& out,
                               const GptBuilder& build) {
  // Each converted weight goes to a scratch file beside `out` as it comes,
  // so one tensor at a time is in memory, whatever the model's size.
  const size_t slash = out.find_last_of('/');
  file_io::ScratchFile scratch(slash == std::string::npos ? "." : out.substr(0, slash + 1),
                               "the imported weights");
  std::map<std::string, std::pair<uint64_t, size_t>> where;
  std::map<std::string, std::vector<int64_t>> shapes;
  auto sink = [&](gpt_ckpt::Weight&& w) {
    where[w.name] = {scratch.append(w.data.data(), w.data.size() * 4), w.data.size() * 4};
    shapes[w.name] = w.shape;
  };
  const gpt_ckpt::GptConfig cfg =
      gpt_ckpt::is_hf_dir(from) ? gpt_ckpt::read_hf(from, sink) : gpt_ckpt::read_llmc(from, sink);
  const std::unique_ptr<Model> m = build(cfg);
  std::set<std::string> used;
  std::map<std::string, std::vector<std::byte>> constants;
  for (size_t t = 0; t < m->graph.num_tensors(); ++t) {
    const TensorDesc& d = m->graph.tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight) continue;
    // A constant of the builder's own (the gpt family's pos.ids, each
    // token's position) is in no checkpoint: it keeps its initial value.
    if (const auto init = m->init.find(d.name); !d.trainable && init != m->init.end()) {
      constants[d.name] = initial_value(d, init->second, m->seed);
      continue;
    }
    const auto it = shapes.find(d.name);
    if (it == shapes.end())
      throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: has no weight for the model's '{}' {}",
                                                   from, d.name, shape_str(d.shape)));
    if (d.dtype != DType::f32 || Shape(it->second) != d.shape)
      throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: weight '{}' is {} but the model's is {} {}",
                                                   from, d.name, shape_str(Shape(it->second)),
                                                   dtype_name(d.dtype), shape_str(d.shape)));
    used.insert(d.name);
  }
  for (const auto& [name, s] : shapes)
    if (!used.count(name))
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: weight '{}' has no place in the model built from its config",
                              from, name));
  scratch.map();
  std::map<std::string, std::span<const std::byte>, std::less<>> weights;
  for (const auto& [name, at] : where) weights[name] = scratch.bytes(at.first, at.second);
  for (const auto& [name, bytes] : constants) weights[name] = std::span<const std::byte>(bytes);
  save_model(*m, out, weights);
  return cfg;
}

gpt_ckpt::GptConfig gpt_config_of(const std::string& model_path) {
  const PoochFile f = read_pooch_file(model_path);
  auto shape = [&](const std::string& name) {
    const TensorEntry* e = f.find(name);
    if (!e || e->dtype != DType::f32)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: has no float32 weight '{}': not a gpt model", model_path, name));
    return e->shape;
  };
  gpt_ckpt::GptConfig c;
  const Shape wte = shape("wte.weight"), wpe = shape("wpe.weight");
  c.vocab_size = wte.at(0);
  c.n_embd = wte.at(1);
  c.n_ctx = wpe.at(0);
  while (f.find(fmt::format("h.{}.ln_1.weight", c.n_layer))) ++c.n_layer;
  // The head count is not in any shape: the spec says it.
  const Metadata& meta = f.metadata();
  nlohmann::json spec;
  if (meta.has(meta_keys::kModelSpec)) {
    try {
      spec = nlohmann::json::parse(meta.get_string(meta_keys::kModelSpec));
    } catch (const nlohmann::json::exception&) {
    }
  }
  const nlohmann::json* s = &spec;
  if (spec.is_object() && spec.contains("gpt") && spec["gpt"].is_object()) s = &spec["gpt"];
  if (!s->is_object() || !s->contains("n_head") || !(*s)["n_head"].is_number_integer())
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: its model spec has no 'n_head': not a gpt model", model_path));
  c.n_head = (*s)["n_head"].get<int64_t>();
  // Hugging Face's GPT2LMHeadModel has no adapters: exporting the base
  // weights alone would lose the finetuning without a word.
  if (s->contains("lora"))
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: has LoRA adapters; fold them into the weights first "
                            "(pooch-run merge-lora --model {} --out MERGED.pooch)",
                            model_path, model_path));
  if (s->contains("layer_norm_epsilon") && (*s)["layer_norm_epsilon"].is_number())
    c.layer_norm_epsilon = (*s)["layer_norm_epsilon"].get<double>();
  gpt_ckpt::validate(c, model_path);
  for (const auto& [name, want] : gpt_ckpt::weight_shapes(c))
    if (shape(name) != Shape(want))
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: weight '{}' is {}, not the {} of a GPT-2 of its sizes",
                              model_path, name, shape_str(shape(name)), shape_str(Shape(want))));
  return c;
}

gpt_ckpt::GptConfig export_gpt(const std::string& model_path, const std::string& dir) {
  const gpt_ckpt::GptConfig c = gpt_config_of(model_path);
  const PoochFile f = read_pooch_file(model_path);
  gpt_ckpt::write_hf(dir, c, [&](const std::string& name) {
    const auto bytes = f.data(*f.find(name));
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  });
  return c;
}

}  // namespace pooch
