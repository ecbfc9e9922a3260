#pragma once
/**
 * @file The `element_type` concept: the element types mpar stores.
 */
#include <type_traits>

namespace mpar {

/** The 16-bit element types (core/dtype.hpp); declared here so that the concept needs nothing else. */
struct bf16;
struct f16;

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

namespace detail {

/** @brief The element types mpar stores: float, double, bf16, f16. */
template <class T>
concept element_type = is_element_type_v<std::remove_cv_t<T>>;

}  // namespace detail

}  // namespace mpar
