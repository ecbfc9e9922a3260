#pragma once
/**
 * @file The `fused_classifier_backend` concept: a backend with a one-pass softmax cross-entropy.
 */
#include "mpar/backend/ops/fused.hpp"
#include "mpar/backend/ops/operation.hpp"

namespace mpar::nn::detail {

/**
 * @brief A backend that runs `ops::fused_classifier`, a one-pass softmax cross-entropy and gradient (CudaBackend,
 * backend/gpu/classifier.hpp): without vocabulary parallelism the loss uses it instead of the three-step
 * vocabulary-parallel protocol.
 */
template <class B>
concept fused_classifier_backend = supports<B, ops::fused_classifier>;

}  // namespace mpar::nn::detail
