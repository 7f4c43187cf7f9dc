// A small, strict reader and writer of NumPy .npy files (format versions 1,
// 2 and 3), for the dense data of pooch-run: little-endian float32, float64,
// int32 and int64 arrays in C order. Everything else is refused with a
// message that names the file and says what was found.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cli {

enum class NpyType { f32, f64, i32, i64, u8 };  // u8: images (read only)

const char* npy_type_name(NpyType t);  // "float32", ...

struct NpyArray {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // product(shape) elements of `type`, little-endian

  int64_t elements() const;
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  // Elements per row: the product of the dimensions after the first (1 for 1-D).
  int64_t row_width() const;
  bool is_float() const { return type == NpyType::f32 || type == NpyType::f64; }
};

// "(1000, 8)"
std::string npy_shape_str(const std::vector<int64_t>& shape);

// Reads `path`. On failure returns false with *error "<path>: <what is wrong>".
bool read_npy(const std::string& path, NpyArray* out, std::string* error);

// The elements as float32 (float64 narrowed); the array must be a float array.
std::vector<float> npy_as_f32(const NpyArray& a);
// The elements as int64; the array must be an integer array.
std::vector<int64_t> npy_as_i64(const NpyArray& a);

// Writes a float32 or int32 array in format version 1.0, atomically (a
// temporary file beside `path`, renamed into place). `data` holds
// product(shape) elements. On failure returns false with *error.
bool write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data, std::string* error);

}  // namespace cli
