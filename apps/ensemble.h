// pooch-run train --ensemble N: N models trained alike but for their seeds,
// merged into ONE ordinary model whose scores are the mean of the members'
// scores (logits). A model of one hidden layer averages exactly into a model
// N times as wide: the hidden units side by side, the output layer's weights
// over them divided by N, its bias and the skip path averaged. So the file
// format, predict, eval and serving need nothing new, and the merged model
// costs what one wide model costs to run.
#pragma once
#include "training.h"

namespace cli {

// Trains `members` models from the model flags (seeds f.seed, f.seed + 1,
// ...), merges them, evaluates the merged model on the test set (if any) and
// writes it to f.out. Members write no checkpoints: an interrupted ensemble
// starts again. Exit code.
int run_ensemble_training(const ModelFlags& mf, const TrainFlags& f, const Data& data,
                          const DeviceFlags& dev, int members, Output& out);

}  // namespace cli
