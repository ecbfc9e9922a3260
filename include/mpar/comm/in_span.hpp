#pragma once
/**
 * @file `in_span<T>`: the input-buffer type of the communicators' collectives.
 */
#include <span>
#include <type_traits>

namespace mpar {

/**
 * @brief The type of a collective's input buffer: `std::span<const T>` in a non-deduced context, so
 * `T` is deduced from the output buffer alone and a `std::span<T>` or a `std::vector<T>` converts.
 */
template <class T>
using in_span = std::type_identity_t<std::span<const T>>;

}  // namespace mpar
