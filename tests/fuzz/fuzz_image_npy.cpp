// libFuzzer target: image sets for the convolutional models (apps/image_data.cpp
// over apps/npy.cpp): a .npy file read as images (uint8 NxHxWxC or float32
// NxCxHxW), then per-channel statistics, normalisation and a crop-and-flip
// augmentation of the first image, as `pooch-run train` does with them.
#include "apps/image_data.h"
#include "apps/npy.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pooch_fuzz::input_path(".npy");
  pooch_fuzz::write_input(path, data, size);
  cli::NpyArray a;
  std::string error;
  if (!cli::read_npy(path, &a, &error)) return 0;
  std::vector<float> x;
  cli::ImageShape s;
  if (!cli::images_from_npy(a, &x, &s, &error)) {
    if (error.empty()) pooch_fuzz::finding("images_from_npy refused an array without saying why");
    return 0;
  }
  if (s.size() <= 0 || x.size() % static_cast<size_t>(s.size()) != 0)
    pooch_fuzz::finding("images_from_npy accepted images whose size does not divide the data");
  std::vector<double> mean, sd;
  cli::channel_stats(x, s, &mean, &sd);
  cli::normalize_images(x, s, mean, sd);
  if (!x.empty()) {
    std::vector<float> scratch;
    cli::augment_image(x.data(), s, cli::Augment{2, true}, 1, 0, 0, scratch);
  }
  return 0;
}
