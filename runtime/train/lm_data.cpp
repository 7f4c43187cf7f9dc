#include "lm_data.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../../formats/token_file.h"
#include "../core/error.h"

namespace pooch {

void LmWindows::fill(int64_t r, int32_t* in, int32_t* tgt) const {
  const int32_t* w = tokens + r * context;
  if (!tgt) {
    std::memcpy(in, w, static_cast<size_t>(context + 1) * 4);
    return;
  }
  std::memcpy(in, w, static_cast<size_t>(context) * 4);
  std::memcpy(tgt, w + 1, static_cast<size_t>(context) * 4);
}

LmSplit split_tokens(const std::vector<int32_t>& tokens, int64_t context, double val_fraction,
                     const std::string& source) {
  if (context <= 0)
    throw Error(POOCH_ERR_INVALID_ARG, fmt::format("the context length is {}", context));
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the validation fraction is {}, not in [0, 1)", val_fraction));
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t val = 0;
  if (val_fraction > 0)
    val = std::max<int64_t>(std::llround(val_fraction * static_cast<double>(n)), context + 1);
  LmSplit s;
  s.train = {tokens.data(), std::max<int64_t>(n - val, 0), context};
  s.val = {tokens.data() + s.train.count, n - s.train.count, context};
  if (s.train.rows() == 0 || (val_fraction > 0 && s.val.rows() == 0))
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: {} tokens give {} training and {} validation windows of {} + 1 "
                            "tokens; each part needs at least one (more data, a shorter context "
                            "or another validation fraction)",
                            source, n, s.train.rows(), s.val.rows(), context));
  return s;
}

LmBatchSource::LmBatchSource(Session& s, LmWindows w, LmInputs in)
    : s_(s), w_(w), in_(std::move(in)) {
  const int64_t b = s.model().batch;
  tok_.resize(static_cast<size_t>(b * (w_.context + 1)));
  tgt_.resize(static_cast<size_t>(b * w_.context));
}

void LmBatchSource::fill(const std::vector<int64_t>& order, int64_t first, int64_t n, int32_t* in,
                         int32_t* tgt) const {
  const int64_t width = tgt ? w_.context : w_.context + 1;
  for (int64_t i = 0; i < n; ++i)
    w_.fill(order[static_cast<size_t>(first + i)], in + i * width,
            tgt ? tgt + i * w_.context : nullptr);
}

void LmBatchSource::load(const std::vector<int64_t>& order, int64_t first, int64_t n) {
  const bool split = !in_.targets.empty();
  fill(order, first, n, tok_.data(), split ? tgt_.data() : nullptr);
  const int64_t width = split ? w_.context : w_.context + 1;
  s_.set_input(in_.tokens, tok_.data(), static_cast<size_t>(n * width) * 4);
  if (split) s_.set_input(in_.targets, tgt_.data(), static_cast<size_t>(n * w_.context) * 4);
}

LmEval evaluate_lm(Session& s, const LmWindows& w, const LmInputs& in) {
  const Model& m = s.model();
  if (m.losses.empty() || m.batch <= 0)
    throw Error(POOCH_ERR_INVALID_ARG, "the model has no loss or no batch dimension to evaluate");
  LmBatchSource src(s, w, in);
  const int64_t rows = w.rows(), batch = m.batch;
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order[static_cast<size_t>(i)] = i;
  double sum = 0;
  for (int64_t first = 0; first < rows; first += batch) {
    const int64_t n = std::min(batch, rows - first);
    src.load(order, first, n);
    s.run(ProgramKind::evaluate);
    float loss;
    std::memcpy(&loss, s.staged(m.losses[0]), 4);
    sum += static_cast<double>(loss) * static_cast<double>(n);
  }
  LmEval r;
  r.windows = rows;
  r.loss = rows ? sum / static_cast<double>(rows) : 0;
  r.perplexity = std::exp(r.loss);
  return r;
}

std::string token_fingerprint(const int32_t* tokens, int64_t count) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  const auto n = static_cast<uint64_t>(count);
  XXH3_64bits_update(st, &n, sizeof n);
  if (n) XXH3_64bits_update(st, tokens, n * sizeof(int32_t));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fmt::format("xxh3 {:016x} ({} tokens)", h, count);
}

int64_t lm_context(const Model& m, const LmInputs& in) {
  const IoTensor* t = m.find_input(in.tokens);
  if (!t)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the model has no input '{}' to take token windows", in.tokens));
  const Shape& shape = m.graph.tensor(t->id).shape;
  if (shape.size() != 2 || m.graph.tensor(t->id).dtype != DType::i32)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the model's input '{}' is {} {}, not i32 [batch, context]", in.tokens,
                            dtype_name(m.graph.tensor(t->id).dtype), shape_str(shape)));
  return in.targets.empty() ? shape[1] - 1 : shape[1];
}

void train_lm(Session& s, const std::vector<int32_t>& tokens, int64_t vocab,
              const LmTrainConfig& cfg, TrainerState& state, const TrainCallbacks& cb,
              const std::function<void(const LmEvalReport&)>& on_eval, const std::string& source) {
  tokens::check_vocab(tokens, vocab, source);
  const int64_t context = lm_context(s.model(), cfg.inputs);
  const LmSplit split = split_tokens(tokens, context, cfg.val_fraction, source);
  LmBatchSource src(s, split.train, cfg.inputs);
  const bool validate = split.val.rows() > 0;
  // The weights change only with the step, so a validation at the step of
  // the last one (eval_every landing on an epoch's end) is that one.
  uint64_t measured_at = 0;
  LmEval measured;
  auto measure = [&] {
    measured = evaluate_lm(s, split.val, cfg.inputs);
    measured_at = s.optimizer_step();
    return measured;
  };
  EvalFn eval;
  if (validate)
    eval = [&] {
      const bool fresh = measured_at == 0 || measured_at != s.optimizer_step();
      const LmEval e = fresh ? measure() : measured;
      if (on_eval && fresh) on_eval({s.optimizer_step(), e});
      EvalResult r;
      r.score = -e.loss;
      r.metrics = {{"val_loss", e.loss}, {"perplexity", e.perplexity}};
      return r;
    };
  TrainCallbacks callbacks = cb;
  if (validate && cfg.eval_every > 0)
    callbacks.on_step = [&](uint64_t step, float loss, int64_t epoch, int64_t batch,
                            int64_t batches) {
      // The evaluate program overwrites the staged inputs only; the next
      // step stages its own batch, so training goes on unchanged.
      if (step % static_cast<uint64_t>(cfg.eval_every) == 0 && on_eval) on_eval({step, measure()});
      return cb.on_step ? cb.on_step(step, loss, epoch, batch, batches) : true;
    };
  train(s, src, eval, cfg.train, state, callbacks);
}

}  // namespace pooch
