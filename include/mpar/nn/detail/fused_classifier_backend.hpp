#pragma once
/**
 * @file The `fused_classifier_backend` concept: a backend with a one-pass softmax cross-entropy.
 */
#include <cstddef>
#include <cstdint>

namespace mpar::nn::detail {

/**
 * @brief A backend with a one-pass softmax cross-entropy and gradient (CudaBackend's `fused_classifier`,
 * backend/gpu/classifier.hpp): without vocabulary parallelism the loss uses it instead of the
 * three-step vocabulary-parallel protocol.
 */
template <class B>
concept fused_classifier_backend = requires(std::size_t n, const float* x, const std::int32_t* t, float* y) {
  B::fused_classifier(n, n, n, x, t, y, y, y, 1.0f);
};

}  // namespace mpar::nn::detail
