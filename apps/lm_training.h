// The language-model side of train and finetune: a gpt model trained on one
// token stream (an llm.c token file, a .npy array of ids, or a text file's
// bytes with --bytes) through pooch_train_tokens, with validation loss and
// perplexity on the stream's tail, the cosine schedule, a step budget, and
// the checkpoint/resume behaviour of the XMC commands.
#pragma once
#include <string>
#include <vector>

#include "cli_common.h"
#include "training.h"

namespace cli {

struct LmFlags {
  bool bytes = false;         // --bytes: the data file's bytes are the tokens (vocabulary 256)
  int64_t context = 0;        // --context: tokens per row (0: the model's)
  int64_t steps = 0;          // --steps: optimizer steps in all (0: --epochs decide)
  int64_t eval_every = 0;     // --eval-every
  double val_fraction = 0.1;  // the token stream's tail held out (--valid-fraction)
};
void add_lm_flags(CLI::App* app, LmFlags& f);

// True when the spec's text names the gpt family (so train takes the LM path).
bool spec_is_gpt(const std::string& spec_text);

// A fresh gpt model from a spec's text (docs/CLI.md "Language models"):
// --batch and --seed override its batch and seed; with --bytes a spec
// without vocab_size gets 256. `source` names it in messages. Exit code.
int make_gpt_model(const std::string& spec_text, const std::string& source, const TrainFlags& tf,
                   const LmFlags& lf, ModelHandle& model, Output& out);

// Trains `model` (a fresh or loaded gpt model, or with `resume` a
// checkpoint) on the token file `data` and saves it to tf.out. `app` tells
// flags given from defaults. Exit code.
int run_lm_training(pooch_model* model, bool resume, const std::string& data, const LmFlags& lf,
                    const TrainFlags& tf, const DeviceFlags& dev, const CLI::App* app, Output& out);

}  // namespace cli
