// What `pooch-run info` says about any model, as a program embedding the
// library sees it: its family, named inputs and outputs (with the batch
// dimension), parameter count and the arena plan of a CPU training session.
#pragma once
#include <string>

#include "cli_common.h"

namespace cli {

// `path` is a model or checkpoint; `tensors` the tensor table of
// pooch_file_describe (for the parameter count). With `plan`, a CPU session
// is created to report its arena (a failure is reported in the result, not
// returned). Returns {"family", "inputs", "outputs", "parameters",
// "fixed_parameters", "memory" | "memory_error"}; an object with "error" when
// the model does not load.
Json summarize_model(const std::string& path, const Json& tensors, bool plan);

// "f32", "i32", ...
const char* dtype_str(pooch_dtype t);

}  // namespace cli
