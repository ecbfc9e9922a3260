#pragma once
/**
 * @file The one module concept: what nn layers, nn::Stage, transformer blocks, GPT pipeline stages and
 * a block's feed-forward half all are. Every narrower name (nn::layer, pipeline::pipeline_stage,
 * nn::block_ffn, ...) is this concept with its activation type fixed or one requirement added; see
 * docs/concepts.md for the glossary.
 */
#include <concepts>
#include <vector>

#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

/**
 * @brief A trainable module over activations of type `X` (the untyped `Activation` by default, or a
 * typed `Act<L>`): `forward(x, mb) -> X` saving what its backward needs under micro-batch `mb`,
 * `backward(dy, mb) -> X` returning the input gradient and accumulating parameter gradients into
 * `Parameter::grad`, and `parameters() -> std::vector<Parameter*>`.
 */
template <class M, class X = Activation>
concept module = requires(M& m, const X& x, int mb) {
  { m.forward(x, mb) } -> std::same_as<X>;
  { m.backward(x, mb) } -> std::same_as<X>;
  { m.parameters() } -> std::same_as<std::vector<Parameter*>>;
};

/**
 * @brief A module whose backward splits in two, for zero-bubble pipeline schedules:
 * `backward_input(dy, mb) -> dx` (B: the input gradient, with every tensor-parallel collective it
 * needs; it keeps what the weight gradient needs for micro-batch `mb`) and `backward_weight(mb)` (W:
 * the weight gradients, accumulated into Parameter::grad; frees what B kept). `backward(dy, mb)`
 * equals B followed by W. Several micro-batches may sit between their B and W.
 */
template <class M, class X = Activation>
concept split_backward_module = module<M, X> && requires(M& m, const X& dy, int mb) {
  { m.backward_input(dy, mb) } -> std::same_as<X>;
  m.backward_weight(mb);
};

/** @brief A module that can free a micro-batch's saved activations early (`drop(mb)`), which recomputation needs. */
template <class M>
concept droppable_module = requires(M& m, int mb) { m.drop(mb); };

}  // namespace mpar::nn
