#pragma once
/**
 * @file The `half_precision` concept: the 16-bit storage types, which compute in float.
 */
#include <type_traits>

namespace mpar {

/** The 16-bit element types (core/dtype.hpp); declared here so that the concept needs nothing else. */
struct bf16;
struct f16;

namespace detail {

/** @brief 16-bit storage types, which compute and accumulate in float. */
template <class T>
concept half_precision = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

}  // namespace detail

}  // namespace mpar
