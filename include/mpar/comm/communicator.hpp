#pragma once
/**
 * @file The `communicator` concept: the transport every parallel feature of mpar is written against. Each part
 * of it is a concept in its own header (comm_group, collective_communicator, point_to_point_communicator,
 * asynchronous_communicator, splittable_communicator, comm_request); this header includes them all, with
 * `comm_error`, `in_span`, `same_group` and `ordered_point_to_point`, so that code including it sees what it
 * always did.
 *
 * Semantics shared by every implementation (threads, MPI, NCCL, adaptors) — see docs/communicators.md:
 * - Buffers are `std::span`s of one element type `T`: float, double, bf16, f16 (16-bit types are
 *   reduced in float) or std::int32_t, std::int64_t, std::uint32_t, std::uint64_t (moved and reduced
 *   exactly; no `avg`), every one in every operation (`detail::comm_element`). Every rank of the group must call the same collectives in the same order with
 *   matching counts, element types, ops and roots; a mismatch is an error (comm_error) on every rank,
 *   never a hang.
 * - Uneven splits follow mpar's block rule (`block_of` in core/layout.hpp): for `n` elements over
 *   `p` ranks, rank r owns `block_of(n, p, r)`, the first n % p ranks one element more.
 * - In place: `all_reduce` and `broadcast` work in place; for the others send and receive buffers
 *   must not overlap unless stated.
 */
#include "mpar/comm/comm_error.hpp"
#include "mpar/comm/detail/asynchronous_communicator.hpp"
#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/comm/detail/comm_group.hpp"
#include "mpar/comm/detail/comm_request.hpp"
#include "mpar/comm/detail/point_to_point_communicator.hpp"
#include "mpar/comm/detail/splittable_communicator.hpp"
#include "mpar/comm/in_span.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/layout.hpp"

namespace mpar {

/**
 * @brief A group of ranks and everything a parallel program calls on it: the conjunction of
 * `collective_communicator`, `point_to_point_communicator`, `asynchronous_communicator` and
 * `splittable_communicator` (see each for its requirements). Code that calls only some of them
 * (a layer that only all-reduces) can require only those parts.
 */
template <class C>
concept communicator = detail::collective_communicator<C> && detail::point_to_point_communicator<C> &&
    detail::asynchronous_communicator<C> && detail::splittable_communicator<C>;

}  // namespace mpar

// The pieces that are written against `communicator` itself.
#include "mpar/comm/detail/ordered_point_to_point.hpp"  // IWYU pragma: export
#include "mpar/comm/same_group.hpp"                     // IWYU pragma: export
