#pragma once
/**
 * @file The `redistribution` concept: a change of an activation's layout with its collective forward and
 * the dual collective backward (the redistributions themselves are in nn/redistributions.hpp).
 */
#include <concepts>
#include <string_view>
#include <utility>

#include "mpar/nn/activation.hpp"

namespace mpar::nn {

/**
 * @brief A redistribution `R` over backend `B` and communicator `C`: `R::from` -> `R::to` forward and the dual map
 * of gradients backward, in the one signature every redistribution shares —
 * `R::forward<B>(comm, x, who) -> Act<to>` and `R::backward<B>(comm, dy, who) -> Act<grad_from>`, each taking its
 * activation (`Act<from>`, `Act<grad_to>`) as an rvalue the caller gives up or a const lvalue it keeps — with
 * `name`, `forward_collective` and `backward_collective` for messages and docs. `B` makes the rank-side copies
 * (a slice, the interleave of gathered columns); `who` names the caller in the errors of a split that does not divide.
 */
template <class R, class B, class C>
concept redistribution = requires {
  typename R::from;
  typename R::to;
  typename R::grad_to;
  typename R::grad_from;
  { R::name } -> std::convertible_to<std::string_view>;
  { R::forward_collective } -> std::convertible_to<std::string_view>;
  { R::backward_collective } -> std::convertible_to<std::string_view>;
}
&&requires(C& comm, Act<typename R::from>& x, Act<typename R::grad_to>& dy, std::string_view who) {
  { R::template forward<B>(comm, std::move(x), who) } -> std::same_as<Act<typename R::to>>;
  { R::template forward<B>(comm, std::as_const(x), who) } -> std::same_as<Act<typename R::to>>;
  { R::template backward<B>(comm, std::move(dy), who) } -> std::same_as<Act<typename R::grad_from>>;
  { R::template backward<B>(comm, std::as_const(dy), who) } -> std::same_as<Act<typename R::grad_from>>;
};

}  // namespace mpar::nn
