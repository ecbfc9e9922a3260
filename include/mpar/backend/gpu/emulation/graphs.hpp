#pragma once
/**
 * @file Stream-ordered work and CUDA graph capture under the emulation.
 *
 * Work on a stream runs at once on the calling thread (`run_or_record`), unless the stream is capturing: then it is
 * checked as it would be when run — its pointers, sizes and copy directions — and recorded, and `cudaGraphLaunch`
 * replays the recorded operations in order. Kernel launches (emulation/launch.hpp), the asynchronous copies and sets
 * below, cuBLAS(Lt) and CUB calls all go through it, so a captured step replays what the eager step ran.
 *
 * What CUDA refuses during a thread-local capture is refused here too, and fails the capture
 * (`cudaStreamEndCapture` then returns cudaErrorStreamCaptureInvalidated): a synchronising call on the capturing
 * thread (memory.hpp, streams.hpp), work on the legacy default stream, and freeing memory that was allocated before
 * the capture (a replay would free it again). Memory `cudaMallocAsync` allocates during a capture and `cudaFreeAsync`
 * frees during it belongs to the graph, as CUDA's graph memory nodes: every replay uses the same addresses, and it is
 * freed when the last of the graph and its executables is destroyed.
 */
#include <cstddef>
#include <functional>
#include <memory>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/emulation/capture_state.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/streams.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"

namespace mpar::gpu::emulation {

/** @brief What a capture recorded: its operations in order, and the device memory the graph owns. */
struct RecordedWork {
  std::vector<std::function<void()>> operations;
  std::unordered_set<void*> allocated;  ///< by cudaMallocAsync during the capture
  std::vector<void*> owned;             ///< of those, freed during the capture: the graph's until it goes
  RecordedWork() = default;
  RecordedWork(const RecordedWork&) = delete;
  RecordedWork& operator=(const RecordedWork&) = delete;
  ~RecordedWork() {
    for (void* p : owned) (void)DeviceAllocations::instance().free(p);
  }
};

/**
 * Runs `op` now, or records it when `stream` is capturing. On a capturing thread, work on the legacy default stream
 * (a null stream) fails the capture, as CUDA's cudaErrorStreamCaptureImplicit.
 */
template <class Op>
cudaError_t run_or_record(cudaStream_t stream, Op&& op) {
  if (stream != nullptr && stream->capture != nullptr) {
    stream->capture->work->operations.emplace_back(std::forward<Op>(op));
    return cudaSuccess;
  }
  if (stream == nullptr && capturing()) return fail_capture(cudaErrorStreamCaptureImplicit);
  op();
  return cudaSuccess;
}

}  // namespace mpar::gpu::emulation

/** The executable form of a captured graph: it shares the recorded work, so it outlives the graph it came from. */
struct CUgraphExec_st {
  std::shared_ptr<::mpar::gpu::emulation::RecordedWork> work;
};

// ---- stream-ordered memory operations -------------------------------------------------------------------------
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = ::mpar::gpu::emulation::DeviceAllocations::instance().allocate(bytes);
  if (s != nullptr && s->capture != nullptr) s->capture->work->allocated.insert(*p);
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMallocAsync(T** p, std::size_t bytes, cudaStream_t s) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, s);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  namespace e = ::mpar::gpu::emulation;
  if (p == nullptr) return cudaSuccess;
  if (s != nullptr && s->capture != nullptr) {
    e::RecordedWork& w = *s->capture->work;
    if (!w.allocated.contains(p)) return e::fail_capture(cudaErrorStreamCaptureUnsupported);
    w.owned.push_back(p);  // freed with the graph: replays keep using it
    return cudaSuccess;
  }
  return e::DeviceAllocations::instance().free(p) ? cudaSuccess : cudaErrorInvalidDevicePointer;
}
/** Checked when issued (or recorded), made in stream order. */
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s = nullptr) {
  namespace e = ::mpar::gpu::emulation;
  if (const cudaError_t err = e::detail::copy_bytes(dst, src, bytes, kind, false); err != cudaSuccess) return err;
  return e::run_or_record(s, [=] { (void)e::detail::copy_bytes(dst, src, bytes, kind, true); });
}
inline cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                     std::size_t width, std::size_t height, cudaMemcpyKind kind,
                                     cudaStream_t s = nullptr) {
  namespace e = ::mpar::gpu::emulation;
  if (const cudaError_t err = e::detail::copy_rows(dst, dpitch, src, spitch, width, height, kind, false);
      err != cudaSuccess)
    return err;
  return e::run_or_record(s, [=] { (void)e::detail::copy_rows(dst, dpitch, src, spitch, width, height, kind, true); });
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s = nullptr) {
  namespace e = ::mpar::gpu::emulation;
  if (const cudaError_t err = e::detail::set_bytes(p, value, bytes, false); err != cudaSuccess) return err;
  return e::run_or_record(s, [=] { (void)e::detail::set_bytes(p, value, bytes, true); });
}

/** The device's default pool; the release threshold mpar raises is accepted (the emulation never trims). */
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (pool == nullptr || device < 0 || device >= ::mpar::gpu::emulation::emulated_devices) return cudaErrorInvalidValue;
  static CUmemPoolHandle_st pools[::mpar::gpu::emulation::emulated_devices];
  *pool = &pools[device];
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (pool == nullptr || value == nullptr || attr != cudaMemPoolAttrReleaseThreshold) return cudaErrorInvalidValue;
  pool->release_threshold = *static_cast<unsigned long long*>(value);
  return cudaSuccess;
}

// ---- graph capture --------------------------------------------------------------------------------------------
/** Starts recording `s` (not the legacy default stream; one capture per thread, as the thread-local mode allows). */
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  namespace e = ::mpar::gpu::emulation;
  if (s == nullptr) return cudaErrorStreamCaptureUnsupported;
  if (s->capture != nullptr || e::capturing()) return cudaErrorIllegalState;
  s->capture = new CUgraph_st{std::make_shared<e::RecordedWork>(), false};
  e::detail::thread_capture() = s->capture;
  return cudaSuccess;
}
/** Ends the capture of `s`: the graph, or null and cudaErrorStreamCaptureInvalidated if a forbidden call failed it. */
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  namespace e = ::mpar::gpu::emulation;
  if (s == nullptr || graph == nullptr) return cudaErrorInvalidValue;
  if (s->capture == nullptr) return cudaErrorIllegalState;
  CUgraph_st* g = std::exchange(s->capture, nullptr);
  e::detail::thread_capture() = nullptr;
  if (g->invalidated) {
    delete g;
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long = 0) {
  if (exec == nullptr || g == nullptr) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{g->work};
  return cudaSuccess;
}
/** Replays the recorded operations in order, on the calling thread (as every emulated stream runs its work). */
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  namespace e = ::mpar::gpu::emulation;
  if (exec == nullptr) return cudaErrorInvalidResourceHandle;
  // Into a capturing stream the launch is recorded (a child graph, as CUDA allows).
  return e::run_or_record(s, [work = exec->work] {
    for (const auto& op : work->operations) op();
  });
}
/** With `nodes` null, the number of recorded operations (what mpar asks). */
inline cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count) {
  if (g == nullptr || count == nullptr) return cudaErrorInvalidValue;
  if (nodes != nullptr) return cudaErrorInvalidValue;  // the emulation has no node handles to give
  *count = g->work->operations.size();
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  if (g == nullptr) return cudaErrorInvalidResourceHandle;
  delete g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return cudaErrorInvalidResourceHandle;
  delete exec;
  return cudaSuccess;
}
