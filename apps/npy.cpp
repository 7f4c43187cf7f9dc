#include "npy.h"

#include <unistd.h>

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

namespace cli {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader copies little-endian data as it is");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

size_t item_size(NpyType t) {
  return t == NpyType::u8 ? 1 : t == NpyType::f32 || t == NpyType::i32 ? 4 : 8;
}

// The header of a .npy file: a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : s_(text) {}

  bool parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape, std::string* error) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    ws();
    if (!eat('{')) return fail("the header is not a dictionary ('{' expected)", error);
    for (;;) {
      ws();
      if (eat('}')) break;
      std::string key;
      if (!string(&key)) return fail("expected a quoted key in the header", error);
      ws();
      if (!eat(':')) return fail("expected ':' after '" + key + "' in the header", error);
      ws();
      if (key == "descr") {
        if (have_descr) return fail("the header names 'descr' twice", error);
        if (!string(descr))
          return fail(
              "'descr' is not a type string such as '<f4' (structured arrays are not "
              "supported)",
              error);
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) return fail("the header names 'fortran_order' twice", error);
        if (word("True"))
          *fortran = true;
        else if (word("False"))
          *fortran = false;
        else
          return fail("'fortran_order' is neither True nor False", error);
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) return fail("the header names 'shape' twice", error);
        if (!tuple(shape, error)) return false;
        have_shape = true;
      } else {
        return fail("unknown key '" + key + "' in the header (known: descr, fortran_order, shape)",
                    error);
      }
      ws();
      if (eat(',')) continue;
      ws();
      if (eat('}')) break;
      return fail("expected ',' or '}' after '" + key + "' in the header", error);
    }
    ws();
    if (pos_ != s_.size()) return fail("text after the header's dictionary", error);
    if (!have_descr || !have_fortran || !have_shape)
      return fail(std::string("the header lacks '") +
                      (!have_descr     ? "descr"
                       : !have_fortran ? "fortran_order"
                                       : "shape") +
                      "'",
                  error);
    return true;
  }

 private:
  static bool fail(const std::string& what, std::string* error) {
    *error = what;
    return false;
  }
  void ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(pos_, n, w) != 0) return false;
    pos_ += n;
    return true;
  }
  bool string(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return false;
    const char q = s_[pos_++];
    const size_t end = s_.find(q, pos_);
    if (end == std::string::npos) return false;
    *out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }
  bool tuple(std::vector<int64_t>* shape, std::string* error) {
    shape->clear();
    if (!eat('(')) return fail("'shape' is not a tuple such as (1000, 8)", error);
    for (;;) {
      ws();
      if (eat(')')) return true;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
        return fail("'shape' holds something other than non-negative integers", error);
      int64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        const int d = s_[pos_++] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - d) / 10)
          return fail("a dimension of 'shape' is too large", error);
        v = v * 10 + d;
      }
      shape->push_back(v);
      ws();
      if (eat(',')) continue;
      ws();
      if (eat(')')) return true;
      return fail("'shape' is not a tuple such as (1000, 8)", error);
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

uint32_t read_le(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* npy_type_name(NpyType t) {
  switch (t) {
    case NpyType::f32:
      return "float32";
    case NpyType::f64:
      return "float64";
    case NpyType::i32:
      return "int32";
    case NpyType::i64:
      return "int64";
    case NpyType::u8:
      return "uint8";
  }
  return "?";
}

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t NpyArray::row_width() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string npy_shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

bool read_npy(const std::string& path, NpyArray* out, std::string* error) {
  auto fail = [&](const std::string& what) {
    *error = path + ": " + what;
    return false;
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::string("cannot open it: ") + std::strerror(errno));
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return fail("reading it failed");
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  if (file.size() < kMagicLen + 4 || std::memcmp(file.data(), kMagic, kMagicLen) != 0)
    return fail("not a NumPy .npy file (it does not start with \\x93NUMPY)");
  const int major = b[6], minor = b[7];
  size_t header_at = 0, header_len = 0;
  if (major == 1) {
    header_at = 10;
    header_len = read_le(b + 8, 2);
  } else if (major == 2 || major == 3) {
    if (file.size() < 12) return fail("truncated in the header");
    header_at = 12;
    header_len = read_le(b + 8, 4);
  } else {
    return fail("format version " + std::to_string(major) + "." + std::to_string(minor) +
                " is not one this reader knows (1.0, 2.0, 3.0)");
  }
  if (header_at + header_len > file.size())
    return fail("truncated in the header (it claims " + std::to_string(header_len) +
                " bytes; the file has " + std::to_string(file.size()) + " in all)");
  const std::string header(file.data() + header_at, header_len);
  std::string descr, why;
  bool fortran = false;
  std::vector<int64_t> shape;
  if (!HeaderParser(header).parse(&descr, &fortran, &shape, &why)) return fail(why);

  NpyType type;
  if (descr == "<f4")
    type = NpyType::f32;
  else if (descr == "<f8")
    type = NpyType::f64;
  else if (descr == "<i4")
    type = NpyType::i32;
  else if (descr == "<i8")
    type = NpyType::i64;
  else if (descr == "|u1" || descr == "<u1")
    type = NpyType::u8;
  else if (descr.size() == 3 && descr[0] == '>')
    return fail("the data is big-endian ('" + descr +
                "'); save it little-endian (in NumPy: a.astype(a.dtype.newbyteorder('<')))");
  else
    return fail("the element type '" + descr +
                "' is not supported; use float32 ('<f4'), float64 ('<f8'), int32 ('<i4'), "
                "int64 ('<i8') or uint8 ('|u1')");
  if (fortran)
    return fail("the array is in Fortran order; save it in C order (np.ascontiguousarray)");
  if (shape.empty()) return fail("the array is a scalar (shape ()); an array of rows is needed");

  const size_t item = item_size(type);
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / item / static_cast<uint64_t>(d))
      return fail("the shape " + npy_shape_str(shape) + " is too large");
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t need = count * item;
  const uint64_t have = file.size() - header_at - header_len;
  if (have < need)
    return fail("truncated: the shape " + npy_shape_str(shape) + " of " + npy_type_name(type) +
                " needs " + std::to_string(need) + " bytes of data, the file holds " +
                std::to_string(have));
  if (have > need)
    return fail(std::to_string(have - need) + " bytes follow the data of shape " +
                npy_shape_str(shape) + " (" + npy_type_name(type) + ")");
  out->type = type;
  out->shape = std::move(shape);
  const auto* data = reinterpret_cast<const std::byte*>(file.data() + header_at + header_len);
  out->data.assign(data, data + need);
  return true;
}

std::vector<float> npy_as_f32(const NpyArray& a) {
  const auto n = static_cast<size_t>(a.elements());
  std::vector<float> v(n);
  if (a.type == NpyType::f32) {
    if (n) std::memcpy(v.data(), a.data.data(), n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, a.data.data() + i * 8, 8);
      v[i] = static_cast<float>(d);
    }
  }
  return v;
}

std::vector<int64_t> npy_as_i64(const NpyArray& a) {
  const auto n = static_cast<size_t>(a.elements());
  std::vector<int64_t> v(n);
  if (a.type == NpyType::i64) {
    if (n) std::memcpy(v.data(), a.data.data(), n * 8);
  } else if (a.type == NpyType::u8) {
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(a.data[i]);
  } else {
    for (size_t i = 0; i < n; ++i) {
      int32_t x;
      std::memcpy(&x, a.data.data() + i * 4, 4);
      v[i] = x;
    }
  }
  return v;
}

bool write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data, std::string* error) {
  const char* descr = type == NpyType::f32   ? "<f4"
                      : type == NpyType::f64 ? "<f8"
                      : type == NpyType::i32 ? "<i4"
                                             : "<i8";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + npy_shape_str(shape) + ", }";
  // Magic (6), version (2), length (2), then the header padded with spaces and
  // ended by a newline so that the data starts 64-byte aligned.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * item_size(type);

  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    *error = path + ": cannot write it: " + std::strerror(errno);
    return false;
  }
  unsigned char pre[10];
  std::memcpy(pre, kMagic, kMagicLen);
  pre[6] = 1;
  pre[7] = 0;
  pre[8] = static_cast<unsigned char>(header.size() & 0xff);
  pre[9] = static_cast<unsigned char>(header.size() >> 8);
  bool ok = std::fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    *error = path + ": writing it failed: " + std::strerror(errno);
    std::remove(tmp.c_str());
  }
  return ok;
}

}  // namespace cli
