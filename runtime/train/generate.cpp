#include "generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../../kernels/common/philox.h"
#include "../core/error.h"
#include "../models/gpt.h"

namespace pooch {

namespace {

// The random stream of sampling draws (apart from dropout keys and weight
// initialisers).
constexpr uint32_t kSampleKey = 0x53414D50u;  // "SAMP"

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void validate_sampling(const SamplingConfig& c) {
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw Error(POOCH_ERR_INVALID_ARG, what);
  };
  req(c.max_tokens >= 0, fmt::format("max_tokens is {}; it must be >= 0", c.max_tokens));
  req(std::isfinite(c.temperature) && c.temperature >= 0,
      fmt::format("temperature is {}; it must be finite and >= 0 (0: greedy)", c.temperature));
  req(c.top_k >= 0, fmt::format("top_k is {}; it must be >= 0 (0: no limit)", c.top_k));
  req(c.top_p > 0 && c.top_p <= 1,
      fmt::format("top_p is {}; it must be in (0, 1] (1: no limit)", c.top_p));
}

int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& c, uint64_t index,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  if (c.temperature == 0 || c.top_k == 1) {
    // Greedy: the first of the largest (NaN never wins).
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[v] > logits[best] || std::isnan(logits[best])) best = v;
    return static_cast<int32_t>(best);
  }
  scratch.resize(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v)
    scratch[static_cast<size_t>(v)] = {std::isnan(logits[v]) ? -INFINITY : logits[v],
                                       static_cast<int32_t>(v)};
  // Descending by logit, ties to the lower id: the order top-k and top-p cut in.
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t n = V;
  if (c.top_k > 0 && c.top_k < V) {
    std::partial_sort(scratch.begin(), scratch.begin() + c.top_k, scratch.end(), by_logit);
    n = c.top_k;
  } else {
    std::sort(scratch.begin(), scratch.end(), by_logit);
  }
  // Probabilities of the kept entries, in double.
  const double top = scratch[0].first;
  std::vector<double> p(static_cast<size_t>(n));
  double z = 0;
  for (int64_t i = 0; i < n; ++i) {
    p[static_cast<size_t>(i)] =
        std::exp((scratch[static_cast<size_t>(i)].first - top) / c.temperature);
    z += p[static_cast<size_t>(i)];
  }
  if (c.top_p < 1) {
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      cum += p[static_cast<size_t>(i)] / z;
      if (cum >= c.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    z = 0;
    for (int64_t i = 0; i < n; ++i) z += p[static_cast<size_t>(i)];
  }
  const double u = static_cast<double>(kern::philox_uniform(c.seed, index, kSampleKey, 0)) * z;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += p[static_cast<size_t>(i)];
    if (u < cum) return scratch[static_cast<size_t>(i)].second;
  }
  return scratch[static_cast<size_t>(n - 1)].second;
}

Generator::Generator(const ModelSpec& spec, SessionConfig cfg) : spec_(spec) {
  cfg.train = false;
  session_ = std::make_unique<Session>(std::shared_ptr<Model>(build_gpt_decoder(spec, 1)), cfg);
}

Generator::~Generator() = default;

void Generator::copy_weights(const Session& from) {
  const Graph& g = session_->graph();
  for (const TensorDesc& d : g.tensors()) {
    if (d.role != Role::weight || ends_with(d.name, kKvCacheSuffix)) continue;
    const std::vector<std::byte> bytes = from.read_tensor(d.name);
    if (bytes.size() != d.bytes())
      throw Error(
          POOCH_ERR_INVALID_ARG,
          fmt::format("weight '{}' has {} bytes in the source session; the decoder's {} "
                      "{} needs {}",
                      d.name, bytes.size(), dtype_name(d.dtype), shape_str(d.shape), d.bytes()));
    session_->write_tensor(d.name, bytes.data(), bytes.size());
  }
}

void Generator::load_weights(const PoochFile& f) {
  const Graph& g = session_->graph();
  for (const TensorDesc& d : g.tensors()) {
    if (d.role != Role::weight || ends_with(d.name, kKvCacheSuffix)) continue;
    const TensorEntry* e = f.find(d.name);
    if (!e)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: has no tensor '{}', which the decoder needs", f.path(), d.name));
    if (e->dtype != d.dtype || e->shape != d.shape)
      throw Error(POOCH_ERR_BAD_INPUT,
                  fmt::format("{}: tensor '{}' is {} {} in the file but the decoder needs {} {}",
                              f.path(), d.name, dtype_name(e->dtype), shape_str(e->shape),
                              dtype_name(d.dtype), shape_str(d.shape)));
    const auto bytes = f.data(*e);
    session_->write_tensor(d.name, bytes.data(), bytes.size());
  }
}

const float* Generator::step(int32_t token, int64_t pos) {
  const auto p = static_cast<int32_t>(pos);
  session_->set_input("decode.tokens", &token, sizeof token);
  session_->set_input("decode.pos", &p, sizeof p);
  session_->run(ProgramKind::forward);
  return static_cast<const float*>(session_->output_buffer("logits"));
}

std::vector<int32_t> Generator::generate(std::span<const int32_t> prompt, const SamplingConfig& c,
                                         const TokenCallback& on_token, StopReason* why) {
  validate_sampling(c);
  const int64_t V = spec_.gpt.vocab_size, ctx = spec_.gpt.n_ctx;
  if (prompt.empty())
    throw Error(POOCH_ERR_INVALID_ARG, "the prompt is empty; give at least one token");
  if (static_cast<int64_t>(prompt.size()) > ctx)
    throw Error(
        POOCH_ERR_INVALID_ARG,
        fmt::format("the prompt has {} tokens; the model's context holds {}", prompt.size(), ctx));
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw Error(
          POOCH_ERR_INVALID_ARG,
          fmt::format("prompt token {} is {}; token ids run from 0 to {}", i, prompt[i], V - 1));
  const float* logits = nullptr;
  for (size_t i = 0; i < prompt.size(); ++i) logits = step(prompt[i], static_cast<int64_t>(i));
  std::vector<int32_t> out;
  int64_t pos = static_cast<int64_t>(prompt.size());
  StopReason reason = StopReason::max_tokens;
  while (static_cast<int64_t>(out.size()) < c.max_tokens) {
    const int32_t next = sample_token(logits, V, c, out.size(), scratch_);
    out.push_back(next);
    if (on_token && !on_token(next, static_cast<int64_t>(out.size()) - 1)) {
      reason = StopReason::callback;
      break;
    }
    if (static_cast<int64_t>(out.size()) == c.max_tokens) break;
    if (pos >= ctx) {
      reason = StopReason::context_full;
      break;
    }
    logits = step(next, pos++);
  }
  if (why) *why = reason;
  return out;
}

}  // namespace pooch
