#pragma once
/**
 * @file The `splittable_communicator` concept: a communicator that splits into sub-groups.
 */
#include <concepts>

#include "mpar/comm/detail/comm_group.hpp"

namespace mpar::detail {

/**
 * @brief Sub-groups: `split(int color, int key)` is a communicator of the same type over the ranks
 * with equal color, ordered by key (collective over the group).
 */
template <class C>
concept splittable_communicator = detail::comm_group<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

}  // namespace mpar::detail
