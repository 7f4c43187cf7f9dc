// Image sets for the convolutional models (resnet, vgg) in pooch-run: .npy
// arrays of uint8 N×H×W×C (pixels 0..255, the usual way images are stored)
// or float32 N×C×H×W (already prepared), per-channel normalisation, and
// random crop and flip augmentation on the host, deterministic per seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "npy.h"

namespace cli {

// C×H×W of one image; c == 0: the set is not images.
struct ImageShape {
  int64_t c = 0, h = 0, w = 0;
  int64_t pixels() const { return h * w; }
  int64_t size() const { return c * h * w; }
};

// A rank-4 array as float32 N×C×H×W: uint8 N×H×W×C is transposed and scaled
// to [0, 1]; float32 (or float64) N×C×H×W is taken as it is. False with
// *error naming the layout it needs.
bool images_from_npy(const NpyArray& a, std::vector<float>* x, ImageShape* shape,
                     std::string* error);

// Per-channel mean and standard deviation (population) over every image.
void channel_stats(const std::vector<float>& x, const ImageShape& s, std::vector<double>* mean,
                   std::vector<double>* std);

// x ← (x − mean[c]) / std[c] for every image.
void normalize_images(std::vector<float>& x, const ImageShape& s, const std::vector<double>& mean,
                      const std::vector<double>& std);

// Host augmentation of one training image in place: a random crop of the
// image padded by `pad` zero pixels on every side (back to H×W) and, when
// `flip`, a horizontal flip with probability 1/2. The draws come from
// (seed, epoch, row) alone, so a run is repeatable whatever the batch order.
struct Augment {
  int pad = 0;
  bool flip = false;
  bool enabled() const { return pad > 0 || flip; }
};
void augment_image(float* img, const ImageShape& s, const Augment& a, uint64_t seed, uint64_t epoch,
                   uint64_t row, std::vector<float>& scratch);

}  // namespace cli
