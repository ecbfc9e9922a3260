#pragma once
/**
 * @file What the pipeline executor needs from a stage (a model chunk on one rank), and the
 * compile-time agreement of the tensors that cross a stage boundary.
 */
#include <concepts>
#include <cstddef>
#include <vector>

#include "mpar/core/extents.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::pipeline {

/** @brief What crosses a stage boundary: an fp32 `[tokens, features]` activation (or its gradient). */
using Boundary = nn::Activation;

/**
 * @brief A pipeline stage. Requirements: `forward(x, mb) -> y` saving what its backward needs under
 * micro-batch `mb`; `backward(dy, mb) -> dx` accumulating parameter gradients into
 * `Parameter::grad`; `parameters() -> std::vector<nn::Parameter*>`. Every `nn::Stage<...>` and every
 * `nn` layer qualifies.
 */
template <class S>
concept pipeline_stage = requires(S& s, const Boundary& x, int mb) {
  { s.forward(x, mb) } -> std::same_as<Boundary>;
  { s.backward(x, mb) } -> std::same_as<Boundary>;
  { s.parameters() } -> std::same_as<std::vector<nn::Parameter*>>;
};

/**
 * @brief A stage whose backward splits into `backward_input(dy, mb) -> dx` (B: what the previous
 * stage waits for) and `backward_weight(mb)` (W: the weight gradients, deferrable). Zero-bubble
 * schedules exploit the split; on a stage without it, B runs the whole backward and W is empty.
 */
template <class S>
concept split_backward_stage = pipeline_stage<S> && requires(S& s, const Boundary& dy, int mb) {
  { s.backward_input(dy, mb) } -> std::same_as<Boundary>;
  s.backward_weight(mb);
};

/** @brief A stage that can free a micro-batch's saved activations (`drop(mb)`), which activation recomputation needs. */
template <class S>
concept droppable_stage = pipeline_stage<S> && requires(S& s, int mb) { s.drop(mb); };

/**
 * @brief Whether stage `A`'s output may feed stage `B`: when both declare static feature counts
 * (`static_out_features` / `static_in_features`, as nn layers and nn::Stage do), they must agree.
 */
template <class A, class B>
constexpr bool boundary_compatible() {
  if constexpr (requires { A::static_out_features; B::static_in_features; }) {
    return A::static_out_features == dyn || B::static_in_features == dyn ||
           A::static_out_features == B::static_in_features;
  } else {
    return true;
  }
}

/**
 * @brief Checks every adjacent pair of a model's stage types at compile time: the sender's output
 * features and the receiver's input features cannot disagree.
 */
template <class First, class... Rest>
struct StageChain {
 private:
  template <class A, class B, class... More>
  static constexpr bool all_pairs() {
    static_assert(boundary_compatible<A, B>(),
                  "pipeline::StageChain: a stage's static_out_features differs from the next stage's "
                  "static_in_features; the activation crossing that boundary would change shape");
    if constexpr (sizeof...(More) == 0) return true;
    else return all_pairs<B, More...>();
  }

 public:
  static constexpr std::size_t stages = 1 + sizeof...(Rest);
  static constexpr bool compatible = [] {
    if constexpr (sizeof...(Rest) == 0) return true;
    else return all_pairs<First, Rest...>();
  }();
};

}  // namespace mpar::pipeline
