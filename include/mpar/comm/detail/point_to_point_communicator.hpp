#pragma once
/**
 * @file The `point_to_point_communicator` concept: tagged sends and receives of a communicator.
 */
#include <span>

#include "mpar/comm/detail/comm_group.hpp"
#include "mpar/comm/detail/comm_request.hpp"

namespace mpar::detail {

/**
 * @brief Tagged point-to-point messages: `send(std::span<const T> data, int peer, int tag)` and
 * `recv(std::span<T> data, int peer, int tag)` block; `isend` and `irecv` take the same arguments and
 * return a `comm_request`. `T` is any `detail::comm_element` (as for `collective_communicator`),
 * the same on both sides.
 */
template <class C>
concept point_to_point_communicator = detail::comm_group<C> &&
    requires(C& c, std::span<float> buf, std::span<const float> cbuf, int peer, int tag) {
  c.send(cbuf, peer, tag);
  c.recv(buf, peer, tag);
  { c.isend(cbuf, peer, tag) } -> comm_request;
  { c.irecv(buf, peer, tag) } -> comm_request;
};

}  // namespace mpar::detail
