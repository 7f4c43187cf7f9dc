// libFuzzer target: llm.c token files (formats/token_file.cpp, parse_llmc),
// the training data of `pooch-run train` for language models. An accepted
// file's tokens must all be uint16 values.
#include "formats/token_file.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::vector<int32_t> t = pooch::tokens::parse_llmc(data, size, "fuzz.bin");
    for (int32_t v : t)
      if (v < 0 || v > 65535) pooch_fuzz::finding("parse_llmc returned a token outside uint16");
    try {
      pooch::tokens::check_vocab(t, 50257, "fuzz.bin");
    } catch (const pooch::Error&) {
    }
  } catch (const pooch::Error&) {
  }
  return 0;
}
