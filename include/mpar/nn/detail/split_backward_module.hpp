#pragma once
/**
 * @file The `split_backward_module` concept: a module whose backward splits into B (input gradient) and
 * W (weight gradients), for zero-bubble schedules.
 */
#include <concepts>

#include "mpar/nn/activation.hpp"
#include "mpar/nn/module.hpp"

namespace mpar::nn::detail {

/**
 * @brief A module whose backward splits in two, for zero-bubble pipeline schedules:
 * `backward_input(dy, mb) -> dx` (B: the input gradient, with every tensor-parallel collective it
 * needs; it keeps what the weight gradient needs for micro-batch `mb`) and `backward_weight(mb)` (W:
 * the weight gradients, accumulated into Parameter::grad; frees what B kept). `backward(dy, mb)`
 * equals B followed by W. Several micro-batches may sit between their B and W.
 */
template <class M, class X = Activation, class Y = X>
concept split_backward_module = module<M, X, Y> && requires(M& m, const grad_of_t<Y>& dy, int mb) {
  { m.backward_input(dy, mb) } -> std::same_as<grad_of_t<X>>;
  m.backward_weight(mb);
};

}  // namespace mpar::nn::detail
