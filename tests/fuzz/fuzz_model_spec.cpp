// libFuzzer target: the JSON model spec (`pooch-run train --spec FILE`, the
// model.spec of every .pooch file): spec_from_json, and for a spec it
// accepts, build_model (the graph only; no tensor is allocated). An accepted
// spec must write back to JSON that reads back to the same spec.
#include "runtime/core/error.h"
#include "runtime/models/build.h"
#include "runtime/models/model_spec.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(pooch_fuzz::as_text(data, size));
  pooch::ModelSpec spec;
  try {
    spec = pooch::spec_from_json(text, "fuzz.json");
  } catch (const pooch::Error&) {
    return 0;
  }
  const std::string again = pooch::spec_to_json(spec);
  try {
    if (pooch::spec_to_json(pooch::spec_from_json(again, "fuzz.json (written back)")) != again)
      pooch_fuzz::finding("spec write-then-read is not stable: " + again);
  } catch (const pooch::Error& e) {
    pooch_fuzz::finding(std::string("spec_from_json refused what spec_to_json wrote: ") + e.what() +
                        "\n" + again);
  }
  try {
    (void)pooch::build_model(spec);
  } catch (const pooch::Error&) {
  }
  return 0;
}
