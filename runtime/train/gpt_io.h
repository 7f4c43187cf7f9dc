// GPT-2 checkpoints of other programs in and out of pooch model files:
// import reads a Hugging Face directory or an llm.c gpt2_*.bin
// (formats/gpt_checkpoint) into the weights of a gpt model and writes it as a
// .pooch model file; export writes a model file's gpt weights as a Hugging
// Face directory (config.json + model.safetensors).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "../../formats/gpt_checkpoint.h"
#include "../models/model.h"

namespace pooch {

// Builds the gpt model of a config (the family's builder; a parameter so
// that this layer does not fix the spec's form).
using GptBuilder = std::function<std::unique_ptr<Model>(const gpt_ckpt::GptConfig&)>;

// Reads `from` (an HF directory when it holds config.json, else an llm.c
// file), builds the model and writes it to `out`. Every weight of the model
// must come from the checkpoint with the same shape, and every weight of the
// checkpoint must be used (Error POOCH_ERR_BAD_INPUT naming the tensor).
gpt_ckpt::GptConfig import_gpt(const std::string& from, const std::string& out,
                               const GptBuilder& build);

// The GPT-2 config of a pooch gpt model file: sizes from its weights' shapes,
// the head count (and layer-norm epsilon) from its spec's "n_head"
// ("layer_norm_epsilon") field.
gpt_ckpt::GptConfig gpt_config_of(const std::string& model_path);

// Writes model `model_path`'s weights to `dir` in the HF layout.
gpt_ckpt::GptConfig export_gpt(const std::string& model_path, const std::string& dir);

}  // namespace pooch
