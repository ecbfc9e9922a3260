#pragma once
/**
 * @file The `block_ffn` concept: what a transformer block's feed-forward half is.
 */
#include "mpar/nn/activation.hpp"
#include "mpar/nn/detail/droppable_module.hpp"
#include "mpar/nn/detail/split_backward_module.hpp"

namespace mpar::nn::detail {

/**
 * @brief The feed-forward half of a transformer block, between `LN2` and the second residual: a
 * `split_backward_module` over typed activations of the block's layout `L` that can `drop(mb)`. The
 * tensor-parallel MLP (`MlpStage`) is the default; the MoE block plugs in its experts.
 */
template <class F, class L>
concept block_ffn = mpar::nn::detail::split_backward_module<F, Act<L>> && mpar::nn::detail::droppable_module<F>;

}  // namespace mpar::nn::detail
