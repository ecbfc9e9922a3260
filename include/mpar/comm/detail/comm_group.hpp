#pragma once
/**
 * @file The `comm_group` concept: a rank of a group, which every communicator part requires.
 */
#include <concepts>
#include <string>

namespace mpar::detail {

/**
 * @brief A rank of a group: `rank()`, `size()` (this rank's index and the group size) and `name()`
 * (the group's name in error messages: "world", "tensor", ...). Every communicator part requires it.
 */
template <class C>
concept comm_group = requires(const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.name() } -> std::convertible_to<std::string>;
};

}  // namespace mpar::detail
