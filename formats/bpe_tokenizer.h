// GPT-2's byte-level BPE tokenizer: vocab.json (token -> id) and merges.txt
// (ranked pairs), the files GPT2Tokenizer.save_pretrained writes. Encoding
// splits the text at special tokens (<|endoftext|>), then with GPT-2's
// pre-tokenisation regex (PCRE2, Unicode properties), maps each piece's
// bytes to GPT-2's printable unicode alphabet and applies the merges by rank;
// decoding concatenates the tokens' bytes. Tested against transformers'
// GPT2Tokenizer on a few hundred strings (tests/unit/test_bpe.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pooch::bpe {

class Tokenizer {
 public:
  // Reads and checks the two files (Error POOCH_ERR_BAD_INPUT naming the
  // file and the entry or line).
  static Tokenizer load(const std::string& vocab_path, const std::string& merges_path);
  // The same from the files' contents (what a fuzz target calls); the names
  // are for messages.
  static Tokenizer parse(std::string_view vocab_json, std::string_view merges_txt,
                         const std::string& vocab_name = "vocab.json",
                         const std::string& merges_name = "merges.txt");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of UTF-8 text (Error POOCH_ERR_BAD_INPUT naming the byte
  // offset where the text is not valid UTF-8). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of the tokens, concatenated (a token may end inside a UTF-8
  // character: a streaming caller prints bytes as they come). Error
  // POOCH_ERR_INVALID_ARG for an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& token_bytes(int32_t id) const;

  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  // The id of a special token ("<|endoftext|>"), or -1.
  int32_t special_id(std::string_view token) const;

 private:
  Tokenizer();
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;        // token (mapped alphabet) -> id
  std::unordered_map<std::string, int32_t> merge_rank_;   // "a b" -> rank
  std::vector<std::string> bytes_;                        // id -> the bytes it stands for
  std::vector<std::pair<std::string, int32_t>> special_;  // matched verbatim before the regex
  struct Regex;
  std::unique_ptr<Regex> re_;
};

// GPT-2's map from bytes to printable unicode characters (UTF-8 encoded):
// printable Latin-1 bytes map to themselves, the others to U+0100 onwards.
const std::string& byte_to_unicode(uint8_t b);

// `bytes` with each maximal invalid UTF-8 subsequence replaced by U+FFFD, as
// Python's bytes.decode("utf-8", errors="replace") does (how transformers
// decodes).
std::string utf8_replace_invalid(std::string_view bytes);

// The offset of the first byte that is not part of valid UTF-8, or npos.
size_t utf8_invalid_at(std::string_view s);

}  // namespace pooch::bpe
