// libFuzzer target: GPT-2 checkpoints of other programs
// (formats/gpt_checkpoint.cpp), what `pooch-run import --from` reads:
// - the input as Hugging Face's config.json (parse_hf_config): an accepted
//   config writes back (hf_config_json) to one that reads back the same;
// - the input as an llm.c gpt2_*.bin file (read_llmc): every weight it
//   hands out holds exactly its shape's elements, and there are
//   no more of them than the file's bytes after the header can hold.
#include "formats/gpt_checkpoint.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using pooch::gpt_ckpt::GptConfig;

bool same(const GptConfig& a, const GptConfig& b) {
  return a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_embd == b.n_embd &&
         a.n_ctx == b.n_ctx && a.vocab_size == b.vocab_size &&
         a.layer_norm_epsilon == b.layer_norm_epsilon;
}

void hf_config(std::string_view text) {
  GptConfig c;
  try {
    c = pooch::gpt_ckpt::parse_hf_config(text, "config.json");
  } catch (const pooch::Error&) {
    return;
  }
  const GptConfig back =
      pooch::gpt_ckpt::parse_hf_config(pooch::gpt_ckpt::hf_config_json(c), "written");
  if (!same(c, back)) pooch_fuzz::finding("config.json written back reads differently");
}

void llmc(const uint8_t* data, size_t size) {
  const std::string path = pooch_fuzz::input_path(".bin");
  pooch_fuzz::write_input(path, data, size);
  uint64_t elements = 0;
  try {
    pooch::gpt_ckpt::read_llmc(path, [&](pooch::gpt_ckpt::Weight&& w) {
      int64_t n = 1;
      for (int64_t d : w.shape) n *= d;
      if (n != static_cast<int64_t>(w.data.size()))
        pooch_fuzz::finding("a weight's data does not match its shape: " + w.name);
      elements += w.data.size();
    });
  } catch (const pooch::Error&) {
    return;
  }
  // Accepted: the weights came from the bytes after the 1024-byte header
  // (2 or 4 bytes each; llm.c pads wte, whose extra rows are dropped).
  if (elements * 2 > size - 1024) pooch_fuzz::finding("more weights than the file holds");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hf_config(pooch_fuzz::as_text(data, size));
  llmc(data, size);
  return 0;
}
