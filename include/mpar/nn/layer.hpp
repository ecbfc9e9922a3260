#pragma once
/**
 * @file The `layer` concept the pipeline and training code program against. Its static half
 * (`layer_contract`), its B/W refinement (`split_backward_layer`) and the layers' common base (`TypedLayer`,
 * nn/typed_layer.hpp) are in their own headers, which this one includes.
 */
#include <array>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/core/extents.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/detail/droppable_module.hpp"
#include "mpar/nn/detail/layer_contract.hpp"
#include "mpar/nn/detail/split_backward_module.hpp"
#include "mpar/nn/module.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/nn/typed_layer.hpp"

namespace mpar::nn {

/** @brief The typed activation a layer takes as its declared input. */
template <class L>
using layer_input_t = Act<typename L::default_input>;
/** @brief The typed activation a layer returns for its declared input. */
template <class L>
using layer_output_t = Act<typename L::template output_layout<typename L::default_input>>;

/**
 * @brief A layer: a typed `droppable_module` — `forward(Act<default_input>) -> Act<output_layout<...>>`,
 * `backward` on the gradient of that output, parameters, `drop(mb)` — with the static layout contract
 * and run-time `in_features()` / `out_features()` (0 for layers that preserve their input's features).
 */
template <class L>
concept layer = detail::layer_contract<L> && module<L, layer_input_t<L>, layer_output_t<L>> &&
    detail::droppable_module<L> && requires(const L& l) {
  { l.in_features() } -> std::convertible_to<std::size_t>;
  { l.out_features() } -> std::convertible_to<std::size_t>;
};

}  // namespace mpar::nn

// The refinement of `layer` written against it, in its own header; included here so that code including
// this header sees it as it always did.
#include "mpar/nn/detail/split_backward_layer.hpp"  // IWYU pragma: export
