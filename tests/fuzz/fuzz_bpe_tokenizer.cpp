// libFuzzer target: the GPT-2 BPE tokenizer's files (formats/bpe_tokenizer.cpp,
// Tokenizer::parse): vocab.json, a line "--merges--", merges.txt (without the
// line, the whole input is vocab.json and merges.txt is empty). A tokenizer
// that loads then encodes a fixed text and the input itself; whatever it
// encodes must decode back to the same bytes.
#include "formats/bpe_tokenizer.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

void round_trip(const pooch::bpe::Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const pooch::Error&) {
    return;  // not UTF-8, or a byte the vocabulary lacks
  }
  if (tok.decode(ids) != text) pooch_fuzz::finding("encode then decode changed the text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all = pooch_fuzz::as_text(data, size);
  constexpr std::string_view kSep = "\n--merges--\n";
  const size_t at = all.find(kSep);
  const std::string_view vocab = at == std::string_view::npos ? all : all.substr(0, at);
  const std::string_view merges =
      at == std::string_view::npos ? std::string_view() : all.substr(at + kSep.size());
  try {
    const pooch::bpe::Tokenizer tok = pooch::bpe::Tokenizer::parse(vocab, merges);
    round_trip(tok, "Hello world, it's 2024!  \xc3\xa9t\xc3\xa9\n");
    round_trip(tok, all);
  } catch (const pooch::Error&) {
  }
  return 0;
}
