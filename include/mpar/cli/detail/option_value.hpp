#pragma once
/**
 * @file The `option_value` concept: the value types a command-line option binds to.
 */
#include <concepts>
#include <string>

namespace mpar::cli::detail {

/** @brief Value types an option can bind to: integers, floating point and strings (flags bind `bool`). */
template <class T>
concept option_value =
    (std::integral<T> && !std::same_as<T, bool>) || std::floating_point<T> || std::same_as<T, std::string>;

}  // namespace mpar::cli::detail
