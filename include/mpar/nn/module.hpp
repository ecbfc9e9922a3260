#pragma once
/**
 * @file The one module concept: what nn layers, nn::Stage, transformer blocks, GPT pipeline stages and
 * a block's feed-forward half all are. Every narrower name (nn::layer, pipeline::pipeline_part,
 * nn::block_ffn, ...) is this concept with its activation type fixed or one requirement added; see
 * docs/concepts.md for the glossary.
 */
#include <concepts>
#include <vector>

#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

/**
 * @brief The type of the gradient of an activation of type `X`: `X` itself for the untyped storage,
 * `Act<grad_layout_t<L>>` for a typed `Act<L>` (the gradient of a Partial value is replicated).
 */
template <class X>
struct grad_of {
  using type = X;
};
template <class L>
struct grad_of<Act<L>> {
  using type = Act<grad_layout_t<L>>;
};
template <class X>
using grad_of_t = typename grad_of<X>::type;

/**
 * @brief A trainable module from activations of type `X` to activations of type `Y` (typed:
 * `X = Act<In>`, `Y = Act<Out>`; `Y = X` by default): `forward(x, mb) -> Y` saving what its backward
 * needs under micro-batch `mb`, `backward(dy, mb) -> grad_of_t<X>` taking the gradient of its output
 * (`grad_of_t<Y>`), returning the input gradient and accumulating parameter gradients into
 * `Parameter::grad`, and `parameters() -> std::vector<Parameter*>`.
 */
template <class M, class X = Activation, class Y = X>
concept module = requires(M& m, const X& x, const grad_of_t<Y>& dy, int mb) {
  { m.forward(x, mb) } -> std::same_as<Y>;
  { m.backward(dy, mb) } -> std::same_as<grad_of_t<X>>;
  { m.parameters() } -> std::same_as<std::vector<Parameter*>>;
};

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

/** @brief A module that can free a micro-batch's saved activations early (`drop(mb)`), which recomputation needs. */
template <class M>
concept droppable_module = requires(M& m, int mb) {
  m.drop(mb);
};

}  // namespace mpar::nn
