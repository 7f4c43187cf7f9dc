#include "gpt_spec.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "../../kernels/common/util.h"
#include "../core/error.h"

namespace pooch {

namespace {

using json = nlohmann::json;

struct NamedSize {
  const char* name;
  int64_t n_layer, n_head, n_embd;
};

// GPT-2's published configurations (n_ctx 1024, vocabulary 50 257 for all).
constexpr NamedSize kSizes[] = {
    {"gpt2", 12, 12, 768},
    {"gpt2-medium", 24, 16, 1024},
    {"gpt2-large", 36, 20, 1280},
    {"gpt2-xl", 48, 25, 1600},
};

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: {}", source, what));
}

}  // namespace

GptSpec gpt_size(const std::string& name) {
  for (const NamedSize& s : kSizes)
    if (iequals(name, s.name)) {
      GptSpec g;
      g.n_layer = s.n_layer;
      g.n_head = s.n_head;
      g.n_embd = s.n_embd;
      return g;
    }
  throw Error(POOCH_ERR_INVALID_ARG,
              fmt::format("unknown gpt size '{}': use gpt2 (124M), gpt2-medium (355M), "
                          "gpt2-large (774M) or gpt2-xl (1.5B)",
                          name));
}

ModelSpec gpt_spec(const GptSpec& g, int64_t batch, int64_t seq, uint64_t seed) {
  ModelSpec s;
  s.family = Family::gpt;
  s.input = InputKind::dense;
  s.loss = LossKind::softmax;
  s.gpt = g;
  s.run.batch = batch;
  s.run.seq = seq;
  s.seed = seed;
  return s;
}

void validate_gpt_spec(const ModelSpec& s) {
  const GptSpec& g = s.gpt;
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw Error(POOCH_ERR_INVALID_ARG, what);
  };
  constexpr int64_t kMax = INT32_MAX;
  auto in_range = [&](const char* field, int64_t v, int64_t lo, int64_t hi, const char* why) {
    req(v >= lo && v <= hi,
        fmt::format("{} is {}; it must be from {} to {}{}", field, v, lo, hi, why));
  };
  in_range("n_layer", g.n_layer, 1, 100000, "");
  in_range("n_head", g.n_head, 1, kMax, "");
  in_range("n_embd", g.n_embd, 1, kMax, "");
  in_range("n_ctx", g.n_ctx, 1, kMax, " (positions are 32-bit ids)");
  in_range("vocab_size", g.vocab_size, 1, kMax, " (token ids are 32-bit)");
  req(g.n_embd % g.n_head == 0,
      fmt::format("n_embd ({}) must be a multiple of n_head ({}): each head takes n_embd/n_head "
                  "channels",
                  g.n_embd, g.n_head));
  req(g.dropout >= 0 && g.dropout < 1, fmt::format("dropout must be in [0, 1), got {}", g.dropout));
  req(std::isfinite(g.layer_norm_epsilon) && g.layer_norm_epsilon >= 0,
      fmt::format("layer_norm_epsilon must be finite and >= 0, got {}", g.layer_norm_epsilon));
  const int64_t seq = s.run.seq == 0 ? g.n_ctx : s.run.seq;
  in_range("seq", seq, 1, g.n_ctx, " (the context length n_ctx)");
  in_range("batch", s.run.batch, 1, kMax / seq, " (a batch's tokens are counted in 32 bits)");
}

ModelSpec gpt_spec_from_json(const json& j, const std::string& src) {
  static const char* const known[] = {"family",     "size",    "n_layer",
                                      "n_head",     "n_embd",  "n_ctx",
                                      "vocab_size", "dropout", "layer_norm_epsilon",
                                      "batch",      "seq",     "seed"};
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      bad(src, fmt::format("the spec: unknown field \"{}\" for family gpt (known: {})", key, list));
    }
  }
  GptSpec g;
  if (j.contains("size")) {
    if (!j["size"].is_string()) bad(src, "size must be a string (gpt2, gpt2-medium, ...)");
    try {
      g = gpt_size(j["size"].get<std::string>());
    } catch (const Error& e) {
      bad(src, e.what());
    }
  }
  auto integer = [&](const char* key, int64_t& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_number_integer()) bad(src, fmt::format("{} must be an integer", key));
    out = j[key].get<int64_t>();
  };
  auto number = [&](const char* key, double& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_number()) bad(src, fmt::format("{} must be a number", key));
    out = j[key].get<double>();
  };
  integer("n_layer", g.n_layer);
  integer("n_head", g.n_head);
  integer("n_embd", g.n_embd);
  integer("n_ctx", g.n_ctx);
  integer("vocab_size", g.vocab_size);
  number("dropout", g.dropout);
  number("layer_norm_epsilon", g.layer_norm_epsilon);
  ModelSpec s = gpt_spec(g, 8, 0);
  integer("batch", s.run.batch);
  integer("seq", s.run.seq);
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned())
      bad(src, fmt::format("seed is {}; it must be from 0 to {}", j["seed"].dump(), UINT64_MAX));
    s.seed = j["seed"].get<uint64_t>();
  }
  try {
    validate_gpt_spec(s);
  } catch (const Error& e) {
    bad(src, e.what());
  }
  return s;
}

std::string gpt_spec_to_json(const ModelSpec& s) {
  const GptSpec& g = s.gpt;
  json j{{"family", "gpt"},      {"n_layer", g.n_layer},
         {"n_head", g.n_head},   {"n_embd", g.n_embd},
         {"n_ctx", g.n_ctx},     {"vocab_size", g.vocab_size},
         {"dropout", g.dropout}, {"layer_norm_epsilon", g.layer_norm_epsilon},
         {"batch", s.run.batch}, {"seq", s.run.seq},
         {"seed", s.seed}};
  return j.dump(2);
}

}  // namespace pooch
