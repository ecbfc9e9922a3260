#pragma once
/**
 * @file The `split_backward_layer` concept: a layer whose backward splits into B and W.
 */
#include "mpar/nn/detail/split_backward_module.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn::detail {

/** @brief A layer whose backward splits into B and W (`split_backward_module`). */
template <class L>
concept split_backward_layer =
    layer<L> && mpar::nn::detail::split_backward_module<L, layer_input_t<L>, layer_output_t<L>>;

}  // namespace mpar::nn::detail
