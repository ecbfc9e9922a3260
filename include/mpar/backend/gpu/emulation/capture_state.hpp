#pragma once
/**
 * @file Whether the calling thread is capturing a CUDA graph under the emulation, and how a call that CUDA forbids
 * during a thread-local capture fails it. The capture itself (recording, replay) is emulation/graphs.hpp; this is
 * what the synchronous calls of memory.hpp and streams.hpp consult, so they need not know graphs.
 */
#include <memory>

#include "mpar/backend/gpu/emulation/types.hpp"

namespace mpar::gpu::emulation {
struct RecordedWork;  // emulation/graphs.hpp
}  // namespace mpar::gpu::emulation

/** A graph being captured or captured: its recorded work (shared with its executables), and whether it failed. */
struct CUgraph_st {
  std::shared_ptr<::mpar::gpu::emulation::RecordedWork> work;
  bool invalidated = false;  ///< a forbidden call was made during the capture: ending it fails
};

namespace mpar::gpu::emulation {
namespace detail {
/** The graph this thread's capture records into (CUDA's thread-local capture mode); null when not capturing. */
inline CUgraph_st*& thread_capture() {
  thread_local CUgraph_st* g = nullptr;
  return g;
}
}  // namespace detail

/** Whether the calling thread is capturing. */
[[nodiscard]] inline bool capturing() { return detail::thread_capture() != nullptr; }

/**
 * A call CUDA forbids on a capturing thread (one that waits on the device or the host, or work on the legacy
 * default stream): invalidates the capture, as CUDA does, and returns `error` for the call.
 */
inline cudaError_t fail_capture(cudaError_t error) {
  detail::thread_capture()->invalidated = true;
  return error;
}

}  // namespace mpar::gpu::emulation
