// The convolutional families' architecture fields (resnet, vgg), held in a
// ModelSpec beside the dense families' ones. JSON form (docs/CLI.md,
// "Convolutional models"):
//   {"family": "resnet", "depth": 50, "input": {"channels": 3, "height": 224,
//    "width": 224}, "classes": 1000, "width": 64, "stem": "imagenet",
//    "batch": 32, "topk": 5, "seed": 1}
//   {"family": "vgg", "depth": 16, ..., "batchnorm": false, "hidden": 4096,
//    "dropout": 0.5}
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pooch {

struct ModelSpec;

struct CnnSpec {
  int depth = 18;        // resnet: 18, 34, 50, 101, 152; vgg: 11, 13, 16, 19
  int64_t channels = 3;  // the image: C x H x W
  int64_t height = 224;
  int64_t width = 224;
  int64_t base_width = 64;  // the first stage's channels (torchvision: 64)
  // resnet: "imagenet" (7x7/2 convolution and 3x3/2 max pooling, torchvision's)
  // or "small" (one 3x3/1 convolution, for images of a few dozen pixels)
  std::string stem = "imagenet";
  bool batchnorm = false;  // vgg: a batch normalisation after each convolution
  int64_t hidden = 4096;   // vgg: the classifier's two hidden layers
  double dropout = 0.5;    // vgg: before each hidden layer's successor
  // "normalize": {"mean": [...], "std": [...]}: the per-channel statistics
  // the model's images are normalised with, x' = (x − mean[c]) / std[c]
  // (empty: none recorded). The graph does not apply them: they tell the
  // program that feeds the model (pooch-run) how its training images were
  // prepared, so evaluation and prediction prepare theirs the same way.
  std::vector<double> mean, std;
};

// Reads the convolutional fields of `text` (family already known) into `s`;
// errors (POOCH_ERR_BAD_INPUT) name `source` and the field.
void cnn_spec_from_json(const std::string& text, const std::string& source, ModelSpec& s);
std::string cnn_spec_to_json(const ModelSpec& s);
// Checks the fields (Error POOCH_ERR_INVALID_ARG naming the field).
void validate_cnn_spec(const ModelSpec& s);

}  // namespace pooch
