#include "formats/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <nlohmann/json.hpp>

#include "formats/file_io.h"
#include "runtime/core/error.h"
#include "runtime/core/strict_json.h"

namespace pooch::bpe {

namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenisation pattern (openai/gpt-2 encoder.py; tokenizers'
// ByteLevel pre-tokenizer uses the same).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr int32_t kMaxVocab = 1 << 24;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

struct ByteMap {
  std::array<std::string, 256> to_uni;
  std::unordered_map<std::string, uint8_t> from_uni;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_uni[static_cast<size_t>(b)] =
          utf8_of(printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
      from_uni[to_uni[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The length of the valid UTF-8 sequence at s[i], or 0 when it is invalid;
// *consumed gets the maximal subpart's length (>= 1) for replacement.
size_t utf8_seq(std::string_view s, size_t i, size_t* consumed) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *consumed = 1;
  if (b0 < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const auto c = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return 0;
    *consumed = k + 1;
  }
  return len;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
  return byte_map().to_uni[b];
}

size_t utf8_invalid_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t c;
    const size_t n = utf8_seq(s, i, &c);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t c;
    const size_t n = utf8_seq(s, i, &c);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += c;
    }
  }
  return out;
}

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::string& vocab_path, const std::string& merges_path) {
  file_io::MapOptions o;
  o.use_mmap = false;
  o.what = "a vocab.json file";
  const file_io::MappedFile v(vocab_path, o);
  o.what = "a merges.txt file";
  const file_io::MappedFile m(merges_path, o);
  return parse(v.bytes(), m.bytes(), vocab_path, merges_path);
}

Tokenizer Tokenizer::parse(std::string_view vocab_json, std::string_view merges_txt,
                           const std::string& vocab_name, const std::string& merges_name) {
  Tokenizer t;
  // vocab.json: an object of token -> id; duplicate keys are refused (the
  // last would silently win), and so are ids given twice.
  std::string dup;
  json j;
  try {
    j = parse_json_noting_repeats(vocab_json, &dup);
  } catch (const json::parse_error& e) {
    bad(vocab_name, fmt::format("does not parse as JSON at byte {}: {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    bad(vocab_name, fmt::format("does not parse as JSON: {}", e.what()));
  }
  if (!dup.empty()) bad(vocab_name, fmt::format("token '{}' is listed twice", dup));
  if (!j.is_object()) bad(vocab_name, "is not a JSON object of token -> id");
  if (j.size() > static_cast<size_t>(kMaxVocab))
    bad(vocab_name, fmt::format("has {} tokens, more than the {} allowed", j.size(), kMaxVocab));
  // N tokens take the ids 0 to N-1, each once: nothing is sized by an id
  // (found by fuzz_bpe_tokenizer: {"e": 10813440} made 10.8 M empty tokens).
  const auto n_tokens = static_cast<int32_t>(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= static_cast<uint64_t>(kMaxVocab))
      bad(vocab_name, fmt::format("token '{}' has id {}, not an integer in [0, {})",
                                  it.key().substr(0, 64), id.dump().substr(0, 32), kMaxVocab));
    const auto v = static_cast<int32_t>(id.get<uint64_t>());
    t.vocab_[it.key()] = v;
  }
  t.bytes_.assign(static_cast<size_t>(n_tokens), std::string());
  std::vector<bool> seen(t.bytes_.size(), false);
  const ByteMap& bm = byte_map();
  for (const auto& [tok, id] : t.vocab_) {
    if (id >= n_tokens) continue;  // then an id below N is missing: refused below
    if (seen[static_cast<size_t>(id)])
      bad(vocab_name, fmt::format("id {} is given to two tokens (one is '{}')", id, tok));
    seen[static_cast<size_t>(id)] = true;
    // The token's characters back to bytes; a character outside the
    // alphabet (an added token such as <|endoftext|> is inside it) keeps
    // its UTF-8 bytes.
    std::string b;
    for (size_t i = 0; i < tok.size();) {
      size_t c;
      const size_t n = utf8_seq(tok, i, &c);
      if (n == 0) bad(vocab_name, fmt::format("token at id {} is not valid UTF-8", id));
      const std::string ch = tok.substr(i, n);
      const auto f = bm.from_uni.find(ch);
      if (f != bm.from_uni.end())
        b += static_cast<char>(f->second);
      else
        b += ch;
      i += n;
    }
    t.bytes_[static_cast<size_t>(id)] = std::move(b);
  }
  for (int32_t i = 0; i < n_tokens; ++i)
    if (!seen[static_cast<size_t>(i)])
      bad(vocab_name, fmt::format("no token has id {} (the {} tokens' ids must run from 0 to {} "
                                  "without a gap)",
                                  i, n_tokens, n_tokens - 1));
  for (int b = 0; b < 256; ++b)
    if (!t.vocab_.count(bm.to_uni[static_cast<size_t>(b)]))
      bad(vocab_name, fmt::format("byte {} ('{}') has no token: a byte-level vocabulary needs "
                                  "all 256",
                                  b, bm.to_uni[static_cast<size_t>(b)]));
  for (const char* s : {"<|endoftext|>"})
    if (auto it = t.vocab_.find(s); it != t.vocab_.end()) t.special_.emplace_back(s, it->second);

  // merges.txt: an optional "#version" line, then one "a b" pair per line,
  // ranked by position; both parts and their concatenation are tokens.
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges_txt.size();) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      bad(merges_name, fmt::format("line {} is '{}', not two tokens separated by one space",
                                   line_no, std::string(line.substr(0, 64))));
    const std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
    for (const std::string& tok : {a, b, a + b}) {
      if (!t.vocab_.count(tok))
        bad(merges_name,
            fmt::format("line {}: '{}' is not in {}", line_no, tok.substr(0, 64), vocab_name));
    }
    t.merge_rank_.emplace(a + " " + b, rank++);  // a repeated pair keeps its first rank
  }

  int err = 0;
  PCRE2_SIZE err_at = 0;
  t.re_ = std::make_unique<Regex>();
  t.re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_at, nullptr);
  POOCH_CHECK(t.re_->code != nullptr, "(GPT-2's pattern compiles)");
  return t;
}

int32_t Tokenizer::special_id(std::string_view token) const {
  for (const auto& [s, id] : special_)
    if (s == token) return id;
  return -1;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab_size()));
  return bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const ByteMap& bm = byte_map();
  std::vector<std::string> sym;
  sym.reserve(piece.size());
  for (char c : piece) sym.push_back(bm.to_uni[static_cast<unsigned char>(c)]);
  // Merge the lowest-ranked adjacent pair, every occurrence left to right,
  // until no adjacent pair has a rank (GPT-2's bpe()).
  std::string key;
  while (sym.size() > 1) {
    int32_t best = INT32_MAX;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      key.assign(sym[i]).append(" ").append(sym[i + 1]);
      const auto it = merge_rank_.find(key);
      if (it != merge_rank_.end() && it->second < best) best = it->second;
    }
    if (best == INT32_MAX) break;
    std::vector<std::string> next;
    next.reserve(sym.size());
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size()) {
        key.assign(sym[i]).append(" ").append(sym[i + 1]);
        const auto it = merge_rank_.find(key);
        if (it != merge_rank_.end() && it->second == best) {
          next.push_back(sym[i] + sym[i + 1]);
          i += 2;
          continue;
        }
      }
      next.push_back(std::move(sym[i]));
      ++i;
    }
    sym = std::move(next);
  }
  for (const std::string& s : sym) {
    const auto it = vocab_.find(s);
    // parse() checked that every byte and every merge result is a token.
    POOCH_CHECK(it != vocab_.end(), "(a merged symbol is in the vocabulary)");
    out.push_back(it->second);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (const size_t bad_at = utf8_invalid_at(text); bad_at != std::string_view::npos)
    throw Error(POOCH_ERR_BAD_INPUT, fmt::format("the text is not valid UTF-8 at byte {}", bad_at));
  std::vector<int32_t> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_->code, nullptr);
  if (!md) throw Error(POOCH_ERR_OUT_OF_MEMORY, "no memory for the tokenizer's match data");
  auto split = [&](std::string_view seg) {
    PCRE2_SIZE at = 0;
    while (at < seg.size()) {
      const int rc = pcre2_match(re_->code, reinterpret_cast<PCRE2_SPTR>(seg.data()), seg.size(),
                                 at, PCRE2_NO_UTF_CHECK, md, nullptr);
      // The last alternative (\s+) and the class of everything else cover
      // every character, so a match always starts at `at`.
      POOCH_CHECK(rc > 0, "(GPT-2's pattern matches every position)");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      POOCH_CHECK(ov[1] > ov[0] && ov[0] == at, "(GPT-2's pattern matches contiguously)");
      encode_piece(seg.substr(ov[0], ov[1] - ov[0]), out);
      at = ov[1];
    }
  };
  try {
    size_t pos = 0;
    while (pos <= text.size()) {
      // The earliest special token at or after pos.
      size_t hit = std::string_view::npos;
      const std::pair<std::string, int32_t>* which = nullptr;
      for (const auto& sp : special_) {
        const size_t f = text.find(sp.first, pos);
        if (f < hit) {
          hit = f;
          which = &sp;
        }
      }
      if (!which) {
        split(text.substr(pos));
        break;
      }
      split(text.substr(pos, hit - pos));
      out.push_back(which->second);
      pos = hit + which->first.size();
    }
  } catch (...) {
    pcre2_match_data_free(md);
    throw;
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace pooch::bpe
