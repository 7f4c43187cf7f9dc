#include "gpt_spec.h"

#include <fmt/format.h>

#include <algorithm>
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
  // GPT-3 has 96 layers. The bound keeps a 100-byte spec from building a
  // graph of millions of ops (gigabytes and a minute before any check).
  in_range("n_layer", g.n_layer, 1, 1024, "");
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
  const LoraSpec& l = g.lora;
  in_range("lora.rank", l.rank, 0, std::min(g.n_embd, int64_t{65536}),
           " (0: no adapters; above n_embd an adapter is a full-rank update)");
  if (l.rank > 0) {
    req(std::isfinite(l.alpha) && l.alpha >= 0 && l.alpha <= 1e6,
        fmt::format("lora.alpha must be from 0 (meaning the rank) to 1e6, got {}", l.alpha));
    req(l.attn || l.mlp, "lora.targets must name attn, mlp or both");
  }
  const int64_t seq = s.run.seq == 0 ? g.n_ctx : s.run.seq;
  in_range("seq", seq, 1, g.n_ctx, " (the context length n_ctx)");
  in_range("batch", s.run.batch, 1, kMax / seq, " (a batch's tokens are counted in 32 bits)");
}

static LoraSpec lora_from_json(const json& j, const std::string& src) {
  if (!j.is_object())
    bad(src,
        "lora must be an object: {\"rank\": R, \"alpha\": A, \"targets\": [\"attn\", \"mlp\"]}");
  LoraSpec l;
  for (const auto& [key, v] : j.items()) {
    if (key == "rank") {
      if (!v.is_number_integer()) bad(src, "lora.rank must be an integer");
      l.rank = v.get<int64_t>();
    } else if (key == "alpha") {
      if (!v.is_number()) bad(src, "lora.alpha must be a number");
      l.alpha = v.get<double>();
    } else if (key == "targets") {
      std::string list;
      if (v.is_array())
        for (const json& t : v) {
          if (!t.is_string()) bad(src, "lora.targets must be a list of \"attn\" and \"mlp\"");
          if (!list.empty()) list += ',';
          list += t.get<std::string>();
        }
      else
        bad(src, "lora.targets must be a list of \"attn\" and \"mlp\"");
      if (list.empty()) bad(src, "lora.targets must name attn, mlp or both");
      try {
        set_lora_targets(l, list);
      } catch (const Error& e) {
        bad(src, e.what());
      }
    } else {
      bad(src,
          fmt::format("the spec: unknown field \"lora.{}\" (known: rank, alpha, targets)", key));
    }
  }
  return l;
}

void set_lora_targets(LoraSpec& l, const std::string& list) {
  l.attn = l.mlp = false;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string t = list.substr(at, comma - at);
    if (iequals(t, "attn"))
      l.attn = true;
    else if (iequals(t, "mlp"))
      l.mlp = true;
    else
      throw Error(POOCH_ERR_INVALID_ARG,
                  fmt::format("lora targets: unknown target '{}' in '{}' (use attn, mlp or "
                              "attn,mlp)",
                              t, list));
    at = comma + 1;
  }
}

ModelSpec gpt_spec_from_json(const json& j, const std::string& src) {
  static const char* const known[] = {"family",     "size",    "n_layer",
                                      "n_head",     "n_embd",  "n_ctx",
                                      "vocab_size", "dropout", "layer_norm_epsilon",
                                      "batch",      "seq",     "seed",
                                      "lora"};
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
  if (j.contains("lora")) g.lora = lora_from_json(j["lora"], src);
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
  if (const LoraSpec& l = g.lora; l.rank > 0) {
    json targets = json::array();
    if (l.attn) targets.push_back("attn");
    if (l.mlp) targets.push_back("mlp");
    j["lora"] = {{"rank", l.rank}, {"alpha", l.alpha}, {"targets", targets}};
  }
  return j.dump(2);
}

}  // namespace pooch
