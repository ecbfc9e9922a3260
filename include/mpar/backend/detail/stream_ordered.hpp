#pragma once
/**
 * @file The `stream_ordered` concept: a backend's events, asynchronous copies to and from pinned host memory
 * and uninitialised allocation (the contract they serve is `backend`'s, backend/backend.hpp).
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/core/memory_resource.hpp"  // Buffer (allocate)

namespace mpar::detail {

/**
 * @brief The stream-ordered part of a backend (see `backend` for the contract it serves):
 * - `event_type`: a marker in the rank's stream, default-constructible; `record_event(e)` places it
 *   after every operation issued so far; `wait_event(e)` blocks the host until the stream has passed
 *   it (and reports a pending error of the stream); `stream_wait_event(e)` makes the calling rank's
 *   stream wait for `e` (possibly recorded by another rank or stream) without blocking the host;
 *   `event_done(e)` says whether the stream has passed it, without blocking;
 * - `pinned_buffer<T>`: host memory the asynchronous copies may target (page-locked on a GPU),
 *   constructed from an element count, with `data()` and `size()`;
 * - `copy_to_host_async(n, src, dst)`: `n` elements from rank memory `src` to host memory `dst`,
 *   ordered on the stream; `dst` may be read after a wait for a later event;
 *   `copy_from_host_async(n, src, dst)`: host memory `src` to rank memory `dst`; `src` must not
 *   change until the stream has passed the copy;
 * - `allocate<T>(n) -> Buffer<T>`: `n` elements of rank memory that nobody initialises (the host
 *   does not touch them; an operation must write them before any reads them).
 */
template <class B>
concept stream_ordered = requires(typename B::event_type& e, const float* src, float* dst, std::size_t n) {
  requires std::default_initializable<typename B::event_type>;
  B::record_event(e);
  B::wait_event(e);
  B::stream_wait_event(e);
  { B::event_done(e) } -> std::convertible_to<bool>;
  { typename B::template pinned_buffer<float>(n).data() } -> std::same_as<float*>;
  { typename B::template pinned_buffer<float>(n).size() } -> std::convertible_to<std::size_t>;
  B::template copy_to_host_async<float>(n, src, dst);
  B::template copy_from_host_async<float>(n, src, dst);
  { B::template allocate<float>(n) } -> std::same_as<Buffer<float>>;
};

}  // namespace mpar::detail
