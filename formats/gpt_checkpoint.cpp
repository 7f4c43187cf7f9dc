#include "formats/gpt_checkpoint.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "formats/file_check.h"
#include "formats/file_io.h"
#include "formats/safetensors.h"
#include "runtime/core/error.h"

namespace pooch::gpt_ckpt {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int64_t kMaxSize = int64_t{1} << 24;  // any one dimension of a config

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

// Conv1D weights: stored [in, out] by HF, [out, in] by pooch.
bool is_conv1d(const std::string& name) {
  const auto ends = [&](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends("attn.c_attn.weight") || ends("attn.c_proj.weight") || ends("mlp.c_fc.weight") ||
         ends("mlp.c_proj.weight");
}

std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
  return t;
}

int64_t get_int(const json& j, const char* key, const std::string& source, bool required = true) {
  if (!j.contains(key)) {
    if (required) bad(source, fmt::format("field '{}' is missing", key));
    return 0;
  }
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > kMaxSize)
    bad(source, fmt::format("field '{}' is {}, not an integer in [1, {}]", key,
                            v.dump().substr(0, 32), kMaxSize));
  return v.get<int64_t>();
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> w = {{"wte.weight", {c.vocab_size, C}},
                                                                 {"wpe.weight", {c.n_ctx, C}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    w.push_back({p + "ln_1.weight", {C}});
    w.push_back({p + "ln_1.bias", {C}});
    w.push_back({p + "attn.c_attn.weight", {3 * C, C}});
    w.push_back({p + "attn.c_attn.bias", {3 * C}});
    w.push_back({p + "attn.c_proj.weight", {C, C}});
    w.push_back({p + "attn.c_proj.bias", {C}});
    w.push_back({p + "ln_2.weight", {C}});
    w.push_back({p + "ln_2.bias", {C}});
    w.push_back({p + "mlp.c_fc.weight", {4 * C, C}});
    w.push_back({p + "mlp.c_fc.bias", {4 * C}});
    w.push_back({p + "mlp.c_proj.weight", {C, 4 * C}});
    w.push_back({p + "mlp.c_proj.bias", {C}});
  }
  w.push_back({"ln_f.weight", {C}});
  w.push_back({"ln_f.bias", {C}});
  return w;
}

void validate(const GptConfig& c, const std::string& source) {
  const std::pair<const char*, int64_t> f[] = {{"n_layer", c.n_layer},
                                               {"n_head", c.n_head},
                                               {"n_embd", c.n_embd},
                                               {"n_positions", c.n_ctx},
                                               {"vocab_size", c.vocab_size}};
  for (const auto& [name, v] : f)
    if (v <= 0 || v > kMaxSize)
      bad(source, fmt::format("'{}' is {}, not in [1, {}]", name, v, kMaxSize));
  if (c.n_embd % c.n_head != 0)
    bad(source, fmt::format("'n_embd' {} is not a multiple of 'n_head' {}", c.n_embd, c.n_head));
  if (!(c.layer_norm_epsilon > 0 && c.layer_norm_epsilon < 1))
    bad(source, fmt::format("'layer_norm_epsilon' is {}, not in (0, 1)", c.layer_norm_epsilon));
}

GptConfig parse_hf_config(std::string_view text, const std::string& source) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    bad(source, fmt::format("does not parse as JSON at byte {}: {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    bad(source, fmt::format("does not parse as JSON: {}", e.what()));
  }
  if (!j.is_object()) bad(source, "is not a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    bad(source, fmt::format("field 'model_type' is {}; pooch imports GPT-2 models (\"gpt2\")",
                            j["model_type"].dump().substr(0, 40)));
  GptConfig c;
  c.n_layer = get_int(j, "n_layer", source);
  c.n_head = get_int(j, "n_head", source);
  c.n_embd = get_int(j, "n_embd", source);
  c.vocab_size = get_int(j, "vocab_size", source);
  c.n_ctx =
      j.contains("n_positions") ? get_int(j, "n_positions", source) : get_int(j, "n_ctx", source);
  if (j.contains("layer_norm_epsilon")) {
    if (!j["layer_norm_epsilon"].is_number())
      bad(source, "field 'layer_norm_epsilon' is not a number");
    c.layer_norm_epsilon = j["layer_norm_epsilon"].get<double>();
  }
  // What pooch's gpt family does not compute is refused, not ignored: a
  // model imported with another activation would load and be wrong.
  if (j.contains("activation_function") && j["activation_function"] != "gelu_new")
    bad(source, fmt::format("field 'activation_function' is {}; pooch's gpt uses GPT-2's tanh "
                            "GELU (\"gelu_new\")",
                            j["activation_function"].dump().substr(0, 40)));
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != json(4 * c.n_embd))
    bad(source, fmt::format("field 'n_inner' is {}; pooch's gpt has an MLP of 4 * n_embd = {}",
                            j["n_inner"].dump().substr(0, 40), 4 * c.n_embd));
  for (const char* flag : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"})
    if (j.contains(flag) && j[flag] == true)
      bad(source, fmt::format("field '{}' is true; pooch's gpt does not do that", flag));
  if (j.contains("scale_attn_weights") && j["scale_attn_weights"] == false)
    bad(source, "field 'scale_attn_weights' is false; pooch's gpt scales by 1/sqrt(head size)");
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == false)
    bad(source, "field 'tie_word_embeddings' is false; pooch's gpt ties the output layer to wte");
  validate(c, source);
  return c;
}

std::string hf_config_json(const GptConfig& c) {
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"activation_function", "gelu_new"},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_embd", c.n_embd},
            {"n_positions", c.n_ctx},
            {"n_ctx", c.n_ctx},
            {"vocab_size", c.vocab_size},
            {"layer_norm_epsilon", c.layer_norm_epsilon},
            {"n_inner", nullptr},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"},
            {"use_cache", true}};
  return j.dump(2) + "\n";
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

GptConfig read_hf(const std::string& dir, const WeightSink& sink) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  file_io::MapOptions o;
  o.use_mmap = false;
  o.what = "a Hugging Face config.json";
  GptConfig c;
  {
    const file_io::MappedFile f(cfg_path, o);
    c = parse_hf_config(f.bytes(), cfg_path);
  }
  const std::string st_path = (fs::path(dir) / "model.safetensors").string();
  const safetensors::Reader r(st_path);
  // save_pretrained writes "transformer."-prefixed keys; the hub's original
  // gpt2 files have none. Either is accepted, not both.
  const bool prefixed = r.find("transformer.wte.weight") != nullptr;
  const std::string prefix = prefixed ? "transformer." : "";
  std::set<std::string> used;
  std::vector<float> wte;  // kept to compare a stored lm_head with
  for (const auto& [name, shape] : weight_shapes(c)) {
    const std::string key = prefix + name;
    const safetensors::TensorInfo* t = r.find(key);
    if (!t)
      bad(st_path,
          fmt::format("tensor '{}' is missing (config.json says {} layers)", key, c.n_layer));
    std::vector<int64_t> want = shape;
    if (is_conv1d(name)) std::swap(want[0], want[1]);
    if (t->shape != want)
      bad(st_path, fmt::format("tensor '{}' has shape {}, but config.json implies {}", key,
                               json(t->shape).dump(), json(want).dump()));
    Weight w{name, shape, r.read_f32(*t)};
    if (is_conv1d(name)) w.data = transpose(w.data, want[0], want[1]);
    if (name == "wte.weight") wte = w.data;
    used.insert(key);
    sink(std::move(w));
  }
  for (const safetensors::TensorInfo& t : r.header().tensors) {
    if (used.count(t.name)) continue;
    const std::string& n = t.name;
    // The causal-mask buffers older transformers saved are not weights.
    if (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) continue;
    if (n == "lm_head.weight") {
      if (t.shape != std::vector<int64_t>{c.vocab_size, c.n_embd} || r.read_f32(t) != wte)
        bad(st_path,
            "tensor 'lm_head.weight' differs from wte: pooch's gpt ties the output "
            "layer to the token embedding");
      continue;
    }
    bad(st_path, fmt::format("tensor '{}' is not a GPT-2 weight pooch knows", n));
  }
  return c;
}

GptConfig read_llmc(const std::string& path, const WeightSink& sink) {
  struct stat st {};
  file_io::Fd f(file_check::open_regular(path, "an llm.c model file (gpt2_*.bin)", &st));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 1024)
    bad(path, fmt::format("the file has {} bytes, fewer than the 1024-byte header of an llm.c "
                          "model",
                          size));
  int32_t h[256];
  if (!file_io::pread_full(f.fd, h, sizeof h, 0))
    throw Error(POOCH_ERR_IO, fmt::format("cannot read the header of '{}': {}", path,
                                          file_io::errno_text(errno ? errno : EIO)));
  if (h[0] != kLlmcModelMagic)
    bad(path, fmt::format("field 'magic' (bytes 0-3) is {}, not {}{}", h[0], kLlmcModelMagic,
                          h[0] == 20240520 ? " (this is a token file, not a model)" : ""));
  const int32_t version = h[1];
  if (version != 1 && version != 3 && version != 5)
    bad(path, fmt::format("field 'version' (bytes 4-7) is {}; pooch reads versions 1 and 3 "
                          "(float32) and 5 (bfloat16)",
                          version));
  const char* names[] = {"max_seq_len", "vocab_size", "num_layers",
                         "num_heads",   "channels",   "padded_vocab_size"};
  for (int k = 2; k <= (version == 1 ? 6 : 7); ++k)
    if (h[k] <= 0 || h[k] > kMaxSize)
      bad(path, fmt::format("field '{}' (bytes {}-{}) is {}, not in [1, {}]", names[k - 2], 4 * k,
                            4 * k + 3, h[k], kMaxSize));
  GptConfig c;
  c.n_ctx = h[2];
  c.vocab_size = h[3];
  c.n_layer = h[4];
  c.n_head = h[5];
  c.n_embd = h[6];
  validate(c, path);
  const int64_t Vp = version == 1 ? c.vocab_size : h[7];
  if (Vp < c.vocab_size)
    bad(path, fmt::format("field 'padded_vocab_size' (bytes 28-31) is {}, less than vocab_size {}",
                          Vp, c.vocab_size));
  const int64_t L = c.n_layer, C = c.n_embd, T = c.n_ctx;
  const uint64_t esize = version == 5 ? 2 : 4;
  // llm.c's parameter tensors in file order, each stacked over the layers.
  struct Part {
    const char* suffix;  // pooch name after "h.{i}." ("" for wte, wpe, ln_f.*)
    int64_t per_layer;   // elements per layer (or in all, for the unstacked ones)
    bool stacked;
  };
  const Part parts[] = {{"wte.weight", Vp * C, false},
                        {"wpe.weight", T * C, false},
                        {"ln_1.weight", C, true},
                        {"ln_1.bias", C, true},
                        {"attn.c_attn.weight", 3 * C * C, true},
                        {"attn.c_attn.bias", 3 * C, true},
                        {"attn.c_proj.weight", C * C, true},
                        {"attn.c_proj.bias", C, true},
                        {"ln_2.weight", C, true},
                        {"ln_2.bias", C, true},
                        {"mlp.c_fc.weight", 4 * C * C, true},
                        {"mlp.c_fc.bias", 4 * C, true},
                        {"mlp.c_proj.weight", 4 * C * C, true},
                        {"mlp.c_proj.bias", C, true},
                        {"ln_f.weight", C, false},
                        {"ln_f.bias", C, false}};
  uint64_t total = 0;
  for (const Part& p : parts) total += static_cast<uint64_t>(p.per_layer * (p.stacked ? L : 1));
  const uint64_t want = 1024 + total * esize;
  if (size != want)
    bad(path, fmt::format("the header's sizes (vocab {} padded to {}, {} layers, {} channels, "
                          "context {}) take {} bytes of {} parameters, but the file has {} ({})",
                          c.vocab_size, Vp, L, C, T, want, version == 5 ? "bfloat16" : "float32",
                          size, size < want ? "it is cut short" : "bytes follow the parameters"));
  const auto shapes = weight_shapes(c);
  auto shape_of = [&](const std::string& name) {
    for (const auto& [n, s] : shapes)
      if (n == name) return s;
    POOCH_CHECK(false, "(every llm.c tensor has a pooch name)");
    return std::vector<int64_t>{};
  };
  auto read_at = [&](uint64_t offset, int64_t n, const std::string& what) {
    std::vector<float> out(static_cast<size_t>(n));
    bool ok;
    if (esize == 4) {
      ok = file_io::pread_full(f.fd, out.data(), static_cast<size_t>(n) * 4, offset);
    } else {
      std::vector<uint16_t> raw(static_cast<size_t>(n));
      ok = file_io::pread_full(f.fd, raw.data(), static_cast<size_t>(n) * 2, offset);
      for (size_t i = 0; ok && i < raw.size(); ++i) out[i] = safetensors::bf16_to_f32(raw[i]);
    }
    if (!ok)
      throw Error(
          POOCH_ERR_IO,
          fmt::format("cannot read {} of '{}' at byte {}: {}", what, path, offset,
                      errno ? file_io::errno_text(errno) : "the file shrank while reading"));
    return out;
  };
  // Offsets of each part; then the weights in pooch's order (embeddings,
  // block by block, ln_f), one tensor in memory at a time.
  std::vector<uint64_t> off;
  uint64_t pos = 1024;
  for (const Part& p : parts) {
    off.push_back(pos);
    pos += static_cast<uint64_t>(p.per_layer * (p.stacked ? L : 1)) * esize;
  }
  // wte: the first vocab_size rows (the padding rows are not tokens).
  sink({"wte.weight", {c.vocab_size, C}, read_at(off[0], c.vocab_size * C, "wte")});
  sink({"wpe.weight", {T, C}, read_at(off[1], T * C, "wpe")});
  for (int64_t i = 0; i < L; ++i)
    for (size_t k = 2; k < 14; ++k) {
      const std::string name = fmt::format("h.{}.{}", i, parts[k].suffix);
      sink({name, shape_of(name),
            read_at(off[k] + static_cast<uint64_t>(i * parts[k].per_layer) * esize,
                    parts[k].per_layer, name)});
    }
  sink({"ln_f.weight", {C}, read_at(off[14], C, "ln_f.weight")});
  sink({"ln_f.bias", {C}, read_at(off[15], C, "ln_f.bias")});
  return c;
}

void write_hf(const std::string& dir, const GptConfig& c,
              const std::function<std::vector<float>(const std::string& name)>& get) {
  validate(c, dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(POOCH_ERR_IO,
                fmt::format("cannot create the directory '{}': {}", dir, ec.message()));
  // One tensor in memory at a time: each is fetched, transposed where HF
  // wants [in, out], and written before the next.
  const auto shapes = weight_shapes(c);
  std::vector<safetensors::TensorOut> out;
  for (const auto& [name, shape] : shapes) {
    std::vector<int64_t> s = shape;
    if (is_conv1d(name)) std::swap(s[0], s[1]);
    out.push_back({"transformer." + name, safetensors::DType::F32, s, nullptr});
  }
  safetensors::write_file_streaming((fs::path(dir) / "model.safetensors").string(), out,
                                    [&](size_t i, std::byte* dst) {
                                      const auto& [name, shape] = shapes[i];
                                      std::vector<float> v = get(name);
                                      int64_t n = 1;
                                      for (int64_t d : shape) n *= d;
                                      POOCH_CHECK(static_cast<int64_t>(v.size()) == n,
                                                  "(a weight has its shape's size)");
                                      if (is_conv1d(name)) v = transpose(v, shape[0], shape[1]);
                                      std::memcpy(dst, v.data(), v.size() * 4);
                                    },
                                    {{"format", "pt"}});
  file_io::AtomicFile cfg((fs::path(dir) / "config.json").string());
  cfg.write(hf_config_json(c));
  cfg.commit();
}

}  // namespace pooch::gpt_ckpt
