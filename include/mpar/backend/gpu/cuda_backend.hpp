#pragma once
/**
 * @file The CUDA backend policy type: the device twin of HostBackend, so the layers, the GPT stages
 * and the trainer run on a GPU unchanged (`GptPipelinePart<Comm, CudaBackend>`).
 *
 * Include from a translation unit compiled by nvcc: the layer kernels are templates in
 * backend/gpu/kernels.hpp.
 */
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/copy_2d_shape.hpp"
#include "mpar/backend/detail/graph_backend.hpp"
#include "mpar/backend/detail/llama_kernel_backend.hpp"
#include "mpar/backend/detail/online_softmax_backend.hpp"
#include "mpar/backend/detail/routing_backend.hpp"
#include "mpar/backend/gpu/accumulate.hpp"
#include "mpar/backend/gpu/buffer_launch.hpp"
#include "mpar/backend/gpu/buffer_ops.hpp"
#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/device_resource.hpp"
#include "mpar/backend/gpu/device_tensor.hpp"
#include "mpar/backend/gpu/gemm.hpp"
#include "mpar/backend/gpu/gemm_ops.hpp"
#include "mpar/backend/gpu/graph.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/layer_kernel_ops.hpp"
#include "mpar/backend/gpu/llama_kernels.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/moe_ops.hpp"
#include "mpar/backend/gpu/moe_routing.hpp"
#include "mpar/backend/gpu/online_softmax.hpp"
#include "mpar/backend/gpu/optimizer_ops.hpp"
#include "mpar/backend/gpu/row_kernels.hpp"
#include "mpar/backend/gpu/vocab_parallel_ops.hpp"
// The optional fused operations: classifier, residual + layer norm, attention over the QKV layout.
#include "mpar/backend/gpu/fused_ops.hpp"

namespace mpar {

/** @brief Memory-space tag: device memory of the calling thread's GPU, allocated in stream order. */
struct CudaMemory {
  static constexpr const char* name = "cuda";
  static constexpr bool device_memory = true;  ///< the host cannot dereference it (`device_rank_memory`)
};

/**
 * @brief The CUDA backend: cuBLAS/cuBLASLt GEMM and the kernels of `mpar/backend/gpu/kernels.hpp` on
 * the calling thread's compute stream, over tensors in device memory.
 *
 * `init_rank()` binds the rank's thread to its device and makes stream-ordered device memory
 * (backend/gpu/device_resource.hpp) the thread's memory resource, so every Tensor and Parameter the
 * rank creates afterwards lives on its GPU; the host cannot dereference it. Every operation is
 * enqueued on the rank's compute stream and returns at once (the `backend` contract): host code
 * reads results only through `copy_to_host_async` into a `pinned_buffer` and a wait for an event
 * recorded after it, or after `synchronize()`.
 *
 * Stateless like HostBackend: the per-rank state (device, stream, cuBLAS handles) is thread-local
 * (`gpu::this_thread()`), so N ranks as N threads, on one GPU or several, each get their own.
 */
struct CudaBackend {
  using memory_space = CudaMemory;
  template <class T, std::size_t R>
  using tensor_type = Tensor<T, R>;
  static constexpr const char* name = "cuda";

  /** Binds the calling rank's thread to its current device (device 0 if none) and installs device memory. */
  static void init_rank() { init_rank(gpu::this_thread().device() < 0 ? 0 : gpu::this_thread().device()); }
  /** Binds the calling rank's thread to `device`, creates its compute stream and installs stream-ordered device memory. */
  static void init_rank(int device) {
    gpu::this_thread().bind(device);
    gpu::keep_pool_memory(device);
    set_current_memory_resource(gpu::device_memory_resource());
  }
  /** Waits until the calling rank's compute stream is idle. */
  static void synchronize() { gpu::check(cudaStreamSynchronize(gpu::current_stream()), "cudaStreamSynchronize"); }

  // Stream-ordered execution (see `stream_ordered` in backend.hpp): CUDA events on the rank's compute
  // stream, cudaMemcpyAsync to and from page-locked host memory, allocation without initialisation.
  using event_type = gpu::Event;
  template <class T>
  using pinned_buffer = gpu::PinnedBuffer<T>;
  static void record_event(event_type& e) { e.record(gpu::current_stream()); }
  static void wait_event(const event_type& e) { e.synchronize(); }
  static void stream_wait_event(const event_type& e) { e.wait_on(gpu::current_stream()); }
  [[nodiscard]] static bool event_done(const event_type& e) { return e.ready(); }
  template <class T>
  static void copy_to_host_async(std::size_t n, const T* src, T* dst) {
    gpu::copy_to_host(src, dst, n, gpu::current_stream());
  }
  template <class T>
  static void copy_from_host_async(std::size_t n, const T* src, T* dst) {
    gpu::copy_to_device(src, dst, n, gpu::current_stream());
  }
  // Capture (see `graph_backend`): CUDA stream capture of the rank's compute stream into a `gpu::Graph`.
  using graph_type = gpu::Graph;
  static void begin_capture() { gpu::Graph::begin_capture(gpu::current_stream()); }
  [[nodiscard]] static graph_type end_capture() { return gpu::Graph::end_capture(gpu::current_stream()); }
  static void launch(const graph_type& g) { g.launch(gpu::current_stream()); }

  /** `n` elements of device memory (the thread's resource), not initialised: the host never touches them. */
  template <class T>
  [[nodiscard]] static Buffer<T> allocate(std::size_t n) {
    return uninitialized_buffer<T>(n);
  }

  /**
   * An operation object (backend/ops/operation.hpp) that has CUDA kernels: a `gpu::launch(op, stream)` overload
   * declared before this header, e.g. the buffer operations (gpu/buffer_launch.hpp), the GEMMs (gpu/gemm_ops.hpp), the layers' elementwise and row kernels
   * (gpu/layer_kernel_ops.hpp), the optimizer's (gpu/optimizer_ops.hpp), the vocabulary-parallel embedding and loss
   * (gpu/vocab_parallel_ops.hpp), the MoE's token routing (gpu/row_kernels.hpp, moe_routing.hpp, moe_ops.hpp)
   * the Llama-class layers' (gpu/llama_kernels.hpp) and ring attention's online softmax (gpu/online_softmax.hpp).
   */
  template <class Op>
    requires requires(const Op& op) { gpu::launch(op, cudaStream_t{}); }
  static void run(const Op& op) {
    then_wait([&] { gpu::launch(op, cudaStream_t{}); });
  }

  /**
   * Which shapes the fused attention operations take (ops::attention_forward/backward, gpu/fused_ops.hpp: cuDNN's
   * SDPA where it takes the call, mpar's flash kernel otherwise): `nn`'s attention core uses them
   * (`nn::fused_attention_backend`) for these shapes, and its batched GEMMs and softmax for the others.
   */
  [[nodiscard]] static bool attention_supports(std::size_t batch_heads, std::size_t head_dim) {
    return gpu::qkv_attention_supports(batch_heads, head_dim);
  }

 private:
  /**
   * Launches stream-ordered work and returns at once (the `backend` contract; the name is older than
   * it): launch errors are thrown here, execution errors at the next synchronisation.
   */
  template <class Launch>
  static void then_wait(Launch&& launch) {
    launch();
  }
};

static_assert(backend<CudaBackend>);
static_assert(detail::graph_backend<CudaBackend>);
static_assert(detail::online_softmax_backend<CudaBackend>);
static_assert(detail::llama_kernel_backend<CudaBackend>);
static_assert(detail::routing_backend<CudaBackend>);

}  // namespace mpar
