// The dense multi-layer perceptron family: dense rows -> the spec's hidden
// layers -> a dense output layer -> mean squared error (regression) or
// softmax cross-entropy over class ids (classification).
//
// Inputs: batch.x f32[B, width]; regression: batch.y f32[B, outputs] and
// batch.row_weight f32[B] (a row mask the session fills); classification:
// batch.class i32[B] (padding rows -1, ignored). Outputs: prediction
// f32[B, outputs] (the output layer's values: logits for classification) and
// loss.
#pragma once
#include <memory>

#include "model.h"
#include "model_spec.h"

namespace pooch {

std::unique_ptr<Model> build_mlp_model(const ModelSpec& spec);

}  // namespace pooch
