// The gpt family's part of the model spec (model_spec.h: GptSpec): sizes by
// name, validation, and its JSON form. model_spec.cpp hands a spec whose
// family is "gpt" to these.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model_spec.h"

namespace pooch {

// Error POOCH_ERR_INVALID_ARG naming the field.
void validate_gpt_spec(const ModelSpec& s);
// Error POOCH_ERR_BAD_INPUT naming `source` and the field.
ModelSpec gpt_spec_from_json(const nlohmann::json& j, const std::string& source);
std::string gpt_spec_to_json(const ModelSpec& s);

// Sets the adapters' targets from "attn", "mlp" or "attn,mlp" (any case).
// Error POOCH_ERR_INVALID_ARG naming an unknown target.
void set_lora_targets(LoraSpec& l, const std::string& list);

}  // namespace pooch
