#pragma once
/**
 * @file The `ordered_point_to_point` concept: a communicator whose point-to-point messages match in
 * issue order (NCCL's semantics).
 */
#include "mpar/comm/communicator.hpp"

namespace mpar::detail {

/**
 * @brief A communicator whose point-to-point messages between two ranks are matched in the order
 * they are issued, not by tag, and whose posted sends and receives are issued together as one group
 * at the next wait, test or collective (NCCL's semantics). It declares
 * `static constexpr bool matches_in_order = true`. Code that posts receives ahead of need (the
 * pipeline executor's default) must instead post them in the order the peer sends: see
 * pipeline::PointToPoint::grouped.
 */
template <class C>
concept ordered_point_to_point = communicator<C> && requires {
  requires C::matches_in_order;
};

}  // namespace mpar::detail
