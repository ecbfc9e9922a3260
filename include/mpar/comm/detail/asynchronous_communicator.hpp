#pragma once
/**
 * @file The `asynchronous_communicator` concept: collectives of a communicator that overlap with
 * computation.
 */
#include <span>

#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/comm/detail/comm_request.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::detail {

/**
 * @brief Collectives that overlap with computation: `iall_reduce`, `iall_gather` and
 * `ireduce_scatter` take the arguments of their blocking forms and return a `comm_request`.
 */
template <class C>
concept asynchronous_communicator = detail::collective_communicator<C> &&
    requires(C& c, std::span<float> buf, std::span<const float> cbuf, ReduceOp op) {
  { c.iall_reduce(buf, op) } -> comm_request;
  { c.iall_gather(cbuf, buf) } -> comm_request;
  { c.ireduce_scatter(cbuf, buf, op) } -> comm_request;
};

}  // namespace mpar::detail
