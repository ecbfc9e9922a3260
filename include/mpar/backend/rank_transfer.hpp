#pragma once
/**
 * @file The sanctioned ways the host moves values to and from rank memory: the per-step statistics
 * coming back, the scalars that start a step (a zeroed accumulator, a loss scale chosen on the
 * host), a value a layer or the trainer must see on the host. Everything else stays in rank memory
 * and is produced and consumed by backend operations and communicators.
 *
 * Each goes through the stream-ordered part of the backend contract: an asynchronous copy and one
 * event wait (the wait is what lets the host read the values, or reuse its source), or a backend
 * operation with no wait at all (the zeroed accumulator). So the host never dereferences rank memory
 * here, which `DiscreteHostBackend` would refuse.
 */
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"

namespace mpar {

/** @brief Blocks the host until `B`'s rank stream has passed everything issued on it so far (one event wait). */
template <backend B>
void wait_for_rank_stream() {
  typename B::event_type passed;
  B::record_event(passed);
  B::wait_event(passed);
}

/** @brief Copies `n` values of rank memory `src` to host memory `dst`, after the work that produced them. */
template <backend B, class T>
void copy_to_host(const T* src, T* dst, std::size_t n) {
  typename B::template pinned_buffer<T> staged(n);
  B::template copy_to_host_async<T>(n, src, staged.data());
  wait_for_rank_stream<B>();
  std::copy_n(staged.data(), n, dst);
}

/**
 * @brief Whether the host may dereference `B`'s rank memory right after issuing an operation: only for
 * backends whose memory is the host's and whose operations finish before they return (HostBackend).
 */
template <backend B>
inline constexpr bool host_reads_rank_memory = std::is_same_v<typename B::memory_space, HostMemory>;

/**
 * @brief Whether `B`'s rank memory is a device's (`B::memory_space::device_memory`, CudaBackend's): outside the
 * host's reach, so only communicators that carry device memory can move it.
 */
template <backend B>
inline constexpr bool device_rank_memory = requires {
  requires B::memory_space::device_memory;
};

/**
 * @brief One value of rank memory on the host, after the operations that produced it: a plain read where
 * `host_reads_rank_memory<B>` (no synchronisation to count), else the stream-ordered copy and one event wait.
 */
template <backend B, class T>
[[nodiscard]] T read_from_rank(const T* src) {
  if constexpr (host_reads_rank_memory<B>) {
    return *src;
  } else {
    T v{};
    copy_to_host<B>(src, &v, 1);
    return v;
  }
}

template <backend B, class T>
void copy_to_rank(const T* src, T* dst, std::size_t n) {
  typename B::template pinned_buffer<T> staged(n);
  std::copy_n(src, n, staged.data());
  B::template copy_from_host_async<T>(n, staged.data(), dst);
  wait_for_rank_stream<B>();  // the staging buffer must outlive the copy
}

template <backend B, class T>
void zero_in_rank(T* dst, std::size_t n) {
  B::run(ops::zero<T>{.n = n, .x = dst});  // a backend operation: ordered on the stream, no host wait
}

}  // namespace mpar
