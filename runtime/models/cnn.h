// The convolutional families, built as torchvision builds them: `resnet`
// (18 and 34 with basic blocks, 50, 101 and 152 with bottleneck blocks;
// torchvision's v1.5, the stride on the 3x3 convolution) and `vgg` (11, 13,
// 16, 19, with or without batch normalisation). Weight names are
// torchvision's state-dict names ("layer1.0.conv1.weight",
// "features.0.weight", "bn1.running_mean", ...) and their initial values
// follow torchvision's rules: convolutions Kaiming normal over fan-out
// (std √(2 / (O·KH·KW))), batch normalisation γ = 1, β = 0, running mean 0
// and variance 1; ResNet's fc PyTorch's default Linear (uniform ±1/√fan-in,
// weight and bias); VGG's linear layers normal(0, 0.01) with zero bias and
// its convolution biases zero.
//
// Inputs: batch.x f32[B, C, H, W], batch.class i32[B] (padding rows -1).
// Outputs: prediction f32[B, classes] (logits) and loss (softmax
// cross-entropy over the class ids, averaged over the counted rows).
#pragma once
#include <memory>

#include "model.h"
#include "model_spec.h"

namespace pooch {

std::unique_ptr<Model> build_resnet_model(const ModelSpec& spec);
std::unique_ptr<Model> build_vgg_model(const ModelSpec& spec);

}  // namespace pooch
