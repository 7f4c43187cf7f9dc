#include "pooch_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "../kernels/common/kernel_abi.h"
#include "../kernels/common/util.h"
#include "../runtime/core/error.h"
#include "../runtime/core/op_registry.h"
#include "file_check.h"
#include "file_io.h"

namespace pooch {

// Scalars are copied straight between the file and memory, and tensor data
// are handed out in place from the mapping: both are only right on a
// little-endian host, which is all pooch supports.
static_assert(std::endian::native == std::endian::little,
              "the .pooch format is little-endian and its data are used in place");

namespace {

namespace lim = pooch_limits;

constexpr std::array<unsigned char, 8> kMagic = {0x89, 'P', 'O', 'O', 'C', 'H', '\r', '\n'};

// Field offsets of the 128-byte header (docs/FORMAT.md "Header").
namespace hdr {
constexpr size_t version = 8, flags = 12, file_size = 16, meta_off = 24, meta_size = 32,
                 graph_off = 40, graph_size = 48, table_off = 56, table_size = 64, data_off = 72,
                 data_size = 80, meta_xxh3 = 88, graph_xxh3 = 96, table_xxh3 = 104, reserved = 112,
                 header_xxh3 = 120;
}

// The smallest possible record of each kind, so that a count can be checked
// against the bytes left before anything is allocated for it.
constexpr uint64_t kMinMetaEntry = 4 + 1 + 1 + 1;       // key of 1 byte, type, 1-byte value
constexpr uint64_t kMinTensorRecord = 4 + 1 + 4 + 4;    // name, dtype/role/flags/rank, links
constexpr uint64_t kMinNodeRecord = 4 + 1 + 1 + 1 + 2;  // op, counts
constexpr uint64_t kMinAttrRecord = 4 + 1 + 8;          // name, value
constexpr uint64_t kMinTableEntry = 4 + 1 + 4 + 8 * 3;  // name, dtype/role/rank/0, off/len/sum

constexpr uint64_t align64(uint64_t x) {
  return align_up(x, kPoochAlign);
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t xxh3(const void* p, size_t n) {
  // An empty span's data() may be null; XXH3 allows that for length 0, but a
  // real address keeps the sanitizers' nonnull checks quiet too.
  static const std::byte empty[1] = {};
  return XXH3_64bits(n ? p : empty, n);
}

// nullptr when `s` is acceptable as a format string, else why not.
const char* string_problem(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c == 0) return "contains a NUL byte";
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return "is not valid UTF-8";
    }
    if (n - i < len) return "is not valid UTF-8";
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return "is not valid UTF-8";
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past Unicode are all invalid.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return "is not valid UTF-8";
    i += len;
  }
  return nullptr;
}

const char* string_problem(std::string_view s) {
  return string_problem(reinterpret_cast<const unsigned char*>(s.data()), s.size());
}

void check_name_arg(std::string_view what, std::string_view s) {
  if (s.empty())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("{} is empty; names need at least one byte", what));
  if (s.size() > lim::kMaxNameBytes)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("{} '{}...' is {} bytes long; the .pooch limit is {}", what,
                            s.substr(0, 40), s.size(), lim::kMaxNameBytes));
  if (const char* p = string_problem(s))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("{} {}; names must be UTF-8 without NUL", what, p));
}

// Saturating byte size of dtype × dims, or nullopt above the format's limit.
std::optional<uint64_t> checked_bytes(DType dt, const Shape& shape) {
  uint64_t total = dtype_size(dt);
  bool over = false;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    if (over || total > lim::kMaxTensorBytes / static_cast<uint64_t>(d))
      over = true;
    else
      total *= static_cast<uint64_t>(d);
  }
  if (over) return std::nullopt;
  return total;
}

// ---------------------------------------------------------------------------
// Encoding

class Sink {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i32(int32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<std::byte>& bytes() { return buf_; }

 private:
  std::vector<std::byte> buf_;
};

void encode_metadata(Sink& s, const Metadata& meta) {
  // Metadata::set enforces every per-entry limit, so only the encoding remains.
  s.u32(static_cast<uint32_t>(meta.size()));
  for (const auto& [key, value] : meta.items()) {
    s.str(key);
    s.u8(static_cast<uint8_t>(value.index() + 1));
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, uint64_t>) {
            s.u64(v);
          } else if constexpr (std::is_same_v<T, int64_t>) {
            s.i64(v);
          } else if constexpr (std::is_same_v<T, double>) {
            s.f64(v);
          } else if constexpr (std::is_same_v<T, std::string>) {
            s.str(v);
          } else if constexpr (std::is_same_v<T, bool>) {
            s.u8(v ? 1 : 0);
          } else {
            s.u32(static_cast<uint32_t>(v.size()));
            s.raw(v.data(), v.size() * sizeof(v[0]));
          }
        },
        value);
  }
}

// Checks only what the encoding itself could not represent (field widths);
// every other rule is checked by decoding the result with the reader's code.
void encode_graph(Sink& s, const Graph& g, const std::string& path) {
  auto refuse = [&](const std::string& what) {
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("cannot write '{}': {}", path, what));
  };
  if (g.num_tensors() > lim::kMaxTensors)
    refuse(fmt::format("the graph has {} tensors; the .pooch limit is {}", g.num_tensors(),
                       lim::kMaxTensors));
  if (g.nodes().size() > lim::kMaxNodes)
    refuse(fmt::format("the graph has {} nodes; the .pooch limit is {}", g.nodes().size(),
                       lim::kMaxNodes));
  s.u32(static_cast<uint32_t>(g.num_tensors()));
  for (const TensorDesc& t : g.tensors()) {
    check_name_arg(fmt::format("cannot write '{}': tensor name", path), t.name);
    if (t.shape.size() > static_cast<size_t>(kern::kMaxDims))
      refuse(fmt::format("tensor '{}' has {} dimensions; at most {}", t.name, t.shape.size(),
                         kern::kMaxDims));
    s.str(t.name);
    s.u8(static_cast<uint8_t>(t.dtype));
    s.u8(static_cast<uint8_t>(t.role));
    s.u8(t.trainable ? 1 : 0);
    s.u8(static_cast<uint8_t>(t.shape.size()));
    s.i32(t.sparse_rows);
    for (int64_t d : t.shape) s.i64(d);
  }
  s.u32(static_cast<uint32_t>(g.nodes().size()));
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node& n = g.nodes()[k];
    check_name_arg(fmt::format("cannot write '{}': node {}'s op kind", path, k), n.op);
    if (n.inputs.size() > static_cast<size_t>(kern::kMaxOperands) ||
        n.outputs.size() > static_cast<size_t>(kern::kMaxOperands))
      refuse(fmt::format("node {} ('{}') has {} inputs and {} outputs; at most {} each", k, n.op,
                         n.inputs.size(), n.outputs.size(), kern::kMaxOperands));
    if (n.attrs.items().size() > lim::kMaxAttrs)
      refuse(fmt::format("node {} ('{}') has {} attributes; at most {}", k, n.op,
                         n.attrs.items().size(), lim::kMaxAttrs));
    s.str(n.op);
    s.u8(static_cast<uint8_t>(n.inputs.size()));
    s.u8(static_cast<uint8_t>(n.outputs.size()));
    s.u16(static_cast<uint16_t>(n.attrs.items().size()));
    for (TensorId id : n.inputs) s.i32(id);
    for (TensorId id : n.outputs) s.i32(id);
    for (const auto& [name, v] : n.attrs.items()) {
      check_name_arg(fmt::format("cannot write '{}': node {}'s attribute name", path, k), name);
      s.str(name);
      s.f64(v);
    }
  }
  s.u32(static_cast<uint32_t>(g.outputs().size()));
  for (TensorId id : g.outputs()) s.i32(id);
}

// ---------------------------------------------------------------------------
// Decoding

enum class Advice { damaged, truncated, newer, ops };

const char* advice_text(Advice a) {
  switch (a) {
    case Advice::damaged:
      return "the file is damaged or was not written by pooch: write it again or restore a good "
             "copy";
    case Advice::truncated:
      return "the file is incomplete (an interrupted write, copy or download?): copy or write it "
             "again";
    case Advice::newer:
      return "it was written by a newer pooch: upgrade pooch to read it";
    case Advice::ops:
      return "it was written by a pooch with ops this build lacks, or it is damaged: upgrade "
             "pooch or write the file again";
  }
  return "";
}

// Holds what every check needs to report a failure: the file's name and
// bytes, and whether this is the writer checking its own graph (then a
// failure is the caller's argument, not a damaged file).
class Parser {
 public:
  Parser(std::string path, std::span<const std::byte> file, bool self_check)
      : path_(std::move(path)), file_(file), self_check_(self_check) {}

  [[noreturn]] void fail(uint64_t at, const std::string& what,
                         Advice advice = Advice::damaged) const {
    if (self_check_)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cannot write '{}': the graph breaks a rule of the .pooch format: {}",
                              path_, what));
    throw Error(advice == Advice::newer ? POOCH_ERR_UNSUPPORTED : POOCH_ERR_BAD_INPUT,
                fmt::format("{}: {} (at byte {}); {}", path_, what, at, advice_text(advice)));
  }

  const std::string& path() const { return path_; }
  std::span<const std::byte> file() const { return file_; }

 private:
  std::string path_;
  std::span<const std::byte> file_;
  bool self_check_;
};

// A bounds-checked reader over one section. `record` names the record being
// read so that a short section says what it cut through.
class Cursor {
 public:
  Cursor(const Parser& p, uint64_t begin, uint64_t end, const char* section)
      : p_(p), base_(p.file().data()), pos_(begin), end_(end), section_(section) {}

  void record(const char* kind, uint64_t index) {
    kind_ = kind;
    index_ = index;
  }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return end_ - pos_; }
  const char* section() const { return section_; }

  std::string what(const char* field) const {
    return kind_ ? fmt::format("{} {}'s {}", kind_, index_, field) : std::string(field);
  }

  const std::byte* take(uint64_t n, const char* field) {
    if (left() < n)
      p_.fail(pos_, fmt::format("{} section ends inside {}: {} bytes needed, {} left before the "
                                "section ends at byte {}",
                                section_, what(field), n, left(), end_));
    const std::byte* at = base_ + pos_;
    pos_ += n;
    return at;
  }
  uint8_t u8(const char* f) { return load<uint8_t>(take(1, f)); }
  uint16_t u16(const char* f) { return load<uint16_t>(take(2, f)); }
  uint32_t u32(const char* f) { return load<uint32_t>(take(4, f)); }
  uint64_t u64(const char* f) { return load<uint64_t>(take(8, f)); }
  int32_t i32(const char* f) { return load<int32_t>(take(4, f)); }
  int64_t i64(const char* f) { return load<int64_t>(take(8, f)); }
  double f64(const char* f) { return load<double>(take(8, f)); }

  std::string str(const char* field, uint32_t max_len, bool allow_empty) {
    const uint64_t at = pos_;
    const uint32_t len = u32(field);
    if (len == 0 && !allow_empty) p_.fail(at, fmt::format("bad string: {} is empty", what(field)));
    if (len > max_len)
      p_.fail(at, fmt::format("bad string: {} is {} bytes long; the limit is {}", what(field), len,
                              max_len));
    const std::byte* s = take(len, field);
    if (const char* problem = string_problem(reinterpret_cast<const unsigned char*>(s), len))
      p_.fail(at, fmt::format("bad string: {} {}", what(field), problem));
    return std::string(reinterpret_cast<const char*>(s), len);
  }

  // A record count, checked against its limit and against the bytes left.
  uint32_t count(const char* what_, uint64_t limit, uint64_t min_record) {
    const uint64_t at = pos_;
    const uint32_t n = u32(what_);
    if (n > limit) p_.fail(at, fmt::format("too many {}: {}; the limit is {}", what_, n, limit));
    if (static_cast<uint64_t>(n) * min_record > left())
      p_.fail(at, fmt::format("too many {}: {} records of at least {} bytes each cannot fit in "
                              "the {} bytes left in the {} section",
                              what_, n, min_record, left(), section_));
    return n;
  }

  void finish() {
    if (left() != 0)
      p_.fail(pos_, fmt::format("extra bytes: {} bytes follow the last record of the {} section",
                                left(), section_));
  }

  const Parser& parser() const { return p_; }

 private:
  const Parser& p_;
  const std::byte* base_;
  uint64_t pos_, end_;
  const char* section_;
  const char* kind_ = nullptr;
  uint64_t index_ = 0;
};

Metadata decode_metadata(Cursor& c) {
  Metadata meta;
  const uint32_t n = c.count("metadata entries", lim::kMaxMetaEntries, kMinMetaEntry);
  for (uint32_t i = 0; i < n; ++i) {
    c.record("metadata entry", i);
    const uint64_t key_at = c.pos();
    std::string key = c.str("key", lim::kMaxNameBytes, false);
    if (meta.has(key)) c.parser().fail(key_at, fmt::format("duplicate metadata key '{}'", key));
    const uint64_t type_at = c.pos();
    const uint8_t type = c.u8("type");
    auto array = [&]<class T>(std::vector<T>) {
      const uint32_t count = c.count("array elements", lim::kMaxArrayElems, sizeof(T));
      std::vector<T> v(count);
      const std::byte* src = c.take(uint64_t{count} * sizeof(T), "array");
      if (count > 0)
        std::memcpy(v.data(), src, count * sizeof(T));  // an empty vector's data() may be null
      return v;
    };
    switch (type) {
      case 1:
        meta.set_u64(key, c.u64("value"));
        break;
      case 2:
        meta.set_i64(key, c.i64("value"));
        break;
      case 3:
        meta.set_f64(key, c.f64("value"));
        break;
      case 4:
        meta.set_string(key, c.str("value", lim::kMaxStringBytes, true));
        break;
      case 5: {
        const uint64_t at = c.pos();
        const uint8_t b = c.u8("value");
        if (b > 1)
          c.parser().fail(
              at, fmt::format("bad bool: metadata key '{}' holds {}; a bool is 0 or 1", key, b));
        meta.set_bool(key, b == 1);
        break;
      }
      case 6:
        meta.set_u64_array(key, array(std::vector<uint64_t>{}));
        break;
      case 7:
        meta.set_i64_array(key, array(std::vector<int64_t>{}));
        break;
      case 8:
        meta.set_f64_array(key, array(std::vector<double>{}));
        break;
      default:
        c.parser().fail(
            type_at, fmt::format("unknown metadata type {} for key '{}' (known: 1..8)", type, key));
    }
  }
  c.finish();
  return meta;
}

DType read_dtype(Cursor& c, const std::string& owner) {
  const uint64_t at = c.pos();
  const uint8_t v = c.u8("dtype");
  if (v >= kNumDTypes)
    c.parser().fail(
        at, fmt::format("unknown dtype {} for {} (known: 0..{})", v, owner, kNumDTypes - 1));
  return static_cast<DType>(v);
}

Role read_role(Cursor& c, const std::string& owner) {
  const uint64_t at = c.pos();
  const uint8_t v = c.u8("role");
  if (v >= kNumRoles)
    c.parser().fail(at,
                    fmt::format("unknown role {} for {} (known: 0..{})", v, owner, kNumRoles - 1));
  return static_cast<Role>(v);
}

uint8_t read_rank(Cursor& c, const std::string& owner) {
  const uint64_t at = c.pos();
  const uint8_t v = c.u8("rank");
  if (v > kern::kMaxDims)
    c.parser().fail(at,
                    fmt::format("rank {} of {} is above the limit {}", v, owner, kern::kMaxDims));
  return v;
}

// Reads the dims and returns the byte size dtype × shape, within the limits.
uint64_t read_dims(Cursor& c, uint8_t rank, DType dt, const std::string& owner, Shape& shape) {
  const uint64_t first = c.pos();
  shape.resize(rank);
  for (uint8_t d = 0; d < rank; ++d) {
    const uint64_t at = c.pos();
    const int64_t v = c.i64("dims");
    if (v < 0 || v > lim::kMaxDim)
      c.parser().fail(at, fmt::format("bad dimension {} (dimension {} of {}); dimensions are "
                                      "0..2^48",
                                      v, d, owner));
    shape[d] = v;
  }
  const auto bytes = checked_bytes(dt, shape);
  if (!bytes)
    c.parser().fail(first, fmt::format("bad dimension: {} {} {} would take more than 2^62 bytes",
                                       owner, dtype_name(dt), shape_str(shape)));
  return *bytes;
}

struct RawTensor {
  TensorDesc desc;
  uint64_t at;
};

struct RawNode {
  Node node;
  uint64_t at;
};

struct RawGraph {
  std::vector<RawTensor> tensors;
  std::vector<RawNode> nodes;
  std::vector<TensorId> outputs;
};

RawGraph decode_graph_records(Cursor& c) {
  const Parser& p = c.parser();
  RawGraph rg;
  const uint32_t nt = c.count("tensors", lim::kMaxTensors, kMinTensorRecord);
  rg.tensors.reserve(nt);
  auto check_id = [&](uint64_t at, int32_t id, const std::string& what) {
    if (id < 0 || static_cast<uint32_t>(id) >= nt)
      p.fail(at, fmt::format("tensor id out of range: {} is {}; the graph has {} tensors (ids "
                             "0..{})",
                             what, id, nt, static_cast<int64_t>(nt) - 1));
  };
  for (uint32_t i = 0; i < nt; ++i) {
    c.record("tensor", i);
    RawTensor t;
    t.at = c.pos();
    t.desc.name = c.str("name", lim::kMaxNameBytes, false);
    const std::string owner = fmt::format("tensor {} '{}'", i, t.desc.name);
    t.desc.dtype = read_dtype(c, owner);
    t.desc.role = read_role(c, owner);
    const uint64_t flags_at = c.pos();
    const uint8_t flags = c.u8("flags");
    if (flags & ~1u)
      p.fail(flags_at, fmt::format("unknown tensor flags 0x{:02x} for {} (only bit 0, trainable, "
                                   "is defined)",
                                   flags, owner));
    t.desc.trainable = (flags & 1u) != 0;
    const uint8_t rank = read_rank(c, owner);
    const uint64_t sr_at = c.pos();
    t.desc.sparse_rows = c.i32("sparse_rows");
    if (t.desc.sparse_rows != kNoTensor) {
      check_id(sr_at, t.desc.sparse_rows, fmt::format("the sparse_rows link of {}", owner));
      if (static_cast<uint32_t>(t.desc.sparse_rows) == i)
        p.fail(sr_at, fmt::format("tensor id out of range: {} links sparse_rows to itself", owner));
    }
    read_dims(c, rank, t.desc.dtype, owner, t.desc.shape);
    rg.tensors.push_back(std::move(t));
  }

  c.record(nullptr, 0);
  const uint32_t nn = c.count("nodes", lim::kMaxNodes, kMinNodeRecord);
  rg.nodes.reserve(nn);
  for (uint32_t k = 0; k < nn; ++k) {
    c.record("node", k);
    RawNode rn;
    rn.at = c.pos();
    Node& n = rn.node;
    n.op = c.str("op kind", lim::kMaxNameBytes, false);
    const OpDef* def = op_registry().find(n.op);
    if (!def) p.fail(rn.at, fmt::format("unknown op kind '{}' in node {}", n.op, k), Advice::ops);
    const uint64_t counts_at = c.pos();
    const uint8_t n_in = c.u8("input count");
    const uint8_t n_out = c.u8("output count");
    const uint16_t n_attr = c.u16("attribute count");
    if (n_in > kern::kMaxOperands || n_in < def->min_inputs || n_in > def->max_inputs)
      p.fail(
          counts_at,
          fmt::format("operand count: node {} ('{}') has {} inputs; the op takes {}", k, n.op, n_in,
                      def->min_inputs == def->max_inputs
                          ? fmt::format("{}", def->min_inputs)
                          : fmt::format("{} to {}", def->min_inputs, def->max_inputs)));
    if (n_out > kern::kMaxOperands)
      p.fail(counts_at + 1, fmt::format("operand count: node {} ('{}') has {} outputs; at most {}",
                                        k, n.op, n_out, kern::kMaxOperands));
    if (n_attr > lim::kMaxAttrs)
      p.fail(counts_at + 2, fmt::format("too many attributes: node {} ('{}') has {}; the limit is "
                                        "{}",
                                        k, n.op, n_attr, lim::kMaxAttrs));
    for (uint8_t j = 0; j < n_in; ++j) {
      const uint64_t at = c.pos();
      n.inputs.push_back(c.i32("inputs"));
      check_id(at, n.inputs.back(), fmt::format("input {} of node {} ('{}')", j, k, n.op));
    }
    for (uint8_t j = 0; j < n_out; ++j) {
      const uint64_t at = c.pos();
      n.outputs.push_back(c.i32("outputs"));
      check_id(at, n.outputs.back(), fmt::format("output {} of node {} ('{}')", j, k, n.op));
    }
    if (static_cast<uint64_t>(n_attr) * kMinAttrRecord > c.left())
      p.fail(counts_at + 2, fmt::format("too many attributes: node {} ('{}') claims {}, which "
                                        "cannot fit in the {} bytes left in the graph section",
                                        k, n.op, n_attr, c.left()));
    for (uint16_t a = 0; a < n_attr; ++a) {
      const uint64_t name_at = c.pos();
      std::string name = c.str("attribute name", lim::kMaxNameBytes, false);
      const uint64_t value_at = c.pos();
      const double v = c.f64("attribute value");
      if (n.attrs.has(name))
        p.fail(name_at, fmt::format("duplicate attribute '{}' in node {} ('{}')", name, k, n.op));
      // Ops read integer attributes by converting the double to int64, which
      // is undefined for NaN, infinities and magnitudes past its range.
      if (!std::isfinite(v) || std::fabs(v) > 9007199254740992.0)
        p.fail(value_at, fmt::format("bad attribute value {} for '{}' in node {} ('{}'); "
                                     "attributes are finite and at most 2^53 in magnitude",
                                     v, name, k, n.op));
      n.attrs.set(name, v);
    }
    rg.nodes.push_back(std::move(rn));
  }

  c.record(nullptr, 0);
  const uint32_t no = c.count("graph outputs", nt, 4);
  std::vector<char> is_output(nt, 0);
  for (uint32_t j = 0; j < no; ++j) {
    const uint64_t at = c.pos();
    const TensorId id = c.i32("graph outputs");
    check_id(at, id, fmt::format("graph output {}", j));
    if (is_output[static_cast<size_t>(id)]++)
      p.fail(at, fmt::format("duplicate graph output: tensor {} '{}' is listed twice", id,
                             rg.tensors[static_cast<size_t>(id)].desc.name));
    rg.outputs.push_back(id);
  }
  c.finish();
  return rg;
}

// Rebuilds the graph the way it was built: plain tensors through add_tensor,
// nodes through add_op, whose shape inference must give the stored outputs.
Graph rebuild_graph(const Parser& p, RawGraph& rg) {
  const size_t nt = rg.tensors.size();
  {
    std::unordered_map<std::string_view, size_t> names;
    names.reserve(nt);
    for (size_t i = 0; i < nt; ++i) {
      auto [it, fresh] = names.emplace(rg.tensors[i].desc.name, i);
      if (!fresh)
        p.fail(rg.tensors[i].at, fmt::format("duplicate tensor name '{}' (tensors {} and {})",
                                             rg.tensors[i].desc.name, it->second, i));
    }
  }

  // Who produces each tensor, and the order rules of docs/FORMAT.md.
  std::vector<int64_t> producer(nt, -1);
  int64_t last_out = -1;
  for (size_t k = 0; k < rg.nodes.size(); ++k) {
    const Node& n = rg.nodes[k].node;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const TensorId o = n.outputs[j];
      if (producer[static_cast<size_t>(o)] >= 0)
        p.fail(rg.nodes[k].at, fmt::format("graph order: tensor {} is an output of node {} and of "
                                           "node {} ('{}')",
                                           o, producer[static_cast<size_t>(o)], k, n.op));
      if (j == 0 && o <= last_out)
        p.fail(rg.nodes[k].at,
               fmt::format("graph order: node {} ('{}') creates tensor {}, but an earlier node "
                           "already created tensor {}; outputs must come in increasing id order",
                           k, n.op, o, last_out));
      if (j > 0 && o != n.outputs[j - 1] + 1)
        p.fail(rg.nodes[k].at,
               fmt::format("graph order: node {} ('{}') has outputs {}, which are not "
                           "consecutive ids",
                           k, n.op, n.outputs));
      producer[static_cast<size_t>(o)] = static_cast<int64_t>(k);
    }
    if (!n.outputs.empty()) last_out = n.outputs.back();
  }
  for (size_t k = 0; k < rg.nodes.size(); ++k) {
    const Node& n = rg.nodes[k].node;
    for (TensorId in : n.inputs) {
      const int64_t pk = producer[static_cast<size_t>(in)];
      if (pk >= static_cast<int64_t>(k))
        p.fail(rg.nodes[k].at,
               fmt::format("graph order: node {} ('{}') reads tensor {}, {}", k, n.op, in,
                           pk == static_cast<int64_t>(k)
                               ? std::string("its own output")
                               : fmt::format("which the later node {} produces", pk)));
      if (!n.outputs.empty() && in >= n.outputs[0])
        p.fail(rg.nodes[k].at,
               fmt::format("graph order: node {} ('{}') reads tensor {}, created after its first "
                           "output {}",
                           k, n.op, in, n.outputs[0]));
    }
  }

  Graph g;
  // Every rule Graph::add_tensor checks is checked above; should it ever
  // check more, its refusal is still a bad file, not a crash or an internal error.
  auto add_plain = [&](size_t i) {
    try {
      g.add_tensor(rg.tensors[i].desc);
    } catch (const std::exception& e) {
      p.fail(rg.tensors[i].at,
             fmt::format("bad tensor {} '{}': {}", i, rg.tensors[i].desc.name, e.what()));
    }
  };
  size_t next = 0;
  auto add_plain_until = [&](size_t limit, size_t k) {
    for (; next < limit; ++next) {
      if (producer[next] >= 0)
        p.fail(rg.nodes[k].at,
               fmt::format("graph order: node {} ('{}') needs tensor {} to exist, but tensor {} "
                           "before it is produced by the later node {}",
                           k, rg.nodes[k].node.op, limit - 1, next, producer[next]));
      add_plain(next);
    }
  };
  for (size_t k = 0; k < rg.nodes.size(); ++k) {
    const Node& n = rg.nodes[k].node;
    size_t limit = 0;
    if (!n.outputs.empty())
      limit = static_cast<size_t>(n.outputs[0]);
    else
      for (TensorId in : n.inputs) limit = std::max(limit, static_cast<size_t>(in) + 1);
    add_plain_until(limit, k);

    std::vector<std::string> names;
    for (TensorId o : n.outputs) names.push_back(rg.tensors[static_cast<size_t>(o)].desc.name);
    const Role role = n.outputs.empty() ? Role::activation
                                        : rg.tensors[static_cast<size_t>(n.outputs[0])].desc.role;
    std::vector<TensorId> made;
    try {
      made = g.add_op(n.op, n.inputs, n.attrs, names, role);
    } catch (const std::exception& e) {
      // An op's own checks (wrong input shapes, a missing attribute) come as
      // pooch::Error; anything else thrown from inference is just as fatal.
      p.fail(rg.nodes[k].at, fmt::format("shape inference: node {} ('{}') rejects its inputs: {}",
                                         k, n.op, e.what()));
    }
    if (made.size() != n.outputs.size())
      p.fail(rg.nodes[k].at,
             fmt::format("shape inference: node {} ('{}') stores {} outputs; the op "
                         "makes {}",
                         k, n.op, n.outputs.size(), made.size()));
    for (size_t j = 0; j < made.size(); ++j) {
      const TensorDesc& got = g.tensor(made[j]);
      const TensorDesc& want = rg.tensors[static_cast<size_t>(n.outputs[j])].desc;
      if (made[j] != n.outputs[j] || got.dtype != want.dtype || got.shape != want.shape)
        p.fail(rg.tensors[static_cast<size_t>(n.outputs[j])].at,
               fmt::format("shape inference: output {} '{}' of node {} ('{}') is stored as {} {}, "
                           "but the op infers {} {}",
                           j, want.name, k, n.op, dtype_name(want.dtype), shape_str(want.shape),
                           dtype_name(got.dtype), shape_str(got.shape)));
    }
    next += made.size();
  }
  for (; next < nt; ++next) add_plain(next);  // none left is produced

  // add_op gave node outputs one role and no links: restore them as stored.
  for (size_t i = 0; i < nt; ++i) {
    TensorDesc& t = g.tensor(static_cast<TensorId>(i));
    t.role = rg.tensors[i].desc.role;
    t.trainable = rg.tensors[i].desc.trainable;
    t.sparse_rows = rg.tensors[i].desc.sparse_rows;
  }
  for (TensorId o : rg.outputs) g.mark_output(o);
  return g;
}

struct RawEntry {
  TensorEntry e;
  uint64_t offset_at;  // where the entry's offset field is
};

std::vector<RawEntry> decode_table(Cursor& c, const Graph& g, uint64_t data_offset,
                                   uint64_t data_size) {
  const Parser& p = c.parser();
  const uint32_t n = c.count("tensor table entries", g.num_tensors(), kMinTableEntry);
  std::vector<RawEntry> out;
  out.reserve(n);
  std::vector<int64_t> entry_of(g.num_tensors(), -1);
  uint64_t prev_end = 0;  // relative to the data section
  for (uint32_t i = 0; i < n; ++i) {
    c.record("table entry", i);
    RawEntry r;
    TensorEntry& e = r.e;
    e.record_offset = c.pos();
    e.name = c.str("name", lim::kMaxNameBytes, false);
    const std::string owner = fmt::format("table entry {} '{}'", i, e.name);
    e.dtype = read_dtype(c, owner);
    e.role = read_role(c, owner);
    const uint8_t rank = read_rank(c, owner);
    const uint64_t reserved_at = c.pos();
    const uint8_t reserved = c.u8("reserved byte");
    if (reserved != 0)
      p.fail(reserved_at, fmt::format("unknown tensor flags 0x{:02x} in the reserved byte of {}",
                                      reserved, owner));
    const uint64_t expect = read_dims(c, rank, e.dtype, owner, e.shape);
    r.offset_at = c.pos();
    const uint64_t rel = c.u64("offset");
    const uint64_t len_at = c.pos();
    e.bytes = c.u64("length");
    e.xxh3 = c.u64("xxh3");

    if (e.bytes != expect)
      p.fail(len_at, fmt::format("byte length {} of {} disagrees with its dtype and shape: {} {} "
                                 "takes {} bytes",
                                 e.bytes, owner, dtype_name(e.dtype), shape_str(e.shape), expect));
    const auto id = g.find(e.name);
    if (!id) p.fail(e.record_offset, fmt::format("{} is not in the graph", owner));
    e.id = *id;
    if (entry_of[static_cast<size_t>(e.id)] >= 0)
      p.fail(e.record_offset, fmt::format("duplicate tensor name '{}' in the tensor table "
                                          "(entries {} and {})",
                                          e.name, entry_of[static_cast<size_t>(e.id)], i));
    entry_of[static_cast<size_t>(e.id)] = i;
    const TensorDesc& gt = g.tensor(e.id);
    if (gt.dtype != e.dtype || gt.role != e.role || gt.shape != e.shape)
      p.fail(e.record_offset,
             fmt::format("{} disagrees with the graph: the table says {} {} ({}), the graph {} {} "
                         "({})",
                         owner, dtype_name(e.dtype), shape_str(e.shape), role_name(e.role),
                         dtype_name(gt.dtype), shape_str(gt.shape), role_name(gt.role)));
    if (rel % kPoochAlign != 0)
      p.fail(r.offset_at, fmt::format("misaligned data offset {} of {}: offsets are multiples of "
                                      "{}",
                                      rel, owner, kPoochAlign));
    if (rel > data_size || e.bytes > data_size - rel)
      p.fail(r.offset_at, fmt::format("{} is out of range: its {} bytes at data offset {} run past "
                                      "the {}-byte data section",
                                      owner, e.bytes, rel, data_size));
    if (rel < prev_end)
      p.fail(r.offset_at, fmt::format("overlap: {} starts at byte {}, before the previous entry's "
                                      "data end at byte {}",
                                      owner, data_offset + rel, data_offset + prev_end));
    if (rel > align64(prev_end))
      p.fail(r.offset_at,
             fmt::format("hole: {} starts at byte {}, but its data must start at byte "
                         "{}, right after the previous entry's (aligned to {})",
                         owner, data_offset + rel, data_offset + align64(prev_end), kPoochAlign));
    e.offset = data_offset + rel;
    prev_end = rel + e.bytes;
    out.push_back(std::move(r));
  }
  c.finish();
  if (data_size != align64(prev_end))
    p.fail(hdr::data_size, fmt::format("data size {} in the header disagrees with the tensor "
                                       "table, whose data end at byte {} (so {} bytes)",
                                       data_size, data_offset + prev_end, align64(prev_end)));
  return out;
}

void check_zero(const Parser& p, uint64_t from, uint64_t to, const char* where) {
  const std::byte* b = p.file().data();
  for (uint64_t i = from; i < to; ++i)
    if (b[i] != std::byte{0})
      p.fail(i, fmt::format("nonzero padding byte 0x{:02x} {}; padding must be zero",
                            static_cast<unsigned>(b[i]), where));
}

// ---------------------------------------------------------------------------
// Files

}  // namespace

// ---------------------------------------------------------------------------
// Metadata

const char* meta_type_name(MetaType t) {
  switch (t) {
    case MetaType::u64:
      return "u64";
    case MetaType::i64:
      return "i64";
    case MetaType::f64:
      return "f64";
    case MetaType::string:
      return "string";
    case MetaType::boolean:
      return "bool";
    case MetaType::u64_array:
      return "u64 array";
    case MetaType::i64_array:
      return "i64 array";
    case MetaType::f64_array:
      return "f64 array";
  }
  return "?";
}

void Metadata::set(std::string_view key, Value v) {
  check_name_arg("metadata key", key);
  if (const auto* s = std::get_if<std::string>(&v)) {
    if (s->size() > lim::kMaxStringBytes)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("metadata string '{}' is {} bytes long; the .pooch limit is {}", key,
                              s->size(), lim::kMaxStringBytes));
    if (const char* p = string_problem(*s))
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("metadata string '{}' {}; strings must be UTF-8 without NUL (store "
                              "binary data as a u64 array)",
                              key, p));
  }
  const size_t elems = std::visit(
      [](const auto& x) -> size_t {
        if constexpr (requires {
                        x.data();
                        x.size();
                      } &&
                      !std::is_same_v<std::decay_t<decltype(x)>, std::string>)
          return x.size();
        else
          return 0;
      },
      v);
  if (elems > lim::kMaxArrayElems)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("metadata array '{}' has {} elements; the .pooch limit is {}", key,
                            elems, lim::kMaxArrayElems));
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    it->second = std::move(v);
    return;
  }
  if (kv_.size() >= lim::kMaxMetaEntries)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cannot add metadata key '{}': the .pooch limit is {} entries", key,
                            lim::kMaxMetaEntries));
  kv_.emplace(std::string(key), std::move(v));
}

std::optional<MetaType> Metadata::type(std::string_view key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return static_cast<MetaType>(it->second.index() + 1);
}

const Metadata::Value* Metadata::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

bool Metadata::erase(std::string_view key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  kv_.erase(it);
  return true;
}

const Metadata::Value& Metadata::checked(std::string_view key, MetaType want) const {
  auto it = kv_.find(key);
  if (it == kv_.end())
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("metadata has no key '{}' (of type {}); the file lacks it", key,
                            meta_type_name(want)));
  const auto have = static_cast<MetaType>(it->second.index() + 1);
  if (have != want)
    throw Error(POOCH_ERR_BAD_INPUT, fmt::format("metadata key '{}' holds type {}, not {}", key,
                                                 meta_type_name(have), meta_type_name(want)));
  return it->second;
}

// ---------------------------------------------------------------------------
// Writer

void write_pooch_file(const std::string& path, const Metadata& meta, const Graph& graph,
                      std::span<const TensorData> tensors) {
  auto refuse = [&](const std::string& what) {
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("cannot write '{}': {}", path, what));
  };

  Sink meta_s, graph_s, table_s;
  encode_metadata(meta_s, meta);
  encode_graph(graph_s, graph, path);
  {
    // Decode what was encoded with the reader's own rules: a file the reader
    // would refuse is never written.
    const auto& gb = graph_s.bytes();
    Parser self(path, std::span<const std::byte>(gb.data(), gb.size()), true);
    Cursor c(self, 0, gb.size(), "graph");
    RawGraph rg = decode_graph_records(c);
    rebuild_graph(self, rg);
  }

  if (tensors.size() > graph.num_tensors())
    refuse(fmt::format("{} tensors given, but the graph has only {}", tensors.size(),
                       graph.num_tensors()));
  std::vector<char> seen(graph.num_tensors(), 0);
  std::vector<uint64_t> offsets(tensors.size());
  // A tensor's bytes, in place or filled into one reused buffer.
  std::vector<std::byte> filled;
  auto bytes_of = [&](const TensorData& t) -> const void* {
    if (t.data || t.bytes == 0) return t.data;
    filled.resize(t.bytes);
    t.fill(filled.data());
    return filled.data();
  };
  uint64_t rel = 0;
  table_s.u32(static_cast<uint32_t>(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorData& t = tensors[i];
    if (t.id < 0 || static_cast<size_t>(t.id) >= graph.num_tensors())
      refuse(fmt::format("tensor data {} names tensor id {}; the graph has {} tensors", i, t.id,
                         graph.num_tensors()));
    const TensorDesc& d = graph.tensor(t.id);
    if (seen[static_cast<size_t>(t.id)]++)
      refuse(fmt::format("tensor '{}' is given twice", d.name));
    const auto expect = checked_bytes(d.dtype, d.shape);
    if (!expect || t.bytes != *expect)
      refuse(fmt::format("tensor '{}' is {} {}, which takes {} bytes, but {} bytes were given",
                         d.name, dtype_name(d.dtype), shape_str(d.shape), d.bytes(), t.bytes));
    if (t.bytes > 0 && t.data == nullptr && !t.fill)
      refuse(fmt::format("tensor '{}' has no data pointer", d.name));
    offsets[i] = rel;
    table_s.str(d.name);
    table_s.u8(static_cast<uint8_t>(d.dtype));
    table_s.u8(static_cast<uint8_t>(d.role));
    table_s.u8(static_cast<uint8_t>(d.shape.size()));
    table_s.u8(0);
    for (int64_t dim : d.shape) table_s.i64(dim);
    table_s.u64(rel);
    table_s.u64(t.bytes);
    table_s.u64(xxh3(bytes_of(t), t.bytes));
    rel = align64(rel + t.bytes);
  }
  const uint64_t data_size = rel;

  const uint64_t meta_off = kPoochHeaderBytes;
  const uint64_t meta_size = meta_s.bytes().size();
  const uint64_t graph_off = meta_off + meta_size;
  const uint64_t graph_size = graph_s.bytes().size();
  const uint64_t table_off = graph_off + graph_size;
  const uint64_t table_size = table_s.bytes().size();
  const uint64_t data_off = align64(table_off + table_size);
  const uint64_t file_size = data_off + data_size;

  std::array<std::byte, kPoochHeaderBytes> header{};
  auto put = [&](size_t at, uint64_t v, size_t n) { std::memcpy(header.data() + at, &v, n); };
  std::memcpy(header.data(), kMagic.data(), kMagic.size());
  put(hdr::version, kPoochFormatVersion, 4);
  put(hdr::flags, 0, 4);
  put(hdr::file_size, file_size, 8);
  put(hdr::meta_off, meta_off, 8);
  put(hdr::meta_size, meta_size, 8);
  put(hdr::graph_off, graph_off, 8);
  put(hdr::graph_size, graph_size, 8);
  put(hdr::table_off, table_off, 8);
  put(hdr::table_size, table_size, 8);
  put(hdr::data_off, data_off, 8);
  put(hdr::data_size, data_size, 8);
  put(hdr::meta_xxh3, xxh3(meta_s.bytes().data(), meta_size), 8);
  put(hdr::graph_xxh3, xxh3(graph_s.bytes().data(), graph_size), 8);
  put(hdr::table_xxh3, xxh3(table_s.bytes().data(), table_size), 8);
  put(hdr::header_xxh3, xxh3(header.data(), hdr::header_xxh3), 8);

  // Everything before the data goes out in one write.
  std::vector<std::byte> front(header.begin(), header.end());
  for (Sink* s : {&meta_s, &graph_s, &table_s})
    front.insert(front.end(), s->bytes().begin(), s->bytes().end());
  front.resize(data_off, std::byte{0});

  static const std::array<std::byte, kPoochAlign> zeros{};
  file_io::AtomicFile tmp(path);
  tmp.write(front.data(), front.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    tmp.write(bytes_of(tensors[i]), tensors[i].bytes);
    const uint64_t end = offsets[i] + tensors[i].bytes;
    tmp.write(zeros.data(), align64(end) - end);
  }
  POOCH_CHECK(tmp.written() == file_size, "(writer layout)");
  tmp.commit();
}

// ---------------------------------------------------------------------------
// Reader

// The file's bytes, mapped or read into a 64-byte aligned buffer.
struct PoochFile::Storage {
  file_io::MappedFile file;
  Storage(const std::string& path, const file_io::MapOptions& opts) : file(path, opts) {}
};

PoochFile::PoochFile() = default;
PoochFile::PoochFile(PoochFile&&) noexcept = default;
PoochFile& PoochFile::operator=(PoochFile&&) noexcept = default;
PoochFile::~PoochFile() = default;

bool PoochFile::mapped() const {
  return storage_ && storage_->file.mapped();
}

const TensorEntry* PoochFile::find(std::string_view name) const {
  const auto id = graph_.find(name);
  return id ? find(*id) : nullptr;
}

const TensorEntry* PoochFile::find(TensorId id) const {
  if (id < 0 || static_cast<size_t>(id) >= entry_of_tensor_.size()) return nullptr;
  const int32_t i = entry_of_tensor_[static_cast<size_t>(id)];
  return i < 0 ? nullptr : &entries_[static_cast<size_t>(i)];
}

std::span<const std::byte> PoochFile::data(const TensorEntry& e) const {
  if (!storage_ || e.offset > storage_->file.size() || e.bytes > storage_->file.size() - e.offset)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("tensor entry '{}' does not belong to '{}'", e.name, path_));
  return {storage_->file.data() + e.offset, static_cast<size_t>(e.bytes)};
}

void PoochFile::verify(const TensorEntry& e) const {
  const auto d = data(e);
  const uint64_t got = xxh3(d.data(), d.size());
  if (got != e.xxh3)
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: data checksum mismatch for tensor '{}' (bytes {}..{}): the table "
                            "says {:016x}, the data hash to {:016x} (at byte {}); {}",
                            path_, e.name, e.offset, e.offset + e.bytes, e.xxh3, got, e.offset,
                            advice_text(Advice::damaged)));
}

PoochFile read_pooch_file(const std::string& path, const ReadOptions& opts) {
  PoochFile f;
  f.path_ = path;
  file_io::MapOptions map;
  map.use_mmap = opts.use_mmap;
  map.what = "a .pooch file";
  f.storage_ = std::make_unique<PoochFile::Storage>(path, map);
  const file_io::MappedFile& st = f.storage_->file;

  const std::span<const std::byte> file(st.data(), st.size());
  const Parser p(path, file, false);
  const uint64_t size = st.size();
  const std::byte* b = st.data();
  auto u32_at = [&](size_t at) { return load<uint32_t>(b + at); };
  auto u64_at = [&](size_t at) { return load<uint64_t>(b + at); };

  // Header: magic first, so that any other file gets "not a .pooch file";
  // then the version, before anything whose layout a newer version may change.
  if (size < kMagic.size())
    p.fail(size,
           fmt::format("truncated: the file has {} bytes; a .pooch header alone is {}", size,
                       kPoochHeaderBytes),
           Advice::truncated);
  if (std::memcmp(b, kMagic.data(), kMagic.size()) != 0) {
    std::string seen;
    for (size_t i = 0; i < kMagic.size(); ++i)
      seen += fmt::format("{}{:02X}", i ? " " : "", static_cast<unsigned>(b[i]));
    p.fail(0,
           fmt::format("not a .pooch file: it starts with {}, not 89 50 4F 4F 43 48 0D 0A", seen));
  }
  if (size < kPoochHeaderBytes)
    p.fail(size,
           fmt::format("truncated: the file has {} bytes; a .pooch header alone is {}", size,
                       kPoochHeaderBytes),
           Advice::truncated);
  f.version_ = u32_at(hdr::version);
  if (f.version_ == 0) p.fail(hdr::version, "format version 0 is not a valid version");
  if (f.version_ > kPoochFormatVersion)
    p.fail(hdr::version,
           fmt::format("format version {} is newer than this pooch reads (up to {})", f.version_,
                       kPoochFormatVersion),
           Advice::newer);
  const uint64_t hsum = xxh3(b, hdr::header_xxh3);
  if (hsum != u64_at(hdr::header_xxh3))
    p.fail(hdr::header_xxh3, fmt::format("header checksum mismatch: bytes 0..{} hash to {:016x}, "
                                         "the header says {:016x}",
                                         hdr::header_xxh3 - 1, hsum, u64_at(hdr::header_xxh3)));
  if (u32_at(hdr::flags) != 0)
    p.fail(hdr::flags,
           fmt::format("unknown header flags 0x{:08x}; this pooch knows none", u32_at(hdr::flags)));
  if (u64_at(hdr::reserved) != 0) p.fail(hdr::reserved, "nonzero reserved header bytes");
  const uint64_t file_size = u64_at(hdr::file_size);
  if (size < file_size)
    p.fail(size,
           fmt::format("truncated: the header says the file has {} bytes, but it has {}", file_size,
                       size),
           Advice::truncated);
  if (size > file_size)
    p.fail(file_size, fmt::format("trailing bytes: the file has {} bytes, {} more than the {} its "
                                  "header gives",
                                  size, size - file_size, file_size));

  FileLayout& L = f.layout_;
  L.file_size = size;
  L.metadata = {u64_at(hdr::meta_off), u64_at(hdr::meta_size)};
  L.graph = {u64_at(hdr::graph_off), u64_at(hdr::graph_size)};
  L.table = {u64_at(hdr::table_off), u64_at(hdr::table_size)};
  L.data = {u64_at(hdr::data_off), u64_at(hdr::data_size)};
  auto layout = [&](size_t field, const std::string& what) {
    p.fail(field, fmt::format("bad section layout: {}", what));
  };
  // Each size is checked against the bytes left before it is added to
  // anything, so no sum below can overflow.
  if (L.metadata.offset != kPoochHeaderBytes)
    layout(hdr::meta_off, fmt::format("metadata_offset is {}; it must be {}", L.metadata.offset,
                                      kPoochHeaderBytes));
  if (L.metadata.size > size - L.metadata.offset)
    layout(hdr::meta_size, fmt::format("metadata_size {} runs past the end of the {}-byte file",
                                       L.metadata.size, size));
  if (L.graph.offset != L.metadata.offset + L.metadata.size)
    layout(hdr::graph_off, fmt::format("graph_offset is {}; the metadata section ends at {}",
                                       L.graph.offset, L.metadata.offset + L.metadata.size));
  if (L.graph.size > size - L.graph.offset)
    layout(hdr::graph_size,
           fmt::format("graph_size {} runs past the end of the {}-byte file", L.graph.size, size));
  if (L.table.offset != L.graph.offset + L.graph.size)
    layout(hdr::table_off, fmt::format("table_offset is {}; the graph section ends at {}",
                                       L.table.offset, L.graph.offset + L.graph.size));
  if (L.table.size > size - L.table.offset)
    layout(hdr::table_size,
           fmt::format("table_size {} runs past the end of the {}-byte file", L.table.size, size));
  const uint64_t table_end = L.table.offset + L.table.size;
  if (L.data.offset != align64(table_end))
    layout(hdr::data_off, fmt::format("data_offset is {}; it must be {} (the table's end {} "
                                      "rounded up to {})",
                                      L.data.offset, align64(table_end), table_end, kPoochAlign));
  if (L.data.offset > size)
    layout(hdr::data_off,
           fmt::format("data_offset {} is past the end of the {}-byte file", L.data.offset, size));
  if (L.data.size != size - L.data.offset || L.data.size % kPoochAlign != 0)
    layout(hdr::data_size, fmt::format("data_size is {}; the data section runs from byte {} to "
                                       "the end of the file at {}, a multiple of {}",
                                       L.data.size, L.data.offset, size, kPoochAlign));

  auto section_sum = [&](const FileSection& s, size_t field, const char* name) {
    const uint64_t got = xxh3(b + s.offset, s.size);
    if (got != u64_at(field))
      p.fail(s.offset, fmt::format("{} checksum mismatch: the section's {} bytes hash to {:016x}, "
                                   "the header says {:016x}",
                                   name, s.size, got, u64_at(field)));
  };

  section_sum(L.metadata, hdr::meta_xxh3, "metadata");
  {
    Cursor c(p, L.metadata.offset, L.metadata.offset + L.metadata.size, "metadata");
    f.meta_ = decode_metadata(c);
  }
  section_sum(L.graph, hdr::graph_xxh3, "graph");
  {
    Cursor c(p, L.graph.offset, L.graph.offset + L.graph.size, "graph");
    RawGraph rg = decode_graph_records(c);
    f.graph_ = rebuild_graph(p, rg);
  }
  section_sum(L.table, hdr::table_xxh3, "tensor table");
  std::vector<RawEntry> raw;
  {
    Cursor c(p, L.table.offset, table_end, "tensor table");
    raw = decode_table(c, f.graph_, L.data.offset, L.data.size);
  }

  // Padding must be zero so that no bytes of a file go unchecked.
  check_zero(p, table_end, L.data.offset, "before the data section");
  uint64_t prev_end = L.data.offset;
  for (const RawEntry& r : raw) {
    check_zero(p, prev_end, r.e.offset, fmt::format("before tensor '{}'", r.e.name).c_str());
    prev_end = r.e.offset + r.e.bytes;
  }
  check_zero(p, prev_end, size, "after the last tensor");

  f.entry_of_tensor_.assign(f.graph_.num_tensors(), -1);
  f.entries_.reserve(raw.size());
  for (RawEntry& r : raw) {
    f.entry_of_tensor_[static_cast<size_t>(r.e.id)] = static_cast<int32_t>(f.entries_.size());
    f.entries_.push_back(std::move(r.e));
  }
  if (opts.verify_data)
    for (const TensorEntry& e : f.entries_) f.verify(e);
  return f;
}

}  // namespace pooch
