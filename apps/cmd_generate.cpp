// pooch-run generate: a gpt model continues a prompt, each token written to
// stdout as soon as it is sampled. Text in and out through GPT-2's BPE
// tokenizer (--tokenizer DIR) or byte by byte for a byte-level model (a
// vocabulary of 256); token ids otherwise (--ids forces them).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "sigint.h"

namespace cli {

namespace {

struct GenerateOpts {
  std::string model, tokenizer, prompt, prompt_tokens;
  bool ids = false;
  bool slide = false;
  pooch_generate_params params{};
  DeviceFlags device;
  Output output{"generate"};
};

// How tokens become output.
enum class Mode { ids, text, bytes };

struct Stream {
  Mode mode = Mode::ids;
  const pooch_tokenizer* tok = nullptr;
  std::vector<int32_t> tokens;
  bool interrupted = false;
};

int on_token(void* user, int32_t token, int64_t) {
  auto* s = static_cast<Stream*>(user);
  s->tokens.push_back(token);
  if (s->mode == Mode::ids) {
    std::printf("%s%d", s->tokens.size() > 1 ? " " : "", token);
  } else if (s->mode == Mode::bytes) {
    std::putchar(token);
  } else {
    const char* b = nullptr;
    size_t n = 0;
    if (pooch_tokenizer_token(s->tok, token, &b, &n) == POOCH_OK) std::fwrite(b, 1, n, stdout);
  }
  std::fflush(stdout);
  if (sigint_received()) {
    s->interrupted = true;
    return 0;
  }
  return 1;
}

// "1 2 3" or "1,2,3" into ids; false (with *bad the offending word) when a
// word is not a non-negative integer.
bool parse_ids(const std::string& text, std::vector<int32_t>* ids, std::string* bad) {
  std::string t = text;
  for (char& c : t)
    if (c == ',') c = ' ';
  std::istringstream in(t);
  std::string w;
  while (in >> w) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(w, &used);
    } catch (...) {
      used = 0;
    }
    if (used != w.size() || v < 0 || v > 2147483647) {
      *bad = w;
      return false;
    }
    ids->push_back(static_cast<int32_t>(v));
  }
  return true;
}

int run_generate(GenerateOpts& o) {
  Output& out = o.output;
  Json& res = out.result();
  if (o.prompt.empty() == o.prompt_tokens.empty())
    return out.fail(kUsage, "generate: give --prompt TEXT or --prompt-tokens IDS (one of them)");
  ModelHandle model;
  if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
    return out.fail(st, "--model " + o.model);
  if (std::string(pooch_model_family(model.p)) != "gpt")
    return out.fail(kUsage, "--model " + o.model + ": a model of family '" +
                                pooch_model_family(model.p) + "'; generation needs a gpt model");
  const Json spec = Json::parse(pooch_model_spec_json(model.p), nullptr, false);
  const int64_t vocab = spec.is_object() ? spec.value("vocab_size", int64_t{0}) : 0;
  const int64_t n_ctx = spec.is_object() ? spec.value("n_ctx", int64_t{1}) : 1;

  Stream stream;
  TokenizerHandle tok;
  if (!o.tokenizer.empty()) {
    const std::string v = o.tokenizer + "/vocab.json", m = o.tokenizer + "/merges.txt";
    if (pooch_status st = pooch_tokenizer_load(v.c_str(), m.c_str(), &tok.p))
      return out.fail(st, "--tokenizer " + o.tokenizer);
    if (pooch_tokenizer_vocab_size(tok.p) > vocab)
      return out.fail(kBadInput, "--tokenizer " + o.tokenizer + ": " +
                                     std::to_string(pooch_tokenizer_vocab_size(tok.p)) +
                                     " tokens, more than the model's vocabulary (" +
                                     std::to_string(vocab) + ")");
    stream.mode = Mode::text;
    stream.tok = tok.p;
  } else if (vocab == 256) {
    stream.mode = Mode::bytes;
  }
  if (o.ids) stream.mode = Mode::ids;

  std::vector<int32_t> prompt;
  if (!o.prompt_tokens.empty()) {
    std::string bad;
    if (!parse_ids(o.prompt_tokens, &prompt, &bad))
      return out.fail(kBadInput, "--prompt-tokens: '" + bad + "' is not a token id");
    if (prompt.empty()) return out.fail(kBadInput, "--prompt-tokens: no ids given");
  } else if (tok.p) {
    int64_t n = 0;
    if (pooch_status st =
            pooch_tokenizer_encode(tok.p, o.prompt.data(), o.prompt.size(), nullptr, 0, &n))
      return out.fail(st, "--prompt");
    prompt.resize(static_cast<size_t>(n));
    if (pooch_status st =
            pooch_tokenizer_encode(tok.p, o.prompt.data(), o.prompt.size(), prompt.data(), n, &n))
      return out.fail(st, "--prompt");
  } else if (vocab == 256) {
    for (unsigned char c : o.prompt) prompt.push_back(c);
  } else {
    return out.fail(kUsage, "--prompt: the model's vocabulary has " + std::to_string(vocab) +
                                " tokens, not bytes; give its --tokenizer DIR (vocab.json, "
                                "merges.txt) or --prompt-tokens IDS");
  }

  // The training step a session plans is the smallest there is (one row of
  // one token); generation runs on a decoder of its own.
  if (pooch_status st = pooch_model_set_run_shape(model.p, 1, 0, 0))
    return out.fail(st, "--model " + o.model);
  if (pooch_status st = pooch_model_set_sequence_length(model.p, 1))
    return out.fail(st, "--model " + o.model);
  SessionHandle s;
  if (int rc = open_session(model.p, o.device, s, out)) return rc;

  // The prompt as text first (the continuation follows it), unless ids.
  if (stream.mode != Mode::ids && !o.prompt.empty()) {
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    std::fflush(stdout);
  }
  const auto t0 = std::chrono::steady_clock::now();
  pooch_status st = POOCH_OK;
  {
    SigintGuard guard;
    // With --slide, a full context starts a new call from its last half
    // (each call's draws keyed by seed + its number, so a seed still gives
    // one sequence).
    std::vector<int32_t> context = prompt;
    pooch_generate_params p = o.params;
    for (int64_t call = 0;; ++call) {
      p.seed = o.params.seed + static_cast<uint64_t>(call);
      const size_t before = stream.tokens.size();
      st = pooch_generate(s.p, context.data(), static_cast<int64_t>(context.size()), &p, on_token,
                          &stream, nullptr, 0, nullptr);
      const auto got = static_cast<int64_t>(stream.tokens.size() - before);
      p.max_tokens -= got;
      if (st != POOCH_OK || !o.slide || stream.interrupted || p.max_tokens <= 0) break;
      context.insert(context.end(), stream.tokens.begin() + static_cast<std::ptrdiff_t>(before),
                     stream.tokens.end());
      const auto keep = static_cast<size_t>(std::max<int64_t>(1, n_ctx / 2));
      if (context.size() > keep)
        context.erase(context.begin(), context.end() - static_cast<std::ptrdiff_t>(keep));
    }
  }
  const double secs = seconds_since(t0);
  std::printf("\n");
  std::fflush(stdout);
  if (st != POOCH_OK) return out.fail(st, "generating");
  res["model"] = o.model;
  res["prompt_tokens"] = prompt;
  res["tokens"] = stream.tokens;
  res["seconds"] = secs;
  res["interrupted"] = stream.interrupted;
  if (!out.json)
    std::fprintf(stderr, "%zu tokens in %.2f s%s\n", stream.tokens.size(), secs,
                 stream.interrupted ? " (interrupted)" : "");
  return stream.interrupted ? kInterrupted : kOk;
}

}  // namespace

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOpts>();
  pooch_generate_default_params(&o->params);
  CLI::App* c = app.add_subcommand("generate", "Continue a prompt with a gpt model, streaming");
  c->add_option("--model", o->model, "The gpt model (or checkpoint)")
      ->type_name("M.pooch")
      ->required();
  c->add_option("--prompt", o->prompt, "The text to continue")->type_name("TEXT");
  c->add_option("--prompt-tokens", o->prompt_tokens,
                "The token ids to continue, separated by spaces or commas")
      ->type_name("IDS");
  c->add_option("--tokenizer", o->tokenizer,
                "A directory holding the model's vocab.json and merges.txt (GPT-2's BPE): "
                "text in and out")
      ->type_name("DIR");
  c->add_flag("--ids", o->ids, "Write the new token ids instead of text");
  c->add_flag("--slide", o->slide,
              "When the context fills, go on from its last half (up to --max-tokens)");
  c->add_option("--max-tokens", o->params.max_tokens,
                "New tokens at most (fewer when the context fills)")
      ->check(positive())
      ->capture_default_str();
  c->add_option("--temperature", o->params.temperature, "Sampling temperature (0: greedy)")
      ->check(in_range(0, 100, false))
      ->capture_default_str();
  c->add_option("--top-k", o->params.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(non_negative())
      ->capture_default_str();
  c->add_option("--top-p", o->params.top_p,
                "Sample among the fewest tokens whose probability reaches p (1: all)")
      ->check(in_range(0, 1, false, true))
      ->capture_default_str();
  c->add_option("--seed", o->params.seed, "The same seed gives the same tokens")
      ->check(seed_range())
      ->capture_default_str();
  add_device_flags(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_generate(*o)); }};
}

}  // namespace cli
