#pragma once
/**
 * @file Per-rank accounting of heap memory: the bytes a rank's thread allocated that are still alive,
 * and their peak. Measures what a training step really holds (activations, messages, workspaces)
 * without instrumenting every container.
 *
 * The counters only move when the program replaces the global allocation functions with mpar's
 * (include `mpar/observe/track_allocations.hpp` in exactly one translation unit). Each allocation
 * records the counter of the thread that made it, so memory freed on another thread (a message
 * buffer the receiver releases) is still taken off the right rank.
 */
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mpar/core/error.hpp"

namespace mpar::observe {

/** @brief Live and peak bytes of one rank. */
struct AllocationCounter {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};

  /** Starts a new peak measurement from the current live bytes. */
  void reset_peak() { peak.store(live.load(std::memory_order_relaxed), std::memory_order_relaxed); }
};

namespace detail {
inline thread_local AllocationCounter* tracked_counter = nullptr;
inline std::atomic<bool> allocation_tracking_installed{false};
}  // namespace detail

/**
 * @brief The counter of rank `rank` of this process. Static storage rather than the heap: blocks a
 * rank allocated may be freed during static destruction, after every heap object of the program is
 * gone, and must still find their counter.
 */
inline AllocationCounter& rank_counter(std::size_t rank) {
  static std::array<AllocationCounter, 1024> counters;
  require(rank < counters.size(), "observe::rank_counter: rank ", rank, " exceeds the ", counters.size(),
          " ranks one process can track");
  return counters[rank];
}

/** @brief Attributes this thread's future allocations to `c` (nullptr: not tracked). `c` must outlive them. */
inline void track_this_thread(AllocationCounter* c) { detail::tracked_counter = c; }
/** @brief The counter this thread's allocations go to. */
[[nodiscard]] inline AllocationCounter* this_thread_counter() { return detail::tracked_counter; }
/** @brief Whether the program installed the tracking allocation functions (otherwise counters stay 0). */
[[nodiscard]] inline bool allocation_tracking_enabled() {
  return detail::allocation_tracking_installed.load(std::memory_order_relaxed);
}

}  // namespace mpar::observe
