#include "build.h"

#include "cnn.h"
#include "mlp.h"
#include "xmc.h"

namespace pooch {

std::unique_ptr<Model> build_model(const ModelSpec& spec) {
  if (spec.family == Family::resnet) return build_resnet_model(spec);
  if (spec.family == Family::vgg) return build_vgg_model(spec);
  return spec.family == Family::mlp ? build_mlp_model(spec) : build_xmc_model(spec);
}

}  // namespace pooch
