#include "build.h"

#include "mlp.h"
#include "xmc.h"

namespace pooch {

std::unique_ptr<Model> build_model(const ModelSpec& spec) {
  return spec.family == Family::mlp ? build_mlp_model(spec) : build_xmc_model(spec);
}

}  // namespace pooch
