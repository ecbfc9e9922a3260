#pragma once
// How the stream tests run a thread rank's trainer: over HostBackend on the plain threads communicator, over a
// stream backend through the communicator that orders its collectives on the rank's stream.
#include <exception>
#include <thread>
#include <type_traits>
#include <utility>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/core/memory_resource.hpp>

namespace mpar::testing {

/** Runs `f` on a thread of its own (a rank with a fresh stream) and rethrows what it threw. */
template <class F>
void on_own_thread(F f) {
  std::exception_ptr failure;
  std::thread t([&] {
    try {
      f();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  t.join();
  if (failure) std::rethrow_exception(failure);
}

/**
 * Calls `run(world)` on thread rank `w`. HostBackend runs with ordinary host memory installed: a rank on the
 * main thread may still have a stream backend's memory installed by an earlier test case, and
 * DiscreteHostBackend's faults on every host access. Any other backend gets a `StreamOrderedCommunicator` over `w`.
 */
template <class B, class Run>
void on_rank_world(ThreadsCommunicator& w, Run&& run) {
  if constexpr (std::is_same_v<B, HostBackend>) {
    HostMemoryResource host;
    ScopedMemoryResource use(host);
    run(w);
  } else {
    StreamOrderedCommunicator<ThreadsCommunicator, B> world(w);
    run(world);
  }
}

/**
 * A stream-ordered communicator without a host-memory twin, as NCCL is: `inner()` is hidden, so the trainer's own
 * host messages (a checkpoint's agreement and fingerprints) must go through rank memory. Over DiscreteHostBackend a
 * host buffer handed to it is refused, as a device communicator would refuse it.
 */
template <class B>
class RankMemoryOnlyCommunicator : public StreamOrderedCommunicator<ThreadsCommunicator, B> {
  using Base = StreamOrderedCommunicator<ThreadsCommunicator, B>;

 public:
  explicit RankMemoryOnlyCommunicator(Base c) : Base(std::move(c)) {}
  template <class... Extra>
  [[nodiscard]] RankMemoryOnlyCommunicator split(int color, int key, Extra... extra) {
    return RankMemoryOnlyCommunicator(Base::split(color, key, extra...));
  }

 private:
  using Base::inner;
};

/** As `on_rank_world`, for a stream backend, with a world that has no host-memory twin (`RankMemoryOnlyCommunicator`). */
template <class B, class Run>
void on_rank_memory_world(ThreadsCommunicator& w, Run&& run) {
  RankMemoryOnlyCommunicator<B> world{StreamOrderedCommunicator<ThreadsCommunicator, B>(w)};
  run(world);
}

}  // namespace mpar::testing
