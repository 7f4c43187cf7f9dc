// Models and checkpoints as .pooch files (docs/FORMAT.md). A model file holds
// the session's graph, the model's inputs, outputs and losses ("model.io"),
// its family and spec, and the weights; a checkpoint adds the optimizer state
// tensors, the optimizer settings and the trainer state, so that a resumed
// run continues bit for bit. A model file loads without the loader knowing its
// family: the graph is in the file.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../formats/pooch_file.h"
#include "../core/optimizer.h"
#include "../models/model.h"
#include "../models/model_spec.h"
#include "../session/session.h"

namespace pooch {

// Writes the session's weights (and with `checkpoint`, its optimizer state)
// atomically; `extra` metadata (trainer state) is added.
void save_session(const Session& s, const std::string& path, bool checkpoint,
                  const Metadata& extra = {});

// Writes a model file from a model (its forward graph) and every weight's
// bytes by name, without a session: what an importer of other programs'
// checkpoints writes. Error POOCH_ERR_INVALID_ARG naming a weight that is
// missing or of the wrong size. The file loads as any model file.
void save_model(const Model& m, const std::string& path,
                const std::map<std::string, std::span<const std::byte>, std::less<>>& weights);

struct LoadedFile {
  PoochFile file;
  // The model the file describes: its graph's forward part with the inputs,
  // outputs and losses it names (files written before "model.io" existed are
  // rebuilt from their xmc spec).
  std::shared_ptr<Model> model;
  bool has_spec = false;  // the family has a spec (xmc, mlp): it can be rebuilt
  ModelSpec spec;
  bool checkpoint = false;
  OptimizerConfig optimizer;  // the checkpoint's settings (defaults for a model file)
};

// Opens and checks a model or checkpoint file. Errors name the file.
LoadedFile load_model_file(const std::string& path);

// Copies the file's tensors into the session: every weight (and with
// `with_state`, every optimizer state) of the session must be in the file
// with the same dtype and shape, except those whose names start with
// `skip_prefix` (finetuning a new head), which keep their initial values,
// as do the constants a builder derives from the run shape (positions).
// With `fresh_adapters` (LoRA added to a model file's weights), LoRA
// adapters the file lacks keep their initial values too.
void restore_tensors(Session& s, const PoochFile& f, bool with_state,
                     std::string_view skip_prefix = {}, bool fresh_adapters = false);

std::string optimizer_to_json(const OptimizerConfig& o);
OptimizerConfig optimizer_from_json(const std::string& text, const std::string& source);

}  // namespace pooch
