#pragma once
/**
 * @file `HostMessageCommunicator<Comm, B>`: the blocking collectives on host buffers over a communicator that takes
 * rank memory only (NCCL's takes device buffers), for the host's own small messages — a checkpoint's agreed
 * failures, block fingerprints and directory name.
 *
 * Each call goes through rank memory: the host buffer is staged in pinned memory and copied in by
 * `copy_from_host_async`, the wrapped communicator runs the collective on rank memory, ordered with the rank's
 * stream as its other calls are, and the result comes back by `copy_to_host_async` (`mpar::HostStaging`):
 * one host wait per call, and none of the calls needs the communicator to be quiet first. Meant for messages of a
 * few values: every call allocates its rank buffers and staging.
 *
 * Construct it while the rank's memory resource is the current one (the rank buffers come from it, even when the
 * caller later installs host memory for its own buffers).
 */
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host_staging.hpp"
#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/comm/in_span.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar {

/** @brief Host-buffer collectives through the rank memory of backend `B` over `Comm` (see the file comment). */
template <detail::collective_communicator Comm, backend B>
class HostMessageCommunicator {
 public:
  explicit HostMessageCommunicator(Comm& rank_memory_comm)
      : comm_(&rank_memory_comm), rank_memory_(&current_memory_resource()) {}

  [[nodiscard]] int rank() const { return comm_->rank(); }
  [[nodiscard]] int size() const { return comm_->size(); }
  [[nodiscard]] std::string name() const { return comm_->name(); }

  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    in_place(data, [&](std::span<T> d) { comm_->all_reduce(d, op); });
  }
  template <detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    in_place(data, [&](std::span<T> d) { comm_->broadcast(d, root); });
  }
  template <detail::comm_element T>
  void reduce(in_span<T> send, std::span<T> recv, ReduceOp op, int root) {
    through(send, recv, rank() == root, [&](std::span<const T> s, std::span<T> r) { comm_->reduce(s, r, op, root); });
  }
  template <detail::comm_element T>
  void all_gather(in_span<T> send, std::span<T> recv) {
    through(send, recv, true, [&](std::span<const T> s, std::span<T> r) { comm_->all_gather(s, r); });
  }
  template <detail::comm_element T>
  void reduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    through(send, recv, true, [&](std::span<const T> s, std::span<T> r) { comm_->reduce_scatter(s, r, op); });
  }
  template <detail::comm_element T>
  void gather(in_span<T> send, std::span<T> recv, int root) {
    through(send, recv, rank() == root, [&](std::span<const T> s, std::span<T> r) { comm_->gather(s, r, root); });
  }
  template <detail::comm_element T>
  void scatter(in_span<T> send, std::span<T> recv, int root) {
    through(send, recv, true, [&](std::span<const T> s, std::span<T> r) { comm_->scatter(s, r, root); });
  }
  template <detail::comm_element T>
  void all_to_all(in_span<T> send, std::span<T> recv) {
    through(send, recv, true, [&](std::span<const T> s, std::span<T> r) { comm_->all_to_all(s, r); });
  }
  /** The counts are host values on every communicator: they are passed as they are. */
  template <detail::comm_element T>
  void all_to_all_v(in_span<T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    through(send, recv, true,
            [&](std::span<const T> s, std::span<T> r) { comm_->all_to_all_v(s, send_counts, r, recv_counts); });
  }
  void barrier() { comm_->barrier(); }

 private:
  /** `n` values of rank memory, from the rank's resource whatever the current one is. */
  template <class T>
  Buffer<T> rank_buffer(std::size_t n) {
    ScopedMemoryResource use(*rank_memory_);
    return B::template allocate<T>(n);
  }
  template <class T, class Call>
  void in_place(std::span<T> data, Call call) {
    Buffer<T> rank = rank_buffer<T>(data.size());
    mpar::HostStaging<B, T> staging(data.size());
    staging.write(std::span<const T>(data), rank.data());
    call(std::span<T>(rank));
    staging.read(rank.data(), data);
  }
  /** `send` in, the collective, `recv` back where `read_back` (the ranks a rooted result reaches). */
  template <class T, class Call>
  void through(std::span<const T> send, std::span<T> recv, bool read_back, Call call) {
    Buffer<T> rank_send = rank_buffer<T>(send.size()), rank_recv = rank_buffer<T>(recv.size());
    mpar::HostStaging<B, T> staging(std::max(send.size(), recv.size()));
    staging.write(send, rank_send.data());
    call(std::span<const T>(rank_send), std::span<T>(rank_recv));
    staging.read(rank_recv.data(), read_back ? recv : recv.first(0));
  }

  Comm* comm_;
  MemoryResource* rank_memory_;
};

}  // namespace mpar
