// The C API of convolutional-network files: torchvision state dicts
// (safetensors) imported as pooch model files and exported back. Argument
// checks, then a call into the runtime through run_guarded.
#include <cstdlib>
#include <cstring>
#include <string>

#include "../train/cnn_io.h"
#include "api_guard.h"
#include "pooch/pooch.h"

namespace {
using pooch::api::fail_arg;
using pooch::api::run_guarded;
}  // namespace

extern "C" {

pooch_status pooch_cnn_import(const char* from, const char* spec_json, const char* out_path,
                              char** spec_out) {
  if (!from || !out_path) return fail_arg("pooch_cnn_import: from and out_path must not be NULL");
  if (spec_out) *spec_out = nullptr;
  return run_guarded([&] {
    const std::string spec = pooch::import_cnn(from, spec_json ? spec_json : "", out_path);
    if (spec_out) {
      *spec_out = static_cast<char*>(std::malloc(spec.size() + 1));
      if (!*spec_out) throw std::bad_alloc();
      std::memcpy(*spec_out, spec.c_str(), spec.size() + 1);
    }
  });
}

pooch_status pooch_cnn_export(const char* model_path, const char* out_path) {
  if (!model_path || !out_path)
    return fail_arg("pooch_cnn_export: model_path and out_path must not be NULL");
  return run_guarded([&] { pooch::export_cnn(model_path, out_path); });
}

}  // extern "C"
