#pragma once
/**
 * @file The one module concept: what nn layers, nn::Stage, transformer blocks, GPT pipeline stages and
 * a block's feed-forward half all are. Every narrower name (nn::layer, pipeline::pipeline_part,
 * nn::block_ffn, ...) is this concept with its activation type fixed or one requirement added, each in its
 * own header; `split_backward_module` and `droppable_module` are included here. See docs/concepts.md for the
 * glossary.
 */
#include <concepts>
#include <vector>

#include "mpar/nn/activation.hpp"
#include "mpar/nn/detail/droppable_module.hpp"
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

}  // namespace mpar::nn

// The refinement of `module` written against it, in its own header; included here so that code including
// this header sees it as it always did.
#include "mpar/nn/detail/split_backward_module.hpp"  // IWYU pragma: export
