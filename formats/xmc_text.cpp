#include "formats/xmc_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "formats/file_io.h"
#include "runtime/core/error.h"

namespace pooch {

namespace {

constexpr int64_t kMaxIndexCount = std::numeric_limits<int32_t>::max();

bool is_blank(char c) {
  return c == ' ' || c == '\t';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// The token at p (up to a blank), shortened and with unprintable bytes
// escaped, so that a message about a binary or huge line stays readable.
std::string snippet(const char* p, const char* e) {
  std::string s;
  if (p >= e) return "end of line";
  if (*p == ' ') return "a space";
  if (*p == '\t') return "a tab";
  size_t n = 0;
  for (; p < e && !is_blank(*p) && n < 24; ++p, ++n) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '\r')
      s += "\\r";
    else if (c < 0x20 || c >= 0x7f)
      s += fmt::format("\\x{:02x}", c);
    else
      s += static_cast<char>(c);
  }
  if (p < e && !is_blank(*p)) s += "...";
  return "'" + s + "'";
}

// Walks a text file line by line and turns a position into "line L, column C"
// for messages. Columns count bytes from 1.
class Lines {
 public:
  Lines(std::string_view text, const std::string& name)
      : p_(text.data()), end_(text.data() + text.size()), name_(name) {
    // A UTF-8 byte order mark, as some editors on Windows write.
    if (text.size() >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;
  }

  bool next() {
    if (p_ >= end_) return false;
    b = p_;
    const void* nl = std::memchr(p_, '\n', static_cast<size_t>(end_ - p_));
    e = nl ? static_cast<const char*>(nl) : end_;
    p_ = nl ? e + 1 : end_;
    if (e > b && e[-1] == '\r') --e;  // CRLF line endings
    ++line;
    return true;
  }

  [[noreturn]] void fail(const char* at, const std::string& what) const {
    throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: line {}, column {}: {}", name_, line,
                                                 static_cast<int64_t>(at - b) + 1, what));
  }
  [[noreturn]] void fail_at_line(int64_t at_line, const std::string& what) const {
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: line {}, column 1: {}", name_, at_line, what));
  }

  bool blank() const {
    for (const char* q = b; q < e; ++q)
      if (!is_blank(*q)) return false;
    return true;
  }

  const std::string& name() const { return name_; }

  const char* b = nullptr;  // current line, without its line ending
  const char* e = nullptr;
  int64_t line = 0;

 private:
  const char* p_;
  const char* end_;
  const std::string& name_;
};

// True when the current line is `n` unsigned integers and nothing else: the
// shape of a header, seen where data was expected (two files concatenated).
bool looks_like_header(const Lines& in, int n) {
  const char* p = in.b;
  int count = 0;
  for (;;) {
    while (p < in.e && is_blank(*p)) ++p;
    if (p == in.e) break;
    if (!is_digit(*p)) return false;
    while (p < in.e && is_digit(*p)) ++p;
    if (p < in.e && !is_blank(*p)) return false;
    ++count;
  }
  return count == n;
}

// Parses an index at p, which must lie in [0, limit). `kind` ("feature",
// "label") and `declared` (where the limit comes from) shape the messages.
int32_t parse_index(const Lines& in, const char*& p, int64_t limit, const char* kind,
                    const std::string& declared) {
  int64_t v = 0;
  const auto r = std::from_chars(p, in.e, v);
  if (r.ec == std::errc::invalid_argument)
    in.fail(p, fmt::format("expected a {} index (a non-negative integer) but found {}", kind,
                           snippet(p, in.e)));
  if (r.ec == std::errc::result_out_of_range || v >= limit) {
    const std::string_view text(p, static_cast<size_t>(r.ptr - p));
    if (limit == 0)
      in.fail(p, fmt::format("{} index {} is out of range: {} declares 0 {}s, so no index is "
                             "valid; fix the header",
                             kind, text, declared, kind));
    in.fail(p, fmt::format("{} index {} is out of range: {} declares {} {}s, so indices run from 0 "
                           "to {}; fix the index or the header",
                           kind, text, declared, limit, kind, limit - 1));
  }
  if (v < 0)
    in.fail(p, fmt::format("negative {} index {}: indices are 0-based and non-negative", kind, v));
  p = r.ptr;
  return static_cast<int32_t>(v);
}

// Parses a feature value at p; it must be a finite number that fits a float.
float parse_value(const Lines& in, const char*& p) {
  const char* start = p;
  if (p < in.e && *p == '+') ++p;  // from_chars rejects a leading '+'; C's strtod accepts it
  float v = 0;
  const auto r = std::from_chars(p, in.e, v);
  if (r.ec == std::errc::invalid_argument)
    in.fail(start, fmt::format("expected a number after ':' but found {}", snippet(start, in.e)));
  if (r.ec == std::errc::result_out_of_range) {
    // Too small for a float is a zero, too large is an error: tell them
    // apart by the sign of the exponent as a double sees it.
    double d = 0;
    const auto rd = std::from_chars(p, in.e, d);
    bool underflow;
    if (rd.ec == std::errc())
      underflow = std::fabs(d) < 1.0;
    else {
      const char* x = p;
      while (x < r.ptr && *x != 'e' && *x != 'E') ++x;
      underflow = x + 1 < r.ptr && x[1] == '-';
    }
    if (!underflow)
      in.fail(start, fmt::format("value {} is too large for a 32-bit float (at most about 3.4e38)",
                                 snippet(start, in.e)));
    v = static_cast<float>(rd.ec == std::errc() ? d : 0.0);
  } else if (!std::isfinite(v)) {
    in.fail(start, fmt::format("value {} is not a finite number; NaN and infinity are not valid "
                               "feature values, fix or drop the entry",
                               snippet(start, in.e)));
  }
  p = r.ptr;
  return v;
}

// After a token: the line must go on with a blank or end.
void expect_separator(const Lines& in, const char* p, const char* after) {
  if (p < in.e && !is_blank(*p))
    in.fail(p, fmt::format("expected a space or the end of the line after {} but found {}", after,
                           snippet(p, in.e)));
}

// Parses the unsigned counts of a header line into out[0..n).
void parse_header(Lines& in, int n, int64_t* out, const char* form, const char* what) {
  if (!in.next())
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: line 1, column 1: the file is empty; expected a header line '{}' "
                            "({})",
                            in.name(), form, what));
  const char* p = in.b;
  if (in.blank())
    in.fail(p, fmt::format("the header line is blank; expected '{}' ({})", form, what));
  for (int i = 0; i < n; ++i) {
    while (p < in.e && is_blank(*p)) ++p;
    if (p == in.e)
      in.fail(p, fmt::format("the header has {} number{}; expected {} numbers '{}' ({}){}", i,
                             i == 1 ? "" : "s", n, form, what,
                             n == 3 && i == 2 ? "; a two-number header 'rows cols' is a split "
                                                "file: read it with its labels file as a pair"
                                              : ""));
    int64_t v = 0;
    const auto r = std::from_chars(p, in.e, v);
    if (r.ec == std::errc::invalid_argument || (r.ptr < in.e && !is_blank(*r.ptr)))
      in.fail(p, fmt::format("expected the header '{}' ({}) but found {}; is the header missing?",
                             form, what, snippet(p, in.e)));
    if (r.ec == std::errc::result_out_of_range || v < 0)
      in.fail(p, fmt::format("header count {} is out of range; counts are non-negative integers",
                             snippet(p, in.e)));
    out[i] = v;
    p = r.ptr;
  }
  while (p < in.e && is_blank(*p)) ++p;
  if (p != in.e)
    in.fail(p, fmt::format("expected the end of the header '{}' ({}) after {} numbers but found {}",
                           form, what, n, snippet(p, in.e)));
}

void check_index_count(const Lines& in, int64_t v, const char* what) {
  if (v > kMaxIndexCount)
    in.fail_at_line(1, fmt::format("the header declares {} {}; at most {} are supported (indices "
                                   "are 32-bit)",
                                   v, what, kMaxIndexCount));
}

// Sorts the entries [from, end) of one row by index, merging repeats. The
// common case, already sorted and unique, costs one pass.
void finish_row(const Lines& in, std::vector<int32_t>& idx, std::vector<float>* val, size_t from,
                std::vector<std::pair<int32_t, float>>& scratch) {
  bool sorted = true;
  for (size_t i = from + 1; i < idx.size(); ++i)
    if (idx[i] <= idx[i - 1]) {
      sorted = false;
      break;
    }
  if (sorted) return;
  scratch.clear();
  for (size_t i = from; i < idx.size(); ++i) scratch.emplace_back(idx[i], val ? (*val)[i] : 1.0f);
  std::stable_sort(scratch.begin(), scratch.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  idx.resize(from);
  if (val) val->resize(from);
  for (const auto& [i, v] : scratch) {
    if (idx.size() > from && idx.back() == i) {
      if (val) {  // repeated feature: summed; repeated label: one
        val->back() += v;
        if (!std::isfinite(val->back()))
          in.fail(in.b, fmt::format("feature {} appears more than once and its values sum beyond "
                                    "the 32-bit float range; merge or scale the entries",
                                    i));
      }
      continue;
    }
    idx.push_back(i);
    if (val) val->push_back(v);
  }
}

// Parses `i:v i:v ...` from p to the end of the line, appending to idx/val
// (val null: the values are checked to be numbers and dropped).
void parse_entries(const Lines& in, const char* p, int64_t limit, const char* kind,
                   const std::string& declared, std::vector<int32_t>& idx,
                   std::vector<float>* val) {
  for (;;) {
    while (p < in.e && is_blank(*p)) ++p;
    if (p == in.e) return;
    const int32_t i = parse_index(in, p, limit, kind, declared);
    if (p == in.e || *p != ':')
      in.fail(p, fmt::format("expected ':' after {} index {} (entries are 'index:value') but "
                             "found {}",
                             kind, i, snippet(p, in.e)));
    ++p;
    const float v = parse_value(in, p);
    expect_separator(in, p, "a value");
    idx.push_back(i);
    if (val) val->push_back(v);
  }
}

// Runs one line's parser; if it fails on a line shaped like a header, says
// so instead, since that is the likely cause (files concatenated).
template <class F>
void parse_line(const Lines& in, int header_numbers, const char* form, F&& f) {
  try {
    f();
  } catch (const Error&) {
    if (looks_like_header(in, header_numbers))
      in.fail(in.b, fmt::format("this line looks like a second header '{}' (a duplicate header: "
                                "were two files concatenated?); remove it",
                                form));
    throw;
  }
}

std::string rows_text(int64_t n) {
  return fmt::format("{} row{}", n, n == 1 ? "" : "s");
}

// After the declared number of rows only blank lines may follow.
void expect_no_more_rows(Lines& in, int64_t rows, int header_numbers, const char* form) {
  while (in.next()) {
    if (in.blank()) continue;
    if (looks_like_header(in, header_numbers))
      in.fail(in.b, fmt::format("this line looks like a second header '{}' (a duplicate header: "
                                "were two files concatenated?); remove it",
                                form));
    in.fail(in.b, fmt::format("the header (line 1) declares {} but the file has more lines; "
                              "fix the count in the header or remove the extra lines",
                              rows_text(rows)));
  }
}

[[noreturn]] void fail_short(const Lines& in, int64_t rows, int64_t got) {
  in.fail_at_line(in.line + 1, fmt::format("the header (line 1) declares {} but the file ends "
                                           "after {}; is the file truncated? Fix the count in the "
                                           "header or restore the missing lines",
                                           rows_text(rows), rows_text(got)));
}

// Reserves for `n` rows, but never more than the text could hold (one byte
// per line), so a header claiming 10^15 rows cannot force a huge allocation.
void reserve_rows(std::vector<int64_t>& ptr, int64_t n, size_t text_size) {
  ptr.reserve(static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(n), text_size)) + 1);
}

// Reads a split file (X_Xf.txt or X_Y.txt) into ptr/idx/val. Returns the
// second header count (columns or labels).
int64_t parse_split_part(std::string_view text, const std::string& name, const char* kind,
                         std::vector<int64_t>& ptr, std::vector<int32_t>& idx,
                         std::vector<float>* val, int64_t& rows) {
  Lines in(text, name);
  int64_t h[2];
  const bool labels = kind == std::string_view("label");
  const char* form = labels ? "rows labels" : "rows cols";
  parse_header(in, 2, h, form, labels ? "points, labels" : "points, features");
  check_index_count(in, h[1], labels ? "labels" : "features");
  rows = h[0];
  const std::string declared = fmt::format("the header of {}", name);
  ptr.assign(1, 0);
  reserve_rows(ptr, rows, text.size());
  if (!labels) {
    idx.reserve(text.size() / 12);
    val->reserve(text.size() / 12);
  }
  std::vector<std::pair<int32_t, float>> scratch;
  for (int64_t r = 0; r < rows; ++r) {
    if (!in.next()) fail_short(in, rows, r);
    const size_t from = idx.size();
    parse_line(in, 2, form, [&] { parse_entries(in, in.b, h[1], kind, declared, idx, val); });
    finish_row(in, idx, val, from, scratch);
    ptr.push_back(static_cast<int64_t>(idx.size()));
  }
  expect_no_more_rows(in, rows, 2, form);
  return h[1];
}

XmcDataset parse_split_labels_into(XmcDataset d, std::string_view labels_text,
                                   const std::string& labels_name,
                                   const std::string& features_name) {
  int64_t rows = 0;
  d.labels =
      parse_split_part(labels_text, labels_name, "label", d.label_ptr, d.label, nullptr, rows);
  if (rows != d.rows())
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: line 1, column 1: the labels file declares {} but the "
                            "features file {} has {}; the two files must describe the same points "
                            "in the same order",
                            labels_name, rows_text(rows), features_name, d.rows()));
  return d;
}

// ---- .npy ----

[[noreturn]] void npy_fail(const std::string& name, size_t offset, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT,
              fmt::format("{}: line 1, column {} (byte {} of the .npy file): {}", name, offset + 1,
                          offset, what));
}

struct NpyHeader {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
};

// Parses the Python dict literal NumPy writes as the header, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
  static constexpr char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0)
    npy_fail(name, 0,
             "not a NumPy .npy file: expected the magic bytes '\\x93NUMPY'; save the features "
             "with numpy.save");
  const auto u8 = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const int major = u8(6);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = u8(8) | (size_t{u8(9)} << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) npy_fail(name, 8, "the file ends inside the header length");
    hlen = u8(8) | (size_t{u8(9)} << 8) | (size_t{u8(10)} << 16) | (size_t{u8(11)} << 24);
    hstart = 12;
  } else {
    npy_fail(name, 6,
             fmt::format("unsupported .npy format version {}.{}; expected 1.0, 2.0 or 3.0", major,
                         static_cast<int>(u8(7))));
  }
  if (hlen > bytes.size() - hstart)
    npy_fail(name, 8,
             fmt::format("the header length {} runs past the end of the file ({} bytes); the file "
                         "is truncated",
                         hlen, bytes.size()));
  NpyHeader h;
  h.data_offset = hstart + hlen;
  const char* b = bytes.data();
  size_t p = hstart;
  const size_t e = hstart + hlen;
  const auto fail = [&](size_t at, const std::string& what) { npy_fail(name, at, what); };
  const auto ws = [&] {
    while (p < e && (b[p] == ' ' || b[p] == '\t' || b[p] == '\n' || b[p] == '\r')) ++p;
  };
  const auto expect = [&](char c, const char* ctx) {
    ws();
    if (p >= e || b[p] != c) fail(p, fmt::format("expected '{}' {} in the header", c, ctx));
    ++p;
  };
  const auto string_lit = [&]() {
    ws();
    if (p >= e || (b[p] != '\'' && b[p] != '"')) fail(p, "expected a quoted string in the header");
    const char q = b[p++];
    const size_t s = p;
    while (p < e && b[p] != q) ++p;
    if (p >= e) fail(s, "unterminated string in the header");
    return std::string(b + s, b + p++);
  };
  bool have_descr = false, have_order = false, have_shape = false;
  expect('{', "at the start of the dictionary");
  for (;;) {
    ws();
    if (p < e && b[p] == '}') {
      ++p;
      break;
    }
    const size_t key_at = p;
    const std::string key = string_lit();
    expect(':', "after a key");
    ws();
    if (key == "descr") {
      h.descr = string_lit();
      have_descr = true;
    } else if (key == "fortran_order") {
      if (e - p >= 4 && std::memcmp(b + p, "True", 4) == 0) {
        h.fortran = true;
        p += 4;
      } else if (e - p >= 5 && std::memcmp(b + p, "False", 5) == 0) {
        p += 5;
      } else {
        fail(p, "expected True or False for 'fortran_order'");
      }
      have_order = true;
    } else if (key == "shape") {
      expect('(', "to open 'shape'");
      for (;;) {
        ws();
        if (p < e && b[p] == ')') {
          ++p;
          break;
        }
        int64_t v = 0;
        const auto r = std::from_chars(b + p, b + e, v);
        if (r.ec != std::errc() || v < 0)
          fail(p, "expected a non-negative integer dimension in 'shape'");
        h.shape.push_back(v);
        p = static_cast<size_t>(r.ptr - b);
        ws();
        if (p < e && b[p] == ',')
          ++p;
        else if (p >= e || b[p] != ')')
          fail(p, "expected ',' or ')' in 'shape'");
      }
      have_shape = true;
    } else {
      fail(key_at, fmt::format("unexpected key '{}' in the header; expected 'descr', "
                               "'fortran_order' and 'shape'",
                               key));
    }
    ws();
    if (p < e && b[p] == ',') {
      ++p;
      continue;
    }
    expect('}', "or ',' after a value");
    break;
  }
  ws();
  if (p != e) fail(p, "unexpected bytes after the header dictionary");
  if (!have_descr || !have_order || !have_shape)
    fail(hstart, "the header lacks one of 'descr', 'fortran_order', 'shape'");
  if (h.descr != "<f4" && h.descr != "<f8")
    fail(hstart, fmt::format("dtype '{}' is not supported; expected '<f4' or '<f8' (little-endian "
                             "float32 or float64); convert with arr.astype('<f4')",
                             h.descr));
  if (h.fortran)
    fail(hstart,
         "the array is in Fortran order; expected C order: save "
         "numpy.ascontiguousarray(arr)");
  if (h.shape.size() != 2)
    fail(hstart, fmt::format("the array has {} dimensions; expected 2 (points x features)",
                             h.shape.size()));
  if (h.shape[1] == 0) fail(hstart, "the array has no feature columns (shape (rows, 0))");
  if (h.shape[1] > kMaxIndexCount)
    fail(hstart, fmt::format("the array has {} feature columns; at most {} are supported",
                             h.shape[1], kMaxIndexCount));
  return h;
}

XmcDataset parse_npy_features(std::string_view bytes, const std::string& name) {
  const NpyHeader h = parse_npy_header(bytes, name);
  const size_t item = h.descr == "<f4" ? 4 : 8;
  const uint64_t rows = static_cast<uint64_t>(h.shape[0]), cols = static_cast<uint64_t>(h.shape[1]);
  const uint64_t avail = bytes.size() - h.data_offset;
  // rows * cols * item without overflow: compare through division.
  const bool fits = rows == 0 || cols <= avail / item / rows;
  if (!fits || rows * cols * item != avail)
    npy_fail(
        name, h.data_offset,
        fmt::format("the data section has {} bytes but shape ({}, {}) of {} needs {}; the file "
                    "is truncated or its header is wrong",
                    avail, rows, cols, h.descr,
                    fits ? fmt::format("{}", rows * cols * item) : std::string("more")));
  XmcDataset d;
  d.features = static_cast<int64_t>(cols);
  d.dense_dim = static_cast<int64_t>(cols);
  d.row_ptr.assign(rows + 1, 0);
  d.dense.resize(rows * cols);
  const char* src = bytes.data() + h.data_offset;
  const auto bad = [&](uint64_t i, const char* what) {
    npy_fail(name, h.data_offset + i * item,
             fmt::format("the value at row {}, column {} {}; NaN and infinity are not valid "
                         "features, fix the array before saving it",
                         i / cols, i % cols, what));
  };
  if (item == 4) {
    if (!d.dense.empty()) std::memcpy(d.dense.data(), src, rows * cols * 4);
    for (uint64_t i = 0; i < rows * cols; ++i)
      if (!std::isfinite(d.dense[i])) bad(i, std::isnan(d.dense[i]) ? "is NaN" : "is infinite");
  } else {
    for (uint64_t i = 0; i < rows * cols; ++i) {
      double v;
      std::memcpy(&v, src + i * 8, 8);
      if (!std::isfinite(v)) bad(i, std::isnan(v) ? "is NaN" : "is infinite");
      if (std::fabs(v) > std::numeric_limits<float>::max()) bad(i, "does not fit a 32-bit float");
      d.dense[i] = static_cast<float>(v);
    }
  }
  return d;
}

// ---- writing ----

// Accumulates text and hands it to `flush` in large pieces, so that writing
// a multi-GB file needs neither a multi-GB string nor a syscall per token.
class TextOut {
 public:
  explicit TextOut(std::function<void(std::string&)> flush) : flush_(std::move(flush)) {
    buf_.reserve(kChunk + 256);
  }
  void put(char c) { buf_.push_back(c); }
  void put(std::string_view s) { buf_.append(s); }
  template <class T>
  void num(T v) {
    char tmp[48];
    const auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    buf_.append(tmp, r.ptr);
  }
  void end_line() {
    buf_.push_back('\n');
    if (flush_ && buf_.size() >= kChunk) flush_(buf_);
  }
  void finish() {
    if (flush_) flush_(buf_);
  }
  std::string& str() { return buf_; }

 private:
  static constexpr size_t kChunk = 1 << 22;
  std::function<void(std::string&)> flush_;
  std::string buf_;
};

void require_valid(const XmcDataset& d, const char* fn, bool want_sparse) {
  const std::string bad = xmc_check(d);
  if (!bad.empty()) throw Error(POOCH_ERR_INVALID_ARG, fmt::format("{}: {}", fn, bad));
  if (want_sparse && d.has_dense())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("{}: the data set has dense features; write them with write_npy", fn));
}

void emit_bow(TextOut& out, const XmcDataset& d) {
  out.num(d.rows());
  out.put(' ');
  out.num(d.features);
  out.put(' ');
  out.num(d.labels);
  out.end_line();
  for (int64_t r = 0; r < d.rows(); ++r) {
    for (int64_t j = d.label_ptr[r]; j < d.label_ptr[r + 1]; ++j) {
      if (j > d.label_ptr[r]) out.put(',');
      out.num(d.label[j]);
    }
    for (int64_t j = d.row_ptr[r]; j < d.row_ptr[r + 1]; ++j) {
      // A point without labels starts with a space, as in the repository's files.
      out.put(' ');
      out.num(d.col[j]);
      out.put(':');
      out.num(d.val[j]);
    }
    out.end_line();
  }
}

// One half of a split pair: header `rows cols`, then `i:v` per row.
void emit_split(TextOut& out, int64_t rows, int64_t cols, const std::vector<int64_t>& ptr,
                const std::vector<int32_t>& idx, const std::vector<float>* val) {
  out.num(rows);
  out.put(' ');
  out.num(cols);
  out.end_line();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = ptr[r]; j < ptr[r + 1]; ++j) {
      if (j > ptr[r]) out.put(' ');
      out.num(idx[j]);
      out.put(':');
      if (val)
        out.num((*val)[j]);
      else
        out.put('1');
    }
    out.end_line();
  }
}

template <class Emit>
void write_text_file(const std::string& path, Emit&& emit) {
  file_io::AtomicFile f(path);
  TextOut out([&](std::string& s) {
    f.write(s);
    s.clear();
  });
  emit(out);
  out.finish();
  f.commit();
}

}  // namespace

// ---- public: parsing ----

XmcDataset parse_xmc_bow(std::string_view text, const std::string& name) {
  Lines in(text, name);
  int64_t h[3];
  const char* form = "N F L";
  parse_header(in, 3, h, form, "points, features, labels");
  check_index_count(in, h[1], "features");
  check_index_count(in, h[2], "labels");
  XmcDataset d;
  d.features = h[1];
  d.labels = h[2];
  const int64_t rows = h[0];
  const std::string declared = "the header (line 1)";
  reserve_rows(d.row_ptr, rows, text.size());
  reserve_rows(d.label_ptr, rows, text.size());
  // A typical entry `1234:0.0123 ` takes about 12 bytes of text.
  d.col.reserve(text.size() / 12);
  d.val.reserve(text.size() / 12);
  std::vector<std::pair<int32_t, float>> scratch;
  for (int64_t r = 0; r < rows; ++r) {
    if (!in.next()) fail_short(in, rows, r);
    const size_t lfrom = d.label.size(), ffrom = d.col.size();
    parse_line(in, 3, form, [&] {
      const char* p = in.b;
      if (p < in.e && !is_blank(*p)) {
        // The first token is the label list unless it is already a feature.
        const char* t = p;
        while (t < in.e && !is_blank(*t) && *t != ':') ++t;
        if (t == in.e || *t != ':') {
          for (;;) {
            d.label.push_back(parse_index(in, p, d.labels, "label", declared));
            if (p < in.e && *p == ',') {
              ++p;
              continue;
            }
            expect_separator(in, p, "a label (labels are separated by ',' without spaces)");
            break;
          }
        }
      }
      parse_entries(in, p, d.features, "feature", declared, d.col, &d.val);
    });
    finish_row(in, d.label, nullptr, lfrom, scratch);
    finish_row(in, d.col, &d.val, ffrom, scratch);
    d.row_ptr.push_back(static_cast<int64_t>(d.col.size()));
    d.label_ptr.push_back(static_cast<int64_t>(d.label.size()));
  }
  expect_no_more_rows(in, rows, 3, form);
  return d;
}

XmcDataset parse_xmc_split(std::string_view features_text, const std::string& features_name,
                           std::string_view labels_text, const std::string& labels_name) {
  XmcDataset d;
  int64_t rows = 0;
  d.features =
      parse_split_part(features_text, features_name, "feature", d.row_ptr, d.col, &d.val, rows);
  return parse_split_labels_into(std::move(d), labels_text, labels_name, features_name);
}

XmcDataset parse_xmc_npy(std::string_view npy_bytes, const std::string& npy_name,
                         std::string_view labels_text, const std::string& labels_name) {
  return parse_split_labels_into(parse_npy_features(npy_bytes, npy_name), labels_text, labels_name,
                                 npy_name);
}

// ---- public: reading files ----

namespace {
// The parsers read a text front to back, once.
constexpr file_io::MapOptions kSequential{.sequential = true};
}  // namespace

XmcDataset read_xmc_bow(const std::string& path) {
  file_io::MappedFile f(path, kSequential);
  return parse_xmc_bow(f.bytes(), path);
}

XmcDataset read_xmc_split(const std::string& features_path, const std::string& labels_path) {
  file_io::MappedFile xf(features_path, kSequential);
  file_io::MappedFile y(labels_path, kSequential);
  if (xf.bytes().substr(0, 6) == std::string_view("\x93NUMPY", 6))
    return parse_xmc_npy(xf.bytes(), features_path, y.bytes(), labels_path);
  return parse_xmc_split(xf.bytes(), features_path, y.bytes(), labels_path);
}

// ---- public: writing ----

std::string format_xmc_bow(const XmcDataset& d) {
  require_valid(d, "format_xmc_bow", true);
  TextOut out(nullptr);
  emit_bow(out, d);
  return std::move(out.str());
}

void write_xmc_bow(const std::string& path, const XmcDataset& d) {
  require_valid(d, "write_xmc_bow", true);
  write_text_file(path, [&](TextOut& out) { emit_bow(out, d); });
}

void write_xmc_split_labels(const std::string& labels_path, const XmcDataset& d) {
  require_valid(d, "write_xmc_split_labels", false);
  write_text_file(labels_path, [&](TextOut& out) {
    emit_split(out, d.rows(), d.labels, d.label_ptr, d.label, nullptr);
  });
}

void write_xmc_split(const std::string& features_path, const std::string& labels_path,
                     const XmcDataset& d) {
  require_valid(d, "write_xmc_split", true);
  write_text_file(features_path, [&](TextOut& out) {
    emit_split(out, d.rows(), d.features, d.row_ptr, d.col, &d.val);
  });
  write_xmc_split_labels(labels_path, d);
}

void write_npy(const std::string& path, const XmcDataset& d) {
  require_valid(d, "write_npy", false);
  if (!d.has_dense())
    throw Error(POOCH_ERR_INVALID_ARG,
                "write_npy: the data set has sparse features; write them with write_xmc_bow or "
                "write_xmc_split");
  std::string header = fmt::format(
      "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", d.rows(), d.dense_dim);
  // NumPy pads the header with spaces and a newline so the data starts on a
  // 64-byte boundary; a 1.0 header length is 16-bit, hence 2.0 past that.
  const bool v2 = header.size() + 64 > 65535;
  const size_t pre = v2 ? 12 : 10;
  header.append(63 - (pre + header.size() + 1 + 63) % 64, ' ');
  header.push_back('\n');
  std::string head("\x93NUMPY", 6);
  head.push_back(static_cast<char>(v2 ? 2 : 1));
  head.push_back(0);
  const size_t n = header.size();
  head.push_back(static_cast<char>(n & 0xff));
  head.push_back(static_cast<char>((n >> 8) & 0xff));
  if (v2) {
    head.push_back(static_cast<char>((n >> 16) & 0xff));
    head.push_back(static_cast<char>((n >> 24) & 0xff));
  }
  file_io::AtomicFile f(path);
  f.write(head);
  f.write(header);
  // Little-endian host assumed, as everywhere in pooch (FORMAT.md).
  f.write(d.dense.data(), d.dense.size() * sizeof(float));
  f.commit();
}

// ---- public: checking ----

std::string xmc_check(const XmcDataset& d) {
  const auto check_ptr = [](const std::vector<int64_t>& ptr, size_t n, const char* what,
                            int64_t rows) -> std::string {
    if (static_cast<int64_t>(ptr.size()) != rows + 1)
      return fmt::format("{} has {} entries, expected rows + 1 = {}", what, ptr.size(), rows + 1);
    if (ptr[0] != 0) return fmt::format("{}[0] is {}, expected 0", what, ptr[0]);
    for (int64_t r = 0; r < rows; ++r)
      if (ptr[r + 1] < ptr[r])
        return fmt::format("{} decreases at row {} ({} then {})", what, r, ptr[r], ptr[r + 1]);
    if (static_cast<uint64_t>(ptr[rows]) != n)
      return fmt::format("{} ends at {} but there are {} entries", what, ptr[rows], n);
    return {};
  };
  if (d.row_ptr.empty()) return "row_ptr is empty, expected rows + 1 entries";
  const int64_t rows = d.rows();
  if (d.features < 0 || d.labels < 0 || d.features > kMaxIndexCount || d.labels > kMaxIndexCount)
    return fmt::format("features {} and labels {} must lie in [0, 2^31)", d.features, d.labels);
  if (d.val.size() != d.col.size())
    return fmt::format("col has {} entries but val has {}", d.col.size(), d.val.size());
  std::string s = check_ptr(d.row_ptr, d.col.size(), "row_ptr", rows);
  if (s.empty()) s = check_ptr(d.label_ptr, d.label.size(), "label_ptr", rows);
  if (!s.empty()) return s;
  for (size_t j = 0; j < d.col.size(); ++j) {
    if (d.col[j] < 0 || d.col[j] >= d.features)
      return fmt::format("feature index {} at entry {} is outside [0, {})", d.col[j], j,
                         d.features);
    if (!std::isfinite(d.val[j])) return fmt::format("feature value at entry {} is not finite", j);
  }
  for (size_t j = 0; j < d.label.size(); ++j)
    if (d.label[j] < 0 || d.label[j] >= d.labels)
      return fmt::format("label index {} at entry {} is outside [0, {})", d.label[j], j, d.labels);
  if (d.dense_dim < 0) return "dense_dim is negative";
  if (d.has_dense()) {
    if (d.dense_dim != d.features)
      return fmt::format("dense_dim {} differs from features {}", d.dense_dim, d.features);
    if (!d.col.empty()) return "a data set has dense or sparse features, not both";
    if (d.dense.size() != static_cast<uint64_t>(rows) * static_cast<uint64_t>(d.dense_dim))
      return fmt::format("dense has {} values, expected rows x dense_dim = {} x {}", d.dense.size(),
                         rows, d.dense_dim);
    for (size_t j = 0; j < d.dense.size(); ++j)
      if (!std::isfinite(d.dense[j])) return fmt::format("dense value {} is not finite", j);
  } else if (!d.dense.empty()) {
    return "dense holds values but dense_dim is 0";
  }
  return {};
}

}  // namespace pooch
