// Text generation with a language model: a decoder session (one token per
// step over a KV cache that lives in the arena; build_gpt_decoder) fed the
// prompt and then its own samples, one token at a time, each handed to a
// callback as soon as it exists (streaming; the callback may stop it).
//
// Sampling follows the usual order: logits / temperature, keep the top_k
// largest, keep the smallest set whose probability reaches top_p, draw.
// temperature 0 is greedy decoding (the largest logit; ties to the lower
// id). A draw uses a counter-based random number keyed by (seed, the
// token's index), so a seed gives the same tokens on every run, backend and
// thread count that gives the same logits.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "../../formats/pooch_file.h"
#include "../models/model_spec.h"
#include "../session/session.h"

namespace pooch {

struct SamplingConfig {
  int64_t max_tokens =
      32;  // new tokens at most (fewer when the context fills or the callback stops)
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // 1: no limit
  uint64_t seed = 1;
};

// Why generation ended.
enum class StopReason { max_tokens, context_full, callback };

// Receives each new token and its index among the new tokens (0-based);
// returns false to stop after it.
using TokenCallback = std::function<bool(int32_t token, int64_t index)>;

// Checks a sampling configuration (Error POOCH_ERR_INVALID_ARG naming the field).
void validate_sampling(const SamplingConfig& c);

// The token drawn from one row of V logits, for the token at `index`
// (which random number it takes). `scratch` holds at least V entries.
int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& c, uint64_t index,
                     std::vector<std::pair<float, int32_t>>& scratch);

class Generator {
 public:
  // A decoder for a gpt spec (its run shape is ignored: one sequence of up
  // to n_ctx tokens) on the backend `cfg` asks for; cfg.train is ignored.
  // Its weights start as the builder initialises them (zeros with
  // cfg.initialise false, the quicker start when they are set at once): set
  // them with copy_weights or load_weights.
  Generator(const ModelSpec& spec, SessionConfig cfg);
  ~Generator();

  // Every weight the decoder has, from a session of the same model (by name).
  void copy_weights(const Session& from);
  // The same from a model or checkpoint file; errors name the file and tensor.
  void load_weights(const PoochFile& f);

  // Feeds the prompt (1 to n_ctx tokens, each in [0, vocab)), then samples
  // up to c.max_tokens new tokens, calling `on_token` (may be empty) with
  // each. Returns the new tokens; *why (if given) says why it ended.
  std::vector<int32_t> generate(std::span<const int32_t> prompt, const SamplingConfig& c,
                                const TokenCallback& on_token, StopReason* why = nullptr);

  Session& session() { return *session_; }
  const ModelSpec& spec() const { return spec_; }

 private:
  // Runs one token at position `pos` through the decoder; returns its logits.
  const float* step(int32_t token, int64_t pos);
  ModelSpec spec_;
  std::unique_ptr<Session> session_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace pooch
