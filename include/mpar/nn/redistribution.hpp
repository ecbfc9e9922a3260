#pragma once
/**
 * @file The `redistribution` concept: a change of an activation's layout with its collective forward and
 * the dual collective backward (the redistributions themselves are in nn/redistributions.hpp).
 */
#include <concepts>
#include <string_view>

namespace mpar::nn {

/**
 * @brief A redistribution `R`: `R::from` -> `R::to` forward (`R::forward(comm, Act<from>)`) and the
 * dual map of gradients backward (`R::backward(comm, Act<grad_to>) -> Act<grad_from>`), with `name`,
 * `forward_collective` and `backward_collective` for messages and docs.
 */
template <class R>
concept redistribution = requires {
  typename R::from;
  typename R::to;
  typename R::grad_to;
  typename R::grad_from;
  { R::name } -> std::convertible_to<std::string_view>;
  { R::forward_collective } -> std::convertible_to<std::string_view>;
  { R::backward_collective } -> std::convertible_to<std::string_view>;
};

}  // namespace mpar::nn
