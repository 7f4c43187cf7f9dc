// GPT-2 checkpoints of other programs, converted to and from pooch's `gpt`
// weight names and layouts one tensor at a time:
//   - Hugging Face: a directory with config.json and model.safetensors, as
//     GPT2LMHeadModel.save_pretrained writes it. Conv1D weights (c_attn,
//     c_proj, c_fc) are stored [in, out]; pooch's linear is [out, in], so
//     they are transposed on the way in and back on the way out. The output
//     layer is tied to wte: an `lm_head.weight`, if present, must equal it.
//   - llm.c: gpt2_*.bin (a 256 x int32 header with magic 20240326, version 1
//     or 3 as float32, 5 as bfloat16, then every parameter stacked over the
//     layers; its matmul weights are [out, in] already and wte is padded to
//     a multiple of 128 rows, which are dropped).
// pooch's names are HF's state-dict keys without "transformer.": wte.weight
// [V, C], wpe.weight [T, C], h.{i}.ln_1.weight|bias [C],
// h.{i}.attn.c_attn.weight [3C, C] | bias [3C], h.{i}.attn.c_proj.weight
// [C, C] | bias [C], h.{i}.ln_2.weight|bias, h.{i}.mlp.c_fc.weight [4C, C] |
// bias [4C], h.{i}.mlp.c_proj.weight [C, 4C] | bias [C], ln_f.weight|bias.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pooch::gpt_ckpt {

struct GptConfig {
  int64_t n_layer = 0, n_head = 0, n_embd = 0;
  int64_t n_ctx = 0;  // HF's n_positions
  int64_t vocab_size = 0;
  double layer_norm_epsilon = 1e-5;
};

// One weight in pooch's name and layout (float32, row-major).
struct Weight {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using WeightSink = std::function<void(Weight&&)>;

// Every weight of a config, in a fixed order (embeddings, blocks, ln_f),
// with its pooch shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const GptConfig& c);

// Checks sizes against each other and against limits (Error
// POOCH_ERR_BAD_INPUT naming `source` and the field).
void validate(const GptConfig& c, const std::string& source);

// HF config.json: n_layer, n_head, n_embd, n_positions (or n_ctx),
// vocab_size, layer_norm_epsilon; refuses what pooch's gpt cannot run
// (another activation than GPT-2's gelu_new, n_inner other than 4 * n_embd,
// scale_attn_by_inverse_layer_idx, cross attention, untied embeddings),
// naming the field.
GptConfig parse_hf_config(std::string_view json, const std::string& source);
// The config.json GPT2LMHeadModel.from_pretrained reads (dropout 0).
std::string hf_config_json(const GptConfig& c);

// Reads an HF directory (config.json + model.safetensors) tensor by tensor:
// `sink` receives each pooch weight once, in weight_shapes order. Refuses a
// missing, misshapen or non-float tensor and an unknown one, naming the file
// and tensor. Returns the config.
GptConfig read_hf(const std::string& dir, const WeightSink& sink);

// Reads an llm.c gpt2_*.bin the same way. Every header field and the file's
// size are checked (naming the field and its bytes).
GptConfig read_llmc(const std::string& path, const WeightSink& sink);

// True when `path` is a directory holding config.json (an HF checkpoint);
// false for a file (an llm.c checkpoint is then assumed).
bool is_hf_dir(const std::string& path);

// Writes config.json and model.safetensors (HF layout: "transformer."
// prefix, Conv1D weights transposed, metadata format=pt, no lm_head: tied)
// into `dir` (created if missing). `get` returns a pooch weight's data by
// name (weight_shapes order and shapes).
void write_hf(const std::string& dir, const GptConfig& c,
              const std::function<std::vector<float>(const std::string& name)>& get);

}  // namespace pooch::gpt_ckpt
