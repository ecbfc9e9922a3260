#pragma once
/**
 * @file The `communicator` concept: the transport every parallel feature of mpar is written against.
 *
 * Semantics shared by every implementation (threads, MPI, NCCL, adaptors) — see docs/communicators.md:
 * - Buffers are `std::span`s of one element type `T` (float, double, bf16, f16); 16-bit types are
 *   reduced in float. Every rank of the group must call the same collectives in the same order with
 *   matching counts, element types, ops and roots; a mismatch is an error (comm_error) on every rank,
 *   never a hang.
 * - Uneven splits follow mpar's block rule (`block_of` in core/layout.hpp): for `n` elements over
 *   `p` ranks, rank r owns `block_of(n, p, r)`, the first n % p ranks one element more.
 * - In place: `all_reduce` and `broadcast` work in place; for the others send and receive buffers
 *   must not overlap unless stated.
 */
#include <concepts>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "mpar/core/dtype.hpp"
#include "mpar/core/layout.hpp"

namespace mpar {

/** @brief A collective or point-to-point failure: a peer threw, timed out, or called with mismatched arguments. */
class comm_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/**
 * @brief The type of a collective's input buffer: `std::span<const T>` in a non-deduced context, so
 * `T` is deduced from the output buffer alone and a `std::span<T>` or a `std::vector<T>` converts.
 */
template <class T>
using in_span = std::type_identity_t<std::span<const T>>;

/**
 * @brief A handle to an asynchronous operation: `wait()` blocks until done (rethrowing its error),
 * `test()` returns whether it is done without blocking.
 */
template <class R>
concept comm_request = std::movable<R> && requires(R& r) {
  { r.wait() } -> std::same_as<void>;
  { r.test() } -> std::convertible_to<bool>;
};

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

/**
 * @brief The blocking collectives over a group. Requirements, for every element type `T`:
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
concept collective_communicator = comm_group<C> &&
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

/**
 * @brief Tagged point-to-point messages: `send(std::span<const T> data, int peer, int tag)` and
 * `recv(std::span<T> data, int peer, int tag)` block; `isend` and `irecv` take the same arguments and
 * return a `comm_request`.
 */
template <class C>
concept point_to_point_communicator = comm_group<C> &&
    requires(C& c, std::span<float> buf, std::span<const float> cbuf, int peer, int tag) {
  c.send(cbuf, peer, tag);
  c.recv(buf, peer, tag);
  { c.isend(cbuf, peer, tag) } -> comm_request;
  { c.irecv(buf, peer, tag) } -> comm_request;
};

/**
 * @brief Collectives that overlap with computation: `iall_reduce`, `iall_gather` and
 * `ireduce_scatter` take the arguments of their blocking forms and return a `comm_request`.
 */
template <class C>
concept asynchronous_communicator = collective_communicator<C> &&
    requires(C& c, std::span<float> buf, std::span<const float> cbuf, ReduceOp op) {
  { c.iall_reduce(buf, op) } -> comm_request;
  { c.iall_gather(cbuf, buf) } -> comm_request;
  { c.ireduce_scatter(cbuf, buf, op) } -> comm_request;
};

/**
 * @brief Sub-groups: `split(int color, int key)` is a communicator of the same type over the ranks
 * with equal color, ordered by key (collective over the group).
 */
template <class C>
concept splittable_communicator = comm_group<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

/**
 * @brief A group of ranks and everything a parallel program calls on it: the conjunction of
 * `collective_communicator`, `point_to_point_communicator`, `asynchronous_communicator` and
 * `splittable_communicator` (see each for its requirements). Code that calls only some of them
 * (a layer that only all-reduces) can require only those parts.
 */
template <class C>
concept communicator = collective_communicator<C> && point_to_point_communicator<C> && asynchronous_communicator<C> &&
    splittable_communicator<C>;

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

/**
 * @brief Another communicator over the same group as `c`: a copy when `C` is copyable (a shared
 * handle, like ThreadsCommunicator or MpiCommunicator), otherwise `c.split(0, c.rank())` — collective
 * over the group, same ranks in the same order — for move-only communicators such as NCCL's.
 */
template <communicator C>
[[nodiscard]] C same_group(C& c) {
  if constexpr (std::copy_constructible<C>)
    return c;
  else
    return c.split(0, c.rank());
}

}  // namespace mpar
