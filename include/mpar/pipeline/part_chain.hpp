#pragma once
/**
 * @file `PartChain`: the parts of one model in pipeline order, their boundaries checked pairwise at compile time.
 */
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "mpar/core/extents.hpp"

namespace mpar::pipeline {

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
