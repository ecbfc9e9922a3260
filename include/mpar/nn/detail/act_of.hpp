#pragma once
/**
 * @file `detail::act_of<X, L>`: `X` is `Act<L>`, whatever its reference and const qualifiers. The redistributions
 * take their activation as a forwarding reference constrained by it, so a caller that gives its tensor up moves it
 * and one that keeps it is read (or copied) without a second signature.
 */
#include <concepts>
#include <type_traits>

#include "mpar/nn/activation.hpp"

namespace mpar::nn::detail {

template <class X, class L>
concept act_of = std::same_as<std::remove_cvref_t<X>, Act<L>>;

}  // namespace mpar::nn::detail
