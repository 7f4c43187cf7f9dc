// LoRA adapters folded into their base weights (pooch-run merge-lora): a gpt
// model finetuned with adapters (model_spec.h, LoraSpec) becomes the plain
// model it computes, W' = W + (alpha/rank)·B·A for every adapted linear, so
// that it runs, exports and generates without the adapters' extra work.
#pragma once
#include <string>

namespace pooch {

struct LoraMergeReport {
  int64_t linears = 0;  // adapted linears folded
  int64_t rank = 0;     // their rank
  double scale = 0;     // alpha / rank
};

// Reads the model or checkpoint `in` (a gpt model with adapters), writes the
// merged model file `out` atomically. Errors name the file: POOCH_ERR_BAD_INPUT
// for a model without adapters or of another family. The merged linears are
// held in memory until the file is written (the rest is read from the
// mapped input): about 4 bytes per weight of the adapted linears.
LoraMergeReport merge_lora(const std::string& in, const std::string& out);

}  // namespace pooch
