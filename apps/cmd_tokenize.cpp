// pooch-run tokenize: text to token ids, with a model's GPT-2 BPE tokenizer
// (vocab.json + merges.txt) or byte by byte (--bytes). Writes an llm.c token
// file (--out), the data `finetune --data` reads, or prints the ids (for
// `generate --prompt-tokens`).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace cli {

namespace {

struct TokenizeOpts {
  std::string tokenizer;  // a directory holding vocab.json and merges.txt
  bool bytes = false;
  std::string text_file, text, out;
  bool eot = false;
  Output output{"tokenize"};
};

int run_tokenize(TokenizeOpts& o) {
  Output& out = o.output;
  if (o.bytes == !o.tokenizer.empty())
    return out.fail(kUsage, "tokenize: give --tokenizer DIR or --bytes (one of them)");
  if (o.text_file.empty() == o.text.empty())
    return out.fail(kUsage, "tokenize: give --text-file FILE or --text STRING (one of them)");
  if (o.eot && o.bytes)
    return out.fail(kUsage,
                    "tokenize: --eot needs --tokenizer (a byte vocabulary has no "
                    "<|endoftext|>)");
  if (int rc = check_output_paths({{"--out", o.out}}, out)) return rc;
  // The text's bytes: the library reads the file (and refuses what is not a
  // regular file) as ids 0..255.
  std::string text = o.text;
  if (!o.text_file.empty()) {
    TokensHandle b;
    int64_t n = 0;
    if (pooch_status st = pooch_tokens_load(o.text_file.c_str(), 1, &b.p, &n))
      return out.fail(st, "--text-file " + o.text_file);
    text.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) text[static_cast<size_t>(i)] = static_cast<char>(b.p[i]);
  }
  std::vector<int32_t> ids;
  if (o.bytes) {
    for (unsigned char c : text) ids.push_back(c);
  } else {
    TokenizerHandle t;
    const std::string vocab = o.tokenizer + "/vocab.json", merges = o.tokenizer + "/merges.txt";
    if (pooch_status st = pooch_tokenizer_load(vocab.c_str(), merges.c_str(), &t.p))
      return out.fail(st, "--tokenizer " + o.tokenizer);
    int64_t n = 0;
    if (pooch_status st = pooch_tokenizer_encode(t.p, text.data(), text.size(), nullptr, 0, &n))
      return out.fail(st, o.text_file.empty() ? "--text" : "--text-file " + o.text_file);
    ids.resize(static_cast<size_t>(n));
    if (pooch_status st = pooch_tokenizer_encode(t.p, text.data(), text.size(), ids.data(), n, &n))
      return out.fail(st, "encoding");
    if (o.eot) {
      const std::string eot = "<|endoftext|>";
      int32_t id = -1;
      int64_t k = 0;
      if (pooch_tokenizer_encode(t.p, eot.data(), eot.size(), &id, 1, &k) == POOCH_OK && k == 1)
        ids.push_back(id);
      else
        return out.fail(kBadInput, "--eot: " + vocab + " has no <|endoftext|> token");
    }
  }
  out.result()["tokens"] = ids.size();
  out.result()["bytes"] = text.size();
  if (!o.out.empty()) {
    if (pooch_status st =
            pooch_tokens_save(o.out.c_str(), ids.data(), static_cast<int64_t>(ids.size())))
      return out.fail(st, "--out " + o.out);
    std::printf("%zu bytes -> %zu tokens -> %s\n", text.size(), ids.size(), o.out.c_str());
    out.result()["out"] = o.out;
  } else if (!out.json) {
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
    std::printf("\n");
  } else {
    out.result()["ids"] = ids;
  }
  return kOk;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOpts>();
  CLI::App* c = app.add_subcommand(
      "tokenize", "Turn text into token ids (GPT-2 BPE or bytes): an llm.c token file or a list");
  c->add_option("--tokenizer", o->tokenizer, "A directory with GPT-2's vocab.json and merges.txt")
      ->type_name("DIR");
  c->add_flag("--bytes", o->bytes, "Byte-level ids (0..255) instead of a tokenizer");
  c->add_option("--text-file", o->text_file, "The UTF-8 text to tokenize")->type_name("FILE");
  c->add_option("--text", o->text, "The text to tokenize, given on the command line");
  c->add_option("--out", o->out, "Write an llm.c token file (uint16 ids) instead of printing ids")
      ->type_name("FILE.bin");
  c->add_flag("--eot", o->eot, "Append <|endoftext|> after the text");
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_tokenize(*o)); }};
}

}  // namespace cli
