// Placeholder until the loss family lands.
#include "opcheck.h"
namespace pooch::opcheck {
std::vector<OpCase> loss_cases(Rng&) { return {}; }
}  // namespace pooch::opcheck
