// safetensors files (the format Hugging Face's `safetensors` package writes:
// an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and [begin, end) byte range in the data section, then the data
// section). The reader checks every header field against the file before a
// byte of tensor data is used: it never trusts the file, and it reads one
// tensor at a time (pread), never the whole file, so a checkpoint larger than
// memory can be converted tensor by tensor. The writer is atomic (a temporary
// file renamed into place, formats/file_io). docs/FORMAT.md "safetensors"
// lists the rules the reader enforces.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pooch::safetensors {

// The dtypes of the safetensors spec. Tensors of any of them are parsed and
// can be read as bytes; read_f32 converts the float ones.
enum class DType {
  BOOL,
  U8,
  I8,
  U16,
  I16,
  F16,
  BF16,
  U32,
  I32,
  F32,
  U64,
  I64,
  F64,
  F8_E4M3,
  F8_E5M2
};

const char* dtype_name(DType t);  // "F32", as in the header
size_t dtype_size(DType t);       // bytes per element

// Limits the reader enforces (those of the reference implementation where it has one).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the safetensors crate
inline constexpr size_t kMaxRank = 16;
inline constexpr size_t kMaxNameBytes = 4096;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  uint64_t elements() const;
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  uint64_t header_bytes = 0;        // the JSON header's length (the file's first 8 bytes)
  uint64_t data_start = 0;          // 8 + header_bytes: where the data section starts in the file
  uint64_t data_bytes = 0;          // the data section's length
  std::vector<TensorInfo> tensors;  // in data order (ascending begin)
  std::map<std::string, std::string> metadata;  // "__metadata__" (string to string)
  const TensorInfo* find(std::string_view name) const;
};

// Parses and checks a header. `json` is the header's bytes (they follow the
// 8-byte length in the file), `file_size` the whole file's size. Every
// problem is Error(POOCH_ERR_BAD_INPUT) naming `source`, the tensor, the
// field and the byte offset in the file where the problem lies.
Header parse_header(std::string_view json, uint64_t file_size, const std::string& source);

// A whole file held in memory (what the fuzz target calls): the length
// prefix, then parse_header. The tensors' bytes are data + data_start + begin.
Header parse_buffer(const void* data, size_t size, const std::string& source);

// Reads a file tensor by tensor. The constructor reads and checks the header
// alone; read() preads one tensor's bytes.
class Reader {
 public:
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  // The tensor `name`, or Error(POOCH_ERR_BAD_INPUT) naming the file and tensor.
  const TensorInfo& at(std::string_view name) const;

  // Copies t.bytes() bytes of `t` into dst.
  void read(const TensorInfo& t, void* dst) const;
  // The tensor's elements as float32 (F32, F16, BF16 and F64 tensors;
  // others are refused naming the dtype).
  std::vector<float> read_f32(const TensorInfo& t) const;

 private:
  std::string path_;
  int fd_ = -1;
  Header header_;
};

// One tensor to write: `data` holds elements(shape) values of `dtype`,
// little-endian.
struct TensorOut {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` (in the order given) and `metadata` to `path` atomically.
// The header is padded with spaces to a multiple of 8 bytes, as the Python
// package does, so the data section starts aligned. Names must be unique and
// not "__metadata__" (Error POOCH_ERR_INVALID_ARG).
void write_file(const std::string& path, const std::vector<TensorOut>& tensors,
                const std::map<std::string, std::string>& metadata = {});

// IEEE half and bfloat16 to float (exact).
float half_to_f32(uint16_t h);
float bf16_to_f32(uint16_t b);

}  // namespace pooch::safetensors
