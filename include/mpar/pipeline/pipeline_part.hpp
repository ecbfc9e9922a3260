#pragma once
/**
 * @file What the pipeline executor needs from a stage (a model chunk on one rank), and the
 * compile-time agreement of the tensors that cross a stage boundary.
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

/** @brief Whether a stage returns a different layout to the loss than to the next stage (`S::loss_layout`). */
template <class S>
concept has_loss_layout = requires {
  typename S::loss_layout;
};

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
    (!has_loss_layout<S> || requires(S & s, const nn::Act<input_layout_t<S>>& x,
                                     const nn::Act<nn::grad_layout_t<loss_layout_t<S>>>& dy, int mb) {
      { s.forward_to_loss(x, mb) } -> std::same_as<nn::Act<loss_layout_t<S>>>;
      { s.backward(dy, mb) } -> std::same_as<nn::Act<nn::grad_layout_t<input_layout_t<S>>>>;
    });

/**
 * @brief A stage whose backward splits into B and W (`nn::split_backward_module`); zero-bubble
 * schedules exploit the split, and on a stage without it B runs the whole backward and W is empty.
 */
template <class S>
concept split_backward_part =
    pipeline_part<S> && nn::split_backward_module<S, nn::Act<input_layout_t<S>>, nn::Act<output_layout_t<S>>>;

/** @brief A stage that can free a micro-batch's saved activations (`nn::droppable_module`), which recomputation needs. */
template <class S>
concept droppable_part = pipeline_part<S> && nn::droppable_module<S>;

/**
 * @brief The loss the last stage's output goes to: the mean loss of micro-batch `mb` from the typed output
 * `y` (layout `L`, the stage's `loss_layout_t`); it writes dL/dy, of y's shape, into `dy`.
 */
template <class L>
using LossFn = std::function<double(const nn::Act<L>& y, int mb, nn::Act<nn::grad_layout_t<L>>& dy)>;

namespace detail {
/**
 * The executor's untyped entries (internal): raw boundary buffers in and out. Each states the layout the
 * stage declares for that boundary, calls the stage's typed API and gives the storage back to be sent.
 * `last`: the stage is the pipeline's last, whose output goes to the loss.
 */
template <pipeline_part S>
Boundary forward(S& s, Boundary& x, int mb, bool last) {
  // The storage moves into the typed input and back into `x` after the call: no copy.
  nn::Act<input_layout_t<S>> in(std::move(x));
  Boundary y = [&] {
    if constexpr (has_loss_layout<S>) {
      if (last) return s.forward_to_loss(in, mb).tensor();
    }
    return s.forward(in, mb).tensor();
  }();
  x = std::move(in).tensor();
  return y;
}
/** Calls `f` with the output gradient `dy` in the layout the stage's output has at this boundary. */
template <pipeline_part S, class F>
Boundary with_output_gradient(Boundary dy, bool last, F&& f) {
  if constexpr (has_loss_layout<S>) {
    if (last) return std::forward<F>(f)(nn::Act<nn::grad_layout_t<loss_layout_t<S>>>(std::move(dy))).tensor();
  }
  return std::forward<F>(f)(nn::Act<nn::grad_layout_t<output_layout_t<S>>>(std::move(dy))).tensor();
}
template <pipeline_part S>
Boundary backward(S& s, Boundary dy, int mb, bool last) {
  return with_output_gradient<S>(std::move(dy), last, [&](const auto& g) { return s.backward(g, mb); });
}
template <split_backward_part S>
Boundary backward_input(S& s, Boundary dy, int mb, bool last) {
  return with_output_gradient<S>(std::move(dy), last, [&](const auto& g) { return s.backward_input(g, mb); });
}
/** The loss on the last stage's output, typed in `loss_layout_t<S>`; returns its value and writes dL/dy. */
template <pipeline_part S>
double loss(const LossFn<loss_layout_t<S>>& fn, Boundary y, int mb, Boundary& dy) {
  using L = loss_layout_t<S>;
  nn::Act<L> yt(std::move(y));
  nn::Act<nn::grad_layout_t<L>> dyt(Boundary(yt.shape(), uninitialized));  // the loss function replaces it whole
  const double l = fn(yt, mb, dyt);
  dy = std::move(dyt).tensor();
  return l;
}
}  // namespace detail

/**
 * @brief Whether stage `A`'s output may feed stage `B`: when both declare static feature counts
 * (`static_out_features` / `static_in_features`, as nn layers and nn::Stage do), they must agree.
 */
template <class A, class B>
constexpr bool boundary_compatible() {
  if constexpr (requires {
                  A::static_out_features;
                  B::static_in_features;
                }) {
    return A::static_out_features == dyn || B::static_in_features == dyn ||
           A::static_out_features == B::static_in_features;
  } else {
    return true;
  }
}

/**
 * @brief Whether stage `A`'s output layout is the layout stage `B` takes: when both declare layouts
 * (nn layers and nn::Stage do), the tensor sent across the boundary is read as `B::default_input`.
 */
template <class A, class B>
constexpr bool boundary_layouts_agree() {
  if constexpr (requires {
                  typename A::default_input;
                  typename A::template output_layout<typename A::default_input>;
                  typename B::default_input;
                }) {
    return std::is_same_v<typename A::template output_layout<typename A::default_input>, typename B::default_input>;
  } else {
    return true;
  }
}

/**
 * @brief The stages of one model, in pipeline order, checked pairwise at compile time when the chain
 * is constructed from them (`pipeline::PartChain chain(stage0, stage1, ...)`): the sender's output
 * features and layout must be what the receiver takes. It holds references to the stages.
 */
template <class First, class... Rest>
class PartChain {
  template <class A, class B, class... More>
  static constexpr bool all_pairs() {
    static_assert(boundary_compatible<A, B>(),
                  "pipeline::PartChain: a stage's static_out_features differs from the next stage's "
                  "static_in_features; the activation crossing that boundary would change shape. Fix: make the "
                  "next stage's input size equal the previous stage's output size");
    static_assert(boundary_layouts_agree<A, B>(),
                  "pipeline::PartChain: a stage returns a layout (see A's output_layout) that the next stage does not "
                  "take as its input (B's default_input); the tensor sent across the boundary would be misread. Fix: "
                  "end the previous stage in the layout the next one starts with (e.g. reduce a Partial output first)");
    if constexpr (sizeof...(More) == 0)
      return true;
    else
      return all_pairs<B, More...>();
  }
  static constexpr bool check() {
    if constexpr (sizeof...(Rest) == 0)
      return true;
    else
      return all_pairs<First, Rest...>();
  }
  // Unconditional: constructing the chain instantiates the class, and with it every boundary check.
  static_assert(check() || true);

 public:
  static constexpr std::size_t stages = 1 + sizeof...(Rest);
  explicit PartChain(First& first, Rest&... rest) : first_(&first), rest_(&rest...) {}
  /** Stage `I` of the chain. */
  template <std::size_t I>
  [[nodiscard]] auto& get() const {
    if constexpr (I == 0)
      return *first_;
    else
      return *std::get<I - 1>(rest_);
  }

 private:
  First* first_;
  std::tuple<Rest*...> rest_;
};

}  // namespace mpar::pipeline
