#pragma once
// How the stream tests run a thread rank's trainer: over HostBackend on the plain threads communicator, over a
// stream backend through the communicator that orders its collectives on the rank's stream.
#include <type_traits>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/comm/stream_ordered.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/core/memory_resource.hpp>

namespace mpar::testing {

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

}  // namespace mpar::testing
