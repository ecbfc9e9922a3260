#pragma once
/**
 * @file The `pipeline_part` concept: what the pipeline executor needs from a part (a model chunk on one rank),
 * with the layouts of its boundaries. Its refinements (`split_backward_part`, `droppable_part`,
 * `has_loss_layout`), the loss function type, and the compile-time boundary check (`PartChain`) are in their
 * own headers, which this one includes; the executor's untyped calls are in detail/part_calls.hpp.
 */
#include <concepts>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "mpar/core/extents.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/module.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/pipeline/detail/has_loss_layout.hpp"

namespace mpar::pipeline {

/**
 * @brief The storage of what crosses a stage boundary: an fp32 `[tokens, features]` tensor (or its
 * gradient). Only the executor handles it untyped (it moves raw buffers between ranks); every stage call
 * goes through `detail::forward`, `detail::backward_input`, ..., which re-establish the layout the stage
 * declares (`input_layout_t`, `output_layout_t`, `loss_layout_t`).
 */
using Boundary = nn::Activation;

/** @brief The layout a stage takes across its input boundary: its `default_input` (as for every nn layer). */
template <class S>
using input_layout_t = typename S::default_input;
/** @brief The layout a stage returns to the next stage: its `output_layout` for its input layout. */
template <class S>
using output_layout_t = typename S::template output_layout<input_layout_t<S>>;

namespace detail {
template <class S>
struct loss_layout_of {
  using type = output_layout_t<S>;
};
template <class S>
  requires requires { typename S::loss_layout; }
struct loss_layout_of<S> {
  using type = typename S::loss_layout;
};
}  // namespace detail

/**
 * @brief The layout of what the last stage gives the loss: `S::loss_layout` when the stage declares one
 * (its last instance returns something else than a hop, e.g. a GPT stage's vocab-sharded logits, through
 * `forward_to_loss`), else its `output_layout_t`.
 */
template <class S>
using loss_layout_t = typename detail::loss_layout_of<S>::type;

/**
 * @brief A pipeline stage: a typed `nn::module` from `Act<input_layout_t<S>>` to `Act<output_layout_t<S>>`
 * (forward, backward of the output gradient, parameters). Every `nn::Stage<...>` and every `nn` layer
 * qualifies; a stage with a `loss_layout` (`models::GptPipelinePart`) adds `forward_to_loss(x, mb) ->
 * Act<loss_layout>` and `backward` of its gradient.
 */
template <class S>
concept pipeline_part = requires {
  typename input_layout_t<S>;
  typename output_layout_t<S>;
}
&&nn::module<S, nn::Act<input_layout_t<S>>, nn::Act<output_layout_t<S>>> &&
    (!detail::has_loss_layout<S> || requires(S & s, const nn::Act<input_layout_t<S>>& x,
                                             const nn::Act<nn::grad_layout_t<loss_layout_t<S>>>& dy, int mb) {
      { s.forward_to_loss(x, mb) } -> std::same_as<nn::Act<loss_layout_t<S>>>;
      { s.backward(dy, mb) } -> std::same_as<nn::Act<nn::grad_layout_t<input_layout_t<S>>>>;
    });

}  // namespace mpar::pipeline

// What is written against `pipeline_part`, each in its own header; included here so that code including this
// header sees it as it always did.
#include "mpar/pipeline/detail/droppable_part.hpp"       // IWYU pragma: export
#include "mpar/pipeline/detail/split_backward_part.hpp"  // IWYU pragma: export
#include "mpar/pipeline/loss_fn.hpp"                     // IWYU pragma: export
#include "mpar/pipeline/part_chain.hpp"                  // IWYU pragma: export
