#pragma once
/**
 * @file The `collective_communicator` concept: the blocking collectives of a communicator
 * (semantics in comm/communicator.hpp and docs/communicators.md).
 */
#include <cstddef>
#include <span>

#include "mpar/comm/detail/comm_group.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::detail {

/**
 * @brief The blocking collectives over a group. Requirements, for every element type `T` of
 * `detail::comm_element` — float, double, bf16, f16, std::int32_t, std::int64_t, std::uint32_t and
 * std::uint64_t (the concept checks float; the generic tests check them all). Integers reduce exactly (sums
 * wrap modulo 2^bits); `avg` of integers throws comm_error on every rank that asks, since an integer
 * average must round (comm/detail/comm_element.hpp):
 *
 * | call | semantics |
 * |---|---|
 * | `all_reduce(std::span<T> data, ReduceOp op)` | in place |
 * | `broadcast(std::span<T> data, int root)` | in place |
 * | `reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, int root)` | recv used on root only |
 * | `all_gather(std::span<const T> send, std::span<T> recv)` | recv.size() = n; rank r sends block_of(n, p, r) |
 * | `reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op)` | send.size() = n; rank r receives block_of(n, p, r) |
 * | `gather(send, recv, int root)` / `scatter(send, recv, int root)` | blocks as for all_gather / reduce_scatter |
 * | `all_to_all(std::span<const T> send, std::span<T> recv)` | equal blocks: size divisible by p |
 * | `all_to_all_v(send, send_counts, recv, recv_counts)` | counts are `std::span<const std::size_t>` of length p |
 * | `barrier()` | |
 */
template <class C>
concept collective_communicator = detail::comm_group<C> &&
    requires(C& c, std::span<float> buf, std::span<const float> cbuf, std::span<const std::size_t> counts, int root,
             ReduceOp op) {
  c.all_reduce(buf, op);
  c.broadcast(buf, root);
  c.reduce(cbuf, buf, op, root);
  c.all_gather(cbuf, buf);
  c.reduce_scatter(cbuf, buf, op);
  c.gather(cbuf, buf, root);
  c.scatter(cbuf, buf, root);
  c.all_to_all(cbuf, buf);
  c.all_to_all_v(cbuf, counts, buf, counts);
  c.barrier();
};

}  // namespace mpar::detail
