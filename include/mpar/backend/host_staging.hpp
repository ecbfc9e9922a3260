#pragma once
/**
 * @file `HostStaging<B, T>`: small host values sent into rank memory and read back through pinned memory and the
 * backend's asynchronous copies, one host wait per read. It is how the host's own messages (the step report's
 * measurements, a checkpoint's agreed failures and block fingerprints) cross a communicator that takes rank memory
 * only, such as NCCL: write them into rank memory, run the collective there, read the result back.
 *
 * Writes are only issued (no wait): the stream runs them before whatever is issued next, and the pinned copy they
 * read from stays untouched until the next `read`, whose wait has passed them. A read copies into the start of the
 * pinned buffer, which the earlier writes' copies, ordered before it on the same stream, have already consumed.
 */
#include <algorithm>
#include <cstddef>
#include <span>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/** @brief Pinned staging for host values of type `T` going to and from `B`'s rank memory (see the file comment). */
template <backend B, class T>
class HostStaging {
 public:
  /** Room for `capacity` values written between two reads; pinned for this rank's device: make it after `B::init_rank()`. */
  explicit HostStaging(std::size_t capacity) : pinned_(capacity) {}
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  /** A write not followed by a read (a collective that threw) is waited for: its copy reads the pinned memory. */
  ~HostStaging() {
    if (written_ == 0) return;
    try {
      wait_for_rank_stream<B>();
    } catch (...) {  // the stream's error was, or will be, reported by the operation that caused it
    }
  }

  /** Issues the copy of `host` into rank memory `rank` on the rank's stream; returns at once. */
  void write(std::span<const T> host, T* rank) {
    if (host.empty()) return;
    require(written_ + host.size() <= pinned_.size(), "HostStaging::write: ", host.size(), " values after ", written_,
            " exceed the staging's ", pinned_.size(), "; make it larger or read in between");
    std::copy(host.begin(), host.end(), pinned_.data() + written_);
    B::template copy_from_host_async<T>(host.size(), pinned_.data() + written_, rank);
    written_ += host.size();
  }

  /**
   * Copies `host.size()` values of rank memory `rank` into `host` after everything issued before (the writes, the
   * collective): one event wait, also when `host` is empty (the writes are then done, the staging reusable).
   */
  void read(const T* rank, std::span<T> host) {
    require(host.size() <= pinned_.size(), "HostStaging::read: ", host.size(), " values exceed the staging's ",
            pinned_.size());
    if (!host.empty()) B::template copy_to_host_async<T>(host.size(), rank, pinned_.data());
    written_ = 0;
    wait_for_rank_stream<B>();
    std::copy_n(pinned_.data(), host.size(), host.begin());
  }

 private:
  typename B::template pinned_buffer<T> pinned_;
  std::size_t written_ = 0;  ///< values written since the last read
};

}  // namespace mpar
