#pragma once
/**
 * @file A per-thread count of the bytes of tensor memory host code touches on the paths that do so in
 * the training step: value-initialising or filling a `Tensor`, copying one, zeroing gradients on the
 * host, and the host loops of the layers (each names itself with `note_host_access`).
 *
 * Why a count: on a device backend every such byte is a host access to device memory (a page migration
 * or a stall), and the step's budget is zero of them outside the statistics copy. A rank is a thread,
 * so the count is per rank. It is an increment on a thread-local, so it is always on.
 * What it does not count: the communicators' own copies (communication, timed separately) and code that
 * reads or writes raw pointers without saying so — `CountingBackend` (observe/counting_backend.hpp)
 * documents the list.
 */
#include <cstddef>
#include <cstdint>

namespace mpar {

/** @brief Bytes of tensor memory the calling thread's host code touched so far (written plus read). */
[[nodiscard]] inline std::uint64_t& host_access_bytes() noexcept {
  thread_local std::uint64_t bytes = 0;
  return bytes;
}
/** @brief Records that host code on this thread wrote or read `bytes` of tensor memory. */
inline void note_host_access(std::size_t bytes) noexcept { host_access_bytes() += bytes; }

}  // namespace mpar
