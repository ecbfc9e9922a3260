#pragma once
/**
 * @file CUDA Graphs: capture the work a callable enqueues on a stream once, replay it with one launch.
 *
 * A steady-state training step launches hundreds of small kernels; replaying them as one graph removes
 * the per-launch CPU cost (a few microseconds each) that leaves the GPU idle between short kernels.
 * What may be captured: stream-ordered work only — kernels, cuBLAS/cuBLASLt calls, device copies,
 * `cudaMallocAsync`/`cudaFreeAsync` pairs (graph memory nodes) and NCCL collectives. What may not:
 * anything that waits on the host (`cudaStreamSynchronize`, an event wait, a copy into pageable memory,
 * a host barrier such as `gpu::DeviceCommunicator`'s), which the runtime rejects during capture
 * (`cuda_error` naming the call). The replay reads and writes the same device addresses as the
 * capture: buffers the step uses must stay allocated, and their contents are the step's state.
 */
#include "mpar/backend/gpu/runtime.hpp"

#include <cstddef>
#include <exception>
#include <utility>

#include "mpar/backend/gpu/cuda_error.hpp"

namespace mpar::gpu {

/** @brief An instantiated CUDA graph (RAII): built by `Graph::capture`, replayed by `launch`. */
class Graph {
 public:
  Graph() = default;
  Graph(Graph&& o) noexcept : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { reset(); }

  /**
   * Records what `record()` enqueues on `stream` (not the legacy default stream) without running it,
   * and instantiates the graph. Thread-local capture: other threads' CUDA calls are unaffected, and an
   * unsafe call on this thread fails the capture. If `record` throws, the capture is ended and the
   * exception propagates.
   */
  template <class Record>
  [[nodiscard]] static Graph capture(cudaStream_t stream, Record&& record) {
    begin_capture(stream);
    try {
      record();
    } catch (...) {
      abandon_capture(stream);
      throw;
    }
    return end_capture(stream);
  }

  /**
   * The two halves of `capture`, for a caller whose recording spans several calls (a backend's
   * `begin_capture` / `end_capture`, see `graph_backend`): from now on the calling thread's work on
   * `stream` is recorded.
   */
  static void begin_capture(cudaStream_t stream) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  /** Ends the capture begun on `stream` and instantiates the graph. */
  [[nodiscard]] static Graph end_capture(cudaStream_t stream) {
    Graph g;
    check(cudaStreamEndCapture(stream, &g.graph_),
          "cudaStreamEndCapture (an operation in the captured step waits "
          "on the host or used another stream without an event)");
    check(cudaGraphInstantiate(&g.exec_, g.graph_, 0), "cudaGraphInstantiate");
    return g;
  }
  /** Ends a capture that failed half-way, dropping what it recorded and the error it left. */
  static void abandon_capture(cudaStream_t stream) noexcept {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  }

  /** Enqueues one replay on `stream`; returns at once. */
  void launch(cudaStream_t stream) const {
    require(exec_ != nullptr, "gpu::Graph::launch: the graph is empty. Fix: build it with Graph::capture");
    check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }
  /** Number of nodes captured (kernels, copies, memory nodes...). */
  [[nodiscard]] std::size_t nodes() const {
    std::size_t n = 0;
    if (graph_) check(cudaGraphGetNodes(graph_, nullptr, &n), "cudaGraphGetNodes");
    return n;
  }
  [[nodiscard]] bool empty() const { return exec_ == nullptr; }

 private:
  void reset() noexcept {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace mpar::gpu
