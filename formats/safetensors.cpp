#include "formats/safetensors.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/file_check.h"
#include "formats/file_io.h"
#include "runtime/core/error.h"
#include "runtime/core/strict_json.h"

namespace pooch::safetensors {

// The format is little-endian; pooch runs on little-endian machines only.
static_assert(std::endian::native == std::endian::little);

namespace {

using json = nlohmann::json;

struct DTypeName {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},           {DType::I8, "I8", 1},
    {DType::U16, "U16", 2},   {DType::I16, "I16", 2},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::U32, "U32", 4},         {DType::I32, "I32", 4},
    {DType::F32, "F32", 4},   {DType::U64, "U64", 8},         {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

// Where the header mentions `name` as a key: the file offset of its first
// quoted occurrence (8 + its index in the header), for messages. Names with
// JSON escapes are not found; the header's start is given then.
uint64_t key_offset(std::string_view json_text, const std::string& name) {
  const std::string quoted = "\"" + name + "\"";
  const size_t at = json_text.find(quoted);
  return 8 + (at == std::string_view::npos ? 0 : at);
}

// A header that names a tensor twice is refused (runtime/core/strict_json.h).
json parse_json_strict(std::string_view text, const std::string& source) {
  std::string dup;
  json j;
  try {
    j = parse_json_noting_repeats(text, &dup);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 within the header; the header starts at file byte 8.
    bad(source, fmt::format("the JSON header (bytes 8 to {}) does not parse at byte {}: {}",
                            8 + text.size(), 8 + (e.byte > 0 ? e.byte - 1 : 0), e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    bad(source, fmt::format("the JSON header (bytes 8 to {}) does not parse: {}", 8 + text.size(),
                            e.what()));
  }
  if (!dup.empty())
    bad(source, fmt::format("the header names '{}' twice (byte {})", dup, key_offset(text, dup)));
  return j;
}

DType parse_dtype(const json& v, const std::string& source, const std::string& tensor,
                  uint64_t at) {
  if (!v.is_string())
    bad(source, fmt::format("tensor '{}' (header byte {}): field 'dtype' is {}, not a string",
                            tensor, at, v.type_name()));
  const std::string s = v.get<std::string>();
  for (const DTypeName& d : kDTypes)
    if (s == d.name) return d.t;
  bad(source, fmt::format("tensor '{}' (header byte {}): field 'dtype' is '{}', which is not a "
                          "safetensors dtype (F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, "
                          "U16, U8, BOOL, F8_E4M3, F8_E5M2)",
                          tensor, at, s.substr(0, 64)));
}

// product(shape) * size, or false when it does not fit in 64 bits.
bool checked_bytes(const std::vector<int64_t>& shape, size_t size, uint64_t* out) {
  uint64_t n = size;
  for (int64_t d : shape) {
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && n > UINT64_MAX / u) return false;
    n *= u;
  }
  *out = n;
  return true;
}

TensorInfo parse_tensor(const std::string& name, const json& v, uint64_t data_bytes,
                        std::string_view text, const std::string& source) {
  const uint64_t at = key_offset(text, name);
  auto fail = [&](const std::string& what) -> void {
    bad(source, fmt::format("tensor '{}' (header byte {}): {}", name, at, what));
  };
  if (name.empty()) fail("a tensor name is empty");
  if (name.size() > kMaxNameBytes)
    fail(fmt::format("the name is {} bytes, more than the {} allowed", name.size(), kMaxNameBytes));
  if (!v.is_object()) fail(fmt::format("the entry is {}, not an object", v.type_name()));
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      fail(fmt::format("unknown field '{}' (a tensor has dtype, shape and data_offsets)",
                       it.key().substr(0, 64)));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) fail(fmt::format("field '{}' is missing", field));
  TensorInfo t;
  t.name = name;
  t.dtype = parse_dtype(v["dtype"], source, name, at);
  const json& shape = v["shape"];
  if (!shape.is_array()) fail(fmt::format("field 'shape' is {}, not an array", shape.type_name()));
  if (shape.size() > kMaxRank)
    fail(fmt::format("field 'shape' has {} dimensions, more than the {} allowed", shape.size(),
                     kMaxRank));
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& d = shape[i];
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
      fail(fmt::format("field 'shape' dimension {} is {}, not an integer in [0, 2^62]", i,
                       d.dump().substr(0, 64)));
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(fmt::format("field 'data_offsets' is {}, not an array of two offsets",
                     off.dump().substr(0, 64)));
  for (int i = 0; i < 2; ++i)
    if (!off[i].is_number_unsigned())
      fail(fmt::format("field 'data_offsets' [{}] is {}, not a non-negative integer", i,
                       off[i].dump().substr(0, 64)));
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  if (t.begin > t.end)
    fail(fmt::format("field 'data_offsets' is [{}, {}]: the end comes before the start", t.begin,
                     t.end));
  if (t.end > data_bytes)
    fail(
        fmt::format("field 'data_offsets' ends at {} (file byte {}), past the data section's "
                    "{} bytes (the file is cut short or the offsets are wrong)",
                    t.end, 8 + text.size() + t.end, data_bytes));
  uint64_t want = 0;
  if (!checked_bytes(t.shape, dtype_size(t.dtype), &want))
    fail("field 'shape' has more elements than 64 bits count");
  if (want != t.bytes())
    fail(fmt::format("field 'data_offsets' [{}, {}] spans {} bytes, but shape {} of {} takes {}",
                     t.begin, t.end, t.bytes(), json(t.shape).dump(), dtype_name(t.dtype), want));
  return t;
}

}  // namespace

const char* dtype_name(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.t == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.t == t) return d.size;
  return 0;
}

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const TensorInfo* Header::find(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(std::string_view text, uint64_t file_size, const std::string& source) {
  Header h;
  h.header_bytes = text.size();
  h.data_start = 8 + text.size();
  if (file_size < h.data_start)
    bad(source, fmt::format("the header says it is {} bytes, but the file has only {} after the "
                            "8-byte length",
                            text.size(), file_size < 8 ? 0 : file_size - 8));
  h.data_bytes = file_size - h.data_start;
  if (text.empty() || text[0] != '{')
    bad(source, "the header (byte 8) does not start with '{': not a safetensors file");
  const json j = parse_json_strict(text, source);
  if (!j.is_object()) bad(source, "the header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      const json& m = it.value();
      const uint64_t at = key_offset(text, "__metadata__");
      if (!m.is_object())
        bad(source,
            fmt::format("'__metadata__' (header byte {}) is {}, not an object", at, m.type_name()));
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        if (!mi.value().is_string())
          bad(source, fmt::format("'__metadata__' (header byte {}): entry '{}' is {}, not a "
                                  "string",
                                  at, mi.key().substr(0, 64), mi.value().type_name()));
        h.metadata[mi.key()] = mi.value().get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(it.key(), it.value(), h.data_bytes, text, source));
  }
  // The data section must be the tensors' bytes exactly, back to back in
  // offset order: no overlap (two tensors sharing bytes), no gap (bytes no
  // tensor owns, where anything could hide), nothing past the last.
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t pos = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != pos)
      bad(source,
          fmt::format("tensor '{}' (header byte {}): field 'data_offsets' starts at {} (file byte "
                      "{}), but the previous tensor ends at {}: tensors must cover the data "
                      "section back to back, {}",
                      t.name, key_offset(text, t.name), t.begin, h.data_start + t.begin, pos,
                      t.begin < pos ? "and these overlap" : "and this leaves a gap"));
    pos = t.end;
  }
  if (pos != h.data_bytes)
    bad(source, fmt::format("the tensors end at data byte {} (file byte {}), but the data "
                            "section has {} bytes: {} bytes at the end belong to no tensor",
                            pos, h.data_start + pos, h.data_bytes, h.data_bytes - pos));
  return h;
}

Header parse_buffer(const void* data, size_t size, const std::string& source) {
  if (size < 8)
    bad(source, fmt::format("the file has {} bytes, fewer than the 8-byte header length", size));
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > kMaxHeaderBytes)
    bad(source, fmt::format("the header length (bytes 0-7) is {}, more than the {} allowed", n,
                            kMaxHeaderBytes));
  if (n > size - 8)
    bad(source, fmt::format("the header length (bytes 0-7) is {}, but the file has only {} bytes "
                            "after it",
                            n, size - 8));
  return parse_header({static_cast<const char*>(data) + 8, static_cast<size_t>(n)}, size, source);
}

Reader::Reader(const std::string& path) : path_(path) {
  struct stat st {};
  fd_ = file_check::open_regular(path, "a safetensors file", &st);
  try {
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size < 8)
      bad(path, fmt::format("the file has {} bytes, fewer than the 8-byte header length", size));
    uint64_t n = 0;
    if (!file_io::pread_full(fd_, &n, 8, 0))
      throw Error(POOCH_ERR_IO, fmt::format("cannot read '{}' at byte 0: {}", path,
                                            file_io::errno_text(errno ? errno : EIO)));
    if (n > kMaxHeaderBytes)
      bad(path, fmt::format("the header length (bytes 0-7) is {}, more than the {} allowed", n,
                            kMaxHeaderBytes));
    if (n > size - 8)
      bad(path, fmt::format("the header length (bytes 0-7) is {}, but the file has only {} bytes "
                            "after it",
                            n, size - 8));
    std::string text(n, '\0');
    if (!file_io::pread_full(fd_, text.data(), n, 8))
      throw Error(POOCH_ERR_IO, fmt::format("cannot read the header of '{}' (bytes 8 to {}): {}",
                                            path, 8 + n, file_io::errno_text(errno ? errno : EIO)));
    header_ = parse_header(text, size, path);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& Reader::at(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  bad(path_, fmt::format("it has no tensor '{}'", name));
}

void Reader::read(const TensorInfo& t, void* dst) const {
  const uint64_t at = header_.data_start + t.begin;
  errno = 0;
  if (!file_io::pread_full(fd_, dst, t.bytes(), at)) {
    const int err = errno;
    throw Error(POOCH_ERR_IO,
                fmt::format("cannot read tensor '{}' of '{}' (bytes {} to {}): {}", t.name, path_,
                            at, at + t.bytes(),
                            err ? file_io::errno_text(err) : "the file shrank while reading"));
  }
}

float half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // A subnormal half is a normal float: shift the mantissa up to its leading 1.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

std::vector<float> Reader::read_f32(const TensorInfo& t) const {
  const uint64_t n = t.elements();
  std::vector<float> out;
  switch (t.dtype) {
    case DType::F32:
      out.resize(n);
      read(t, out.data());
      break;
    case DType::F16:
    case DType::BF16: {
      std::vector<uint16_t> raw(n);
      read(t, raw.data());
      out.resize(n);
      for (uint64_t i = 0; i < n; ++i)
        out[i] = t.dtype == DType::F16 ? half_to_f32(raw[i]) : bf16_to_f32(raw[i]);
      break;
    }
    case DType::F64: {
      std::vector<double> raw(n);
      read(t, raw.data());
      out.assign(raw.begin(), raw.end());
      break;
    }
    default:
      bad(path_, fmt::format("tensor '{}' is {}, not a float tensor (F32, F16, BF16 or F64)",
                             t.name, dtype_name(t.dtype)));
  }
  return out;
}

void write_file_streaming(const std::string& path, const std::vector<TensorOut>& tensors,
                          const std::function<void(size_t i, std::byte* dst)>& fill,
                          const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t pos = 0;
  for (const TensorOut& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || t.name.size() > kMaxNameBytes ||
        h.contains(t.name))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cannot write '{}': tensor name '{}' is empty, reserved, too long "
                              "or given twice",
                              path, t.name));
    if (t.shape.size() > kMaxRank)
      throw Error(POOCH_ERR_INVALID_ARG, fmt::format("cannot write '{}': tensor '{}' has rank {}",
                                                     path, t.name, t.shape.size()));
    uint64_t bytes = 0;
    for (int64_t d : t.shape)
      if (d < 0)
        throw Error(POOCH_ERR_INVALID_ARG, fmt::format("cannot write '{}': tensor '{}' has a "
                                                       "negative dimension",
                                                       path, t.name));
    if (!checked_bytes(t.shape, dtype_size(t.dtype), &bytes))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cannot write '{}': tensor '{}' is too large", path, t.name));
    h[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {pos, pos + bytes}}};
    pos += bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cannot write '{}': the header would be {} bytes, more than the {} a "
                            "reader accepts",
                            path, text.size(), kMaxHeaderBytes));
  uint64_t n = text.size();
  file_io::AtomicFile f(path);
  f.write(&n, 8);
  f.write(text);
  std::vector<std::byte> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t bytes = 0;
    checked_bytes(tensors[i].shape, dtype_size(tensors[i].dtype), &bytes);
    if (bytes == 0) continue;
    buf.resize(bytes);
    fill(i, buf.data());
    f.write(buf.data(), bytes);
  }
  f.commit();
}

void write_file(const std::string& path, const std::vector<TensorOut>& tensors,
                const std::map<std::string, std::string>& metadata) {
  write_file_streaming(
      path, tensors,
      [&](size_t i, std::byte* dst) {
        uint64_t bytes = 0;
        checked_bytes(tensors[i].shape, dtype_size(tensors[i].dtype), &bytes);
        std::memcpy(dst, tensors[i].data, bytes);
      },
      metadata);
}

}  // namespace pooch::safetensors
