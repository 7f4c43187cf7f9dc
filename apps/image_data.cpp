#include "image_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cli {

bool images_from_npy(const NpyArray& a, std::vector<float>* x, ImageShape* s, std::string* error) {
  if (a.shape.size() != 4) {
    *error = "images must be a 4-D array; it is " + npy_shape_str(a.shape);
    return false;
  }
  // An image needs a channel and a pixel (found by fuzz_image_npy: a set
  // shaped (4, 0, 4, 3) was taken for images of height 0).
  for (size_t d = 1; d < 4; ++d)
    if (a.shape[d] <= 0) {
      *error = "images need at least one channel, row and column; this array is " +
               npy_shape_str(a.shape);
      return false;
    }
  // One image's values must fit the models' 32-bit sizes, and the array must
  // hold an image (found by fuzz_image_npy: (0, 4, 2^63-1, 8) holds no data,
  // so the size check passed, and C×H×W overflowed).
  constexpr int64_t kMaxImageValues = 2147483647;
  if (a.shape[1] > kMaxImageValues / a.shape[2] ||
      a.shape[1] * a.shape[2] > kMaxImageValues / a.shape[3]) {
    *error =
        "one image may hold at most 2147483647 values; this array is " + npy_shape_str(a.shape);
    return false;
  }
  const int64_t N = a.shape[0];
  if (N == 0) {
    *error = "the image set holds no images: its shape is " + npy_shape_str(a.shape);
    return false;
  }
  if (a.type == NpyType::u8) {
    // N×H×W×C bytes -> N×C×H×W floats in [0, 1].
    *s = {a.shape[3], a.shape[1], a.shape[2]};
    x->resize(static_cast<size_t>(N * s->size()));
    const auto* p = reinterpret_cast<const uint8_t*>(a.data.data());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t y = 0; y < s->h; ++y)
        for (int64_t xx = 0; xx < s->w; ++xx)
          for (int64_t c = 0; c < s->c; ++c)
            (*x)[static_cast<size_t>(((n * s->c + c) * s->h + y) * s->w + xx)] =
                static_cast<float>(p[((n * s->h + y) * s->w + xx) * s->c + c]) * (1.0f / 255.0f);
    return true;
  }
  if (a.is_float()) {
    *s = {a.shape[1], a.shape[2], a.shape[3]};
    *x = npy_as_f32(a);
    return true;
  }
  *error = "images must be uint8 N×H×W×C or float32 N×C×H×W; this array is " +
           std::string(npy_type_name(a.type)) + " " + npy_shape_str(a.shape);
  return false;
}

void channel_stats(const std::vector<float>& x, const ImageShape& s, std::vector<double>* mean,
                   std::vector<double>* std) {
  const int64_t N = static_cast<int64_t>(x.size()) / std::max<int64_t>(1, s.size());
  mean->assign(static_cast<size_t>(s.c), 0.0);
  std->assign(static_cast<size_t>(s.c), 0.0);
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* p = x.data() + (n * s.c + c) * s.pixels();
      for (int64_t i = 0; i < s.pixels(); ++i) {
        sum += p[i];
        sq += static_cast<double>(p[i]) * p[i];
      }
    }
    const double cnt = static_cast<double>(std::max<int64_t>(1, N * s.pixels()));
    const double m = sum / cnt;
    (*mean)[static_cast<size_t>(c)] = m;
    // A constant channel keeps its scale (std 1) rather than divide by 0.
    const double var = std::max(0.0, sq / cnt - m * m);
    (*std)[static_cast<size_t>(c)] = var > 1e-12 ? std::sqrt(var) : 1.0;
  }
}

void normalize_images(std::vector<float>& x, const ImageShape& s, const std::vector<double>& mean,
                      const std::vector<double>& std) {
  const int64_t N = static_cast<int64_t>(x.size()) / std::max<int64_t>(1, s.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < s.c; ++c) {
      float* p = x.data() + (n * s.c + c) * s.pixels();
      const double m = mean[static_cast<size_t>(c)], inv = 1.0 / std[static_cast<size_t>(c)];
      for (int64_t i = 0; i < s.pixels(); ++i)
        p[i] = static_cast<float>((static_cast<double>(p[i]) - m) * inv);
    }
}

namespace {

// splitmix64 of the three keys: independent draws per (seed, epoch, row).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void augment_image(float* img, const ImageShape& s, const Augment& a, uint64_t seed, uint64_t epoch,
                   uint64_t row, std::vector<float>& scratch) {
  if (!a.enabled()) return;
  const uint64_t r = mix(mix(mix(seed) ^ epoch) ^ row);
  const int64_t span = 2 * a.pad + 1;
  const int64_t dy = a.pad ? static_cast<int64_t>(r % static_cast<uint64_t>(span)) - a.pad : 0;
  const int64_t dx =
      a.pad ? static_cast<int64_t>((r >> 16) % static_cast<uint64_t>(span)) - a.pad : 0;
  const bool flip = a.flip && ((r >> 40) & 1);
  scratch.assign(img, img + s.size());
  for (int64_t c = 0; c < s.c; ++c) {
    const float* src = scratch.data() + c * s.pixels();
    float* dst = img + c * s.pixels();
    for (int64_t y = 0; y < s.h; ++y)
      for (int64_t x = 0; x < s.w; ++x) {
        // Output pixel (y, x) reads the padded image at (y + dy, x + dx),
        // mirrored first when flipped.
        const int64_t sx = (flip ? s.w - 1 - x : x) + dx, sy = y + dy;
        dst[y * s.w + x] = sy >= 0 && sy < s.h && sx >= 0 && sx < s.w ? src[sy * s.w + sx] : 0.0f;
      }
  }
}

}  // namespace cli
