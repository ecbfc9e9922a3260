#pragma once
/**
 * @file The `layer_contract` concept: the static half of a layer (the layouts it accepts and returns,
 * its feature counts), checked at compile time by `Stage`.
 */
#include <concepts>
#include <cstddef>
#include <string_view>

namespace mpar::nn::detail {

/**
 * @brief The static half of a layer: `layer_kind` (its name in messages), `default_input` (the
 * layout it expects when it is first in a Stage), `check_input<In>()` (true when it takes layout `In`;
 * otherwise compilation stops in it with the layer's own message saying what is wrong and how to fix
 * it), `output_layout<In>` (the layout it returns), `preserves_features` (elementwise layers) and, for
 * the others, `static_in_features` / `static_out_features` (a size or `dyn`).
 */
template <class L>
concept layer_contract = requires {
  { L::layer_kind } -> std::convertible_to<std::string_view>;
  typename L::default_input;
  { L::template check_input<typename L::default_input>() } -> std::same_as<bool>;
  typename L::template output_layout<typename L::default_input>;
  { L::preserves_features } -> std::convertible_to<bool>;
  { L::static_in_features } -> std::convertible_to<std::size_t>;
  { L::static_out_features } -> std::convertible_to<std::size_t>;
};

}  // namespace mpar::nn::detail
