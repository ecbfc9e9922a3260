#pragma once
/**
 * @file The `split_backward_part` concept: a pipeline part whose backward splits into B and W.
 */
#include "mpar/nn/activation.hpp"
#include "mpar/nn/detail/split_backward_module.hpp"
#include "mpar/pipeline/pipeline_part.hpp"

namespace mpar::pipeline::detail {

/**
 * @brief A stage whose backward splits into B and W (`nn::split_backward_module`); zero-bubble
 * schedules exploit the split, and on a stage without it B runs the whole backward and W is empty.
 */
template <class S>
concept split_backward_part = pipeline_part<S> &&
    mpar::nn::detail::split_backward_module<S, nn::Act<input_layout_t<S>>, nn::Act<output_layout_t<S>>>;

}  // namespace mpar::pipeline::detail
