// torchvision's convolutional networks in and out of pooch model files.
// Import reads a state dict saved as safetensors
// (safetensors.torch.save_file(torchvision.models.resnet50().state_dict(),
// path)), works out the family's spec from the tensors' names and shapes
// (or takes the fields a caller gives), builds the model with pooch's
// builder, whose weight names are torchvision's, and writes a .pooch model
// file, converting one tensor at a time. Export writes a resnet or vgg model
// file's weights back as such a state dict.
#pragma once
#include <string>

namespace pooch {

// The spec of the model `from` holds, as JSON: `given` (a JSON object, ""
// for none: family, depth, input, batch, normalize, ...) completed from the
// names and shapes (family: conv1.weight + fc.weight is a resnet,
// features.0.weight + classifier.0.weight a vgg; depth from the blocks or
// convolutions; width, input channels, stem, batchnorm, hidden size and
// classes from the shapes; the image 224x224, or for a vgg the size its
// classifier's input implies). Error POOCH_ERR_BAD_INPUT naming the file
// when the family cannot be told or the names fit no depth.
std::string infer_cnn_spec(const std::string& from, const std::string& given);

// Reads `from`, builds the model of infer_cnn_spec(from, given) and writes
// it to `out`. Every weight of the model (parameters and BN running
// statistics) must be in the file with its shape, and every tensor of the
// file must be a weight of the model, except BN's num_batches_tracked
// (torchvision's counter, used only when BN's momentum is None; pooch's is
// 0.1 as torchvision's): Error POOCH_ERR_BAD_INPUT naming the file and the
// first tensor, in the model's order, that is missing or of another shape,
// else the first tensor of the file the model has no place for. F32, F16,
// BF16 and F64 tensors are read (as float32). Returns the spec as JSON.
std::string import_cnn(const std::string& from, const std::string& given, const std::string& out);

// Writes the weights of resnet or vgg model file `model_path` as a
// torchvision-layout state dict in safetensors (float32; no
// num_batches_tracked: torchvision's load_state_dict adds it). Error
// POOCH_ERR_BAD_INPUT when the file is not a resnet or vgg model.
void export_cnn(const std::string& model_path, const std::string& out_file);

}  // namespace pooch
