// Synthetic extreme multi-label data shaped like the standard benchmarks
// (the engine of `pooch-run synth`).
//
// Labels: each point gets 1 + a geometric number of labels (mean
// labels_per_point); label frequencies follow a power law N_r ∝ r^-beta over
// the labels that occur in training, whose number is set so that the mean
// points per occurring label matches points_per_label (the repository's
// figure counts only labels with training points). Training label counts are
// exact, not sampled: a configuration model deals the label occurrences out
// to the points. Test labels are drawn from the training label frequencies.
//
// Features: every label owns a sparse signature (S features with weights);
// a point carries each signature feature of each of its labels with
// probability 3/4, plus background "words" drawn from a Zipf law over all
// features, and the row is scaled to unit L2 norm. Labels are therefore
// predictable from the features, as in real data, but not trivially.
//
// Determinism: one seed gives the same bytes on every run and platform. All
// randomness is xoshiro256** with integer arithmetic; the few real numbers
// (power-law weights) come from basic IEEE operations only, with contraction
// into FMA disabled, never from std:: distributions or libm's pow/exp.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/xmc_data.h"

namespace pooch {

struct SynthShape {
  int64_t features = 0;
  int64_t labels = 0;
  int64_t train_rows = 0;
  int64_t test_rows = 0;
  double labels_per_point = 0;    // mean over training points
  double points_per_label = 0;    // mean over labels with at least one training point
  double features_per_point = 0;  // mean nonzero features per point
  double beta = 1;                // label rank-frequency exponent
};

struct SynthPreset {
  const char* name;
  SynthShape shape;  // at scale 1
  // PSP@k's propensity constants come from the set's name, through the one
  // table in runtime/train/metrics.cpp (default_propensity_ab).
};

// EURLex-4K, Wiki10-31K, AmazonCat-13K, Wiki-500K, Amazon-670K, Amazon-3M.
const std::vector<SynthPreset>& synth_presets();
// By name, without regard to case ("eurlex-4k"), or by the start of the one
// name that begins so ("eurlex"); nullptr when no preset or several match.
const SynthPreset* find_synth_preset(std::string_view name);

// The preset's shape at `scale` (0 < scale <= 100): points and labels scale
// linearly, so labels per point and points per label stay as they are;
// features scale with sqrt(scale), as vocabulary grows with the square root
// of corpus size (Heaps' law); features per point are capped at a quarter of
// the features. Small floors keep tiny scales well formed. Throws
// Error(POOCH_ERR_INVALID_ARG) for a bad scale.
SynthShape synth_shape(const SynthPreset& preset, double scale);

struct SynthOptions {
  uint64_t seed = 1;
  // Features in each label's signature; 0 picks about half a point's
  // features from its labels: clamp(features_per_point / (2 labels_per_point), 4, 24).
  int signature_features = 0;
};

struct SynthData {
  XmcDataset train;
  XmcDataset test;
  SynthShape shape;
};

// Throws Error(POOCH_ERR_INVALID_ARG) for an inconsistent shape.
SynthData make_synth(const SynthShape& shape, const SynthOptions& opts = {});
// By preset name; an unknown name is Error(POOCH_ERR_INVALID_ARG) listing the presets.
SynthData make_synth(std::string_view preset, double scale, const SynthOptions& opts = {});

// Deterministic natural logarithm and exponential from basic IEEE operations
// (exposed for tests): identical bits on every conforming platform.
double synth_log(double x);
double synth_exp(double x);

}  // namespace pooch
