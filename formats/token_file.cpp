#include "formats/token_file.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstring>

#include "formats/file_check.h"
#include "formats/file_io.h"
#include "runtime/core/error.h"

namespace pooch::tokens {

// The format is little-endian; pooch runs on little-endian machines only.
static_assert(std::endian::native == std::endian::little);

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

int32_t le32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return static_cast<int32_t>(v);
}

}  // namespace

std::vector<int32_t> parse_llmc(const void* data, size_t size, const std::string& source) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (size < kLlmcHeaderBytes)
    bad(source, fmt::format("the file has {} bytes, fewer than the {}-byte header of an llm.c "
                            "token file",
                            size, kLlmcHeaderBytes));
  const int32_t magic = le32(p), version = le32(p + 4), count = le32(p + 8);
  if (magic != kLlmcMagic)
    bad(source, fmt::format("field 'magic' (bytes 0-3) is {}, not {}: not an llm.c GPT-2 token "
                            "file",
                            magic, kLlmcMagic));
  if (version != kLlmcVersion)
    bad(source, fmt::format("field 'version' (bytes 4-7) is {}; only version {} (uint16 tokens) "
                            "is read",
                            version, kLlmcVersion));
  if (count < 0) bad(source, fmt::format("field 'count' (bytes 8-11) is {}, negative", count));
  const uint64_t want = kLlmcHeaderBytes + 2 * static_cast<uint64_t>(count);
  if (size != want)
    bad(source, fmt::format("field 'count' (bytes 8-11) says {} tokens, which take {} bytes after "
                            "the header, but the file has {} ({})",
                            count, want - kLlmcHeaderBytes, size - kLlmcHeaderBytes,
                            size < want ? "it is cut short" : "bytes follow the last token"));
  std::vector<int32_t> out(static_cast<size_t>(count));
  const unsigned char* t = p + kLlmcHeaderBytes;
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<int32_t>(t[2 * i] | (static_cast<uint32_t>(t[2 * i + 1]) << 8));
  return out;
}

std::vector<int32_t> read_llmc(const std::string& path) {
  file_io::MapOptions o;
  o.sequential = true;
  o.what = "an llm.c token file";
  const file_io::MappedFile f(path, o);
  return parse_llmc(f.data(), f.size(), path);
}

void write_llmc(const std::string& path, const std::vector<int32_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("cannot write '{}': {} tokens, more than an llm.c header counts", path,
                            tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] > 65535)
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("cannot write '{}': token {} is {}, outside the uint16 range of an "
                              "llm.c token file",
                              path, i, tokens[i]));
  std::vector<unsigned char> b(kLlmcHeaderBytes + 2 * tokens.size(), 0);
  const int32_t head[3] = {kLlmcMagic, kLlmcVersion, static_cast<int32_t>(tokens.size())};
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 4; ++j)
      b[4 * k + j] = static_cast<unsigned char>(static_cast<uint32_t>(head[k]) >> (8 * j));
  for (size_t i = 0; i < tokens.size(); ++i) {
    b[kLlmcHeaderBytes + 2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
    b[kLlmcHeaderBytes + 2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
  }
  file_io::AtomicFile f(path);
  f.write(b.data(), b.size());
  f.commit();
}

std::vector<int32_t> read_bytes(const std::string& path) {
  file_io::MapOptions o;
  o.sequential = true;
  o.what = "a text file";
  const file_io::MappedFile f(path, o);
  const auto* p = reinterpret_cast<const unsigned char*>(f.data());
  return std::vector<int32_t>(p, p + f.size());
}

bool looks_like_llmc(const std::string& path) {
  struct stat st {};
  file_io::Fd f(file_check::open_regular(path, "a token file", &st));
  unsigned char m[4];
  return st.st_size >= 4 && file_io::pread_full(f.fd, m, 4, 0) && le32(m) == kLlmcMagic;
}

void check_vocab(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& source) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      bad(source, fmt::format("token {} is {}, outside the model's vocabulary [0, {})", i,
                              tokens[i], vocab));
}

}  // namespace pooch::tokens
