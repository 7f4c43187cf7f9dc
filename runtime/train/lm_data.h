// Language-model data for the generic trainer: a token stream cut into
// windows of context+1 tokens (inputs are the first `context`, targets the
// same shifted by one), a validation split taken from the stream's tail, a
// BatchSource that stages [B, T] token and target rows, and the validation
// loss and perplexity over a split. The window order of each epoch comes from
// train()'s seeded shuffle, so a run is deterministic per seed and resumes
// bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../session/session.h"
#include "trainer.h"

namespace pooch {

// The model inputs an LM batch fills (names as the model declares them).
// With `targets` empty, `tokens` takes whole windows, [B, context + 1].
struct LmInputs {
  std::string tokens = "tokens";
  std::string targets = "targets";
};

// Non-overlapping windows over a token range: window r covers tokens
// [r * context, r * context + context + 1) (consecutive windows share one
// token: the last target of one is the first input of the next).
struct LmWindows {
  const int32_t* tokens = nullptr;
  int64_t count = 0;
  int64_t context = 0;
  int64_t rows() const { return context > 0 && count > context ? (count - 1) / context : 0; }
  // Window r's inputs into in[context] and targets into tgt[context]
  // (tgt null: in takes all context + 1 tokens).
  void fill(int64_t r, int32_t* in, int32_t* tgt) const;
};

// The training and validation parts of one stream: the last
// round(val_fraction * count) tokens (at least context + 1 when the fraction
// is positive) are for validation, the rest for training. Error
// POOCH_ERR_BAD_INPUT (the data are too short for the model) when either
// part holds no window, naming the counts; POOCH_ERR_INVALID_ARG for a
// context or fraction out of range.
struct LmSplit {
  LmWindows train, val;
};
LmSplit split_tokens(const std::vector<int32_t>& tokens, int64_t context, double val_fraction,
                     const std::string& source);

// Stages rows order[first, first + n) of `w` into the session's inputs.
class LmBatchSource : public BatchSource {
 public:
  LmBatchSource(Session& s, LmWindows w, LmInputs in = {});
  int64_t rows() const override { return w_.rows(); }
  void load(const std::vector<int64_t>& order, int64_t first, int64_t n) override;
  // The same rows into plain buffers ([n, context] each; tgt null: [n, context + 1] into in).
  void fill(const std::vector<int64_t>& order, int64_t first, int64_t n, int32_t* in,
            int32_t* tgt) const;

 private:
  Session& s_;
  LmWindows w_;
  LmInputs in_;
  std::vector<int32_t> tok_, tgt_;
};

struct LmEval {
  double loss = 0;        // mean cross-entropy per token (nats)
  double perplexity = 0;  // exp(loss)
  int64_t windows = 0;
};

// Mean loss of the session's evaluate program over every window of `w`, in
// order, batch by batch (a short last batch is weighted by its rows).
LmEval evaluate_lm(Session& s, const LmWindows& w, const LmInputs& in = {});

// The context length of a model's LM inputs: the second dimension of the
// tokens input ([B, T], or [B, T + 1] without a targets input). Error
// POOCH_ERR_INVALID_ARG when the model has no such input.
int64_t lm_context(const Model& m, const LmInputs& in = {});

// What identifies a token stream (TrainConfig::data_fingerprint): an xxh3-64
// hash over the count and every id, with the count in words, e.g.
// "xxh3 5f0c5e2a91d3b7e4 (204674 tokens)".
std::string token_fingerprint(const int32_t* tokens, int64_t count);

struct LmTrainConfig {
  TrainConfig train;
  double val_fraction = 0.1;  // the stream's tail held out for validation (0: none)
  int64_t eval_every = 0;     // validation every this many steps (0: after each epoch only)
  LmInputs inputs;
};

// A validation measured during training.
struct LmEvalReport {
  uint64_t step = 0;
  LmEval eval;
};

// Trains a language model on one token stream with the generic trainer: the
// training windows in a seeded order per epoch, validation loss and
// perplexity every eval_every steps and after each epoch (the epoch's score
// is the negated validation loss), checkpoints and bit-exact resume as
// train() does. Tokens are checked against the vocabulary `vocab` first.
void train_lm(Session& s, const std::vector<int32_t>& tokens, int64_t vocab,
              const LmTrainConfig& cfg, TrainerState& state, const TrainCallbacks& cb,
              const std::function<void(const LmEvalReport&)>& on_eval, const std::string& source);

}  // namespace pooch
