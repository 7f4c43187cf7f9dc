// Models and checkpoints as .pooch files (docs/FORMAT.md). A model file holds
// the spec (metadata "model.spec", JSON), the training graph and the weights;
// a checkpoint adds the optimizer state tensors, the optimizer settings and
// the trainer state, so that a resumed run continues bit for bit.
#pragma once
#include <string>
#include <string_view>

#include "../../formats/pooch_file.h"
#include "model_spec.h"
#include "optimizer.h"
#include "xmc_session.h"

namespace pooch {

inline constexpr std::string_view kMetaModelSpec = "model.spec";

// Writes the session's weights (and with `checkpoint`, its optimizer state)
// atomically; `extra` metadata (trainer state) is added.
void save_session(const XmcSession& s, const std::string& path, bool checkpoint,
                  const Metadata& extra = {});

struct LoadedFile {
  PoochFile file;
  ModelSpec spec;
  bool checkpoint = false;
  OptimizerConfig optimizer;  // the checkpoint's settings (defaults for a model file)
};

// Opens and checks a model or checkpoint file. Errors name the file.
LoadedFile load_model_file(const std::string& path);

// Copies the file's tensors into the session: every weight (and with
// `with_state`, every optimizer state) of the session must be in the file
// with the same dtype and shape, except those whose names start with one of
// `skip_prefix` (finetuning a new head), which keep their initial values.
void restore_tensors(XmcSession& s, const PoochFile& f, bool with_state,
                     std::string_view skip_prefix = {});

std::string optimizer_to_json(const OptimizerConfig& o);
OptimizerConfig optimizer_from_json(const std::string& text, const std::string& source);

}  // namespace pooch
