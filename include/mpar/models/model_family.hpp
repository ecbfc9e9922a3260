#pragma once
/**
 * @file `models::ModelFamily`: the decoder family a `GptConfig` builds (defined in nn/model_family.hpp, where the
 * planner reaches it too).
 */
#include "mpar/nn/model_family.hpp"

namespace mpar::models {

using nn::model_family;
using nn::ModelFamily;
using nn::name_of;

}  // namespace mpar::models
