#include "build.h"

#include "cnn.h"
#include "gpt.h"
#include "mlp.h"
#include "xmc.h"

namespace pooch {

std::unique_ptr<Model> build_model(const ModelSpec& spec) {
  switch (spec.family) {
    case Family::mlp:
      return build_mlp_model(spec);
    case Family::gpt:
      return build_gpt_model(spec);
    case Family::resnet:
      return build_resnet_model(spec);
    case Family::vgg:
      return build_vgg_model(spec);
    case Family::xmc:
      break;
  }
  return build_xmc_model(spec);
}

}  // namespace pooch
