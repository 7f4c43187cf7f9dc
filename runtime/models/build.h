// Builds a model of any family that has a spec (xmc, mlp) from that spec.
#pragma once
#include <memory>

#include "model.h"
#include "model_spec.h"

namespace pooch {

std::unique_ptr<Model> build_model(const ModelSpec& spec);

}  // namespace pooch
