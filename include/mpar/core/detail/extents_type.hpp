#pragma once
/**
 * @file The `extents_type` concept: the specialisations of `Extents`.
 */
#include <cstddef>
#include <type_traits>

namespace mpar {

/** Static and dynamic sizes (core/extents.hpp); declared here so that the concept needs nothing else. */
template <std::size_t... E>
class Extents;

template <class T>
inline constexpr bool is_extents_v = false;
template <std::size_t... E>
inline constexpr bool is_extents_v<Extents<E...>> = true;

namespace detail {

/** @brief Satisfied by `Extents<...>` specialisations. */
template <class T>
concept extents_type = is_extents_v<std::remove_cvref_t<T>>;

}  // namespace detail

}  // namespace mpar
