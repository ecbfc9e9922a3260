#pragma once
/** @file The host (CPU) backend policy type. */
#include <algorithm>
#include <cstddef>

#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/detail/llama_kernel_backend.hpp"
#include "mpar/backend/detail/online_softmax_backend.hpp"
#include "mpar/backend/detail/routing_backend.hpp"
#include "mpar/backend/host/buffer_ops.hpp"
#include "mpar/backend/host/gemm.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/host/retained_memory.hpp"
#include "mpar/backend/ops/fused.hpp"  // gelu_backward_bias, the one fused operation with a host reference
#include "mpar/core/memory_resource.hpp"

#if defined(MPAR_HAVE_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
#endif

namespace mpar {

/** @brief Memory-space tag: ordinary host memory. */
struct HostMemory {
  static constexpr const char* name = "host";
};

/**
 * @brief The CPU backend: host memory, the host GEMM (oneDNN, CBLAS or portable; single-threaded per
 * rank) and the host kernels, whose vector code matches the CPU at run time (see `isa.hpp`).
 *
 * Layers and executors are templates over a backend type; this one carries no state, so a call
 * through it is an ordinary inlined function call.
 */
struct HostBackend {
  using memory_space = HostMemory;
  template <class T, std::size_t R>
  using tensor_type = Tensor<T, R>;
  static constexpr const char* name = "host";

  /**
   * Called once per rank before compute: keeps BLAS single-threaded so ranks do not oversubscribe cores
   * (oneDNN's GEMMs set one thread per call themselves, see onednn_gemm.hpp), and has malloc keep freed
   * memory mapped, so a step's activations do not fault their pages in again every step.
   */
  static void init_rank() {
#if defined(MPAR_HAVE_OPENBLAS)
    openblas_set_num_threads(1);
#endif
    // Freed activations stay mapped for the next step's allocations (host/retained_memory.hpp).
    (void)host::retain_freed_memory();
  }
  /** Host work is finished when the call returns: nothing to wait for. */
  static void synchronize() {}

  // Stream-ordered execution (see `stream_ordered` in backend.hpp). Every operation has finished when
  // its call returns, so an event is passed as soon as it is recorded, a wait returns at once, and the
  // asynchronous copies are plain copies into ordinary host memory.
  /** A marker in a stream that is always passed. */
  struct event_type {};
  template <class T>
  using pinned_buffer = std::vector<T>;
  static void record_event(event_type&) {}
  static void wait_event(const event_type&) {}
  static void stream_wait_event(const event_type&) {}
  [[nodiscard]] static bool event_done(const event_type&) { return true; }
  template <class T>
  static void copy_to_host_async(std::size_t n, const T* src, T* dst) {
    std::copy_n(src, n, dst);
  }
  template <class T>
  static void copy_from_host_async(std::size_t n, const T* src, T* dst) {
    std::copy_n(src, n, dst);
  }
  /** `n` elements of the calling thread's memory resource, not initialised. */
  template <class T>
  [[nodiscard]] static Buffer<T> allocate(std::size_t n) {
    return uninitialized_buffer<T>(n);
  }

  /**
   * An operation object (backend/ops/operation.hpp) run by its plain-loop host reference: every operation that has
   * one, e.g. the optimizer's (`optimizer_backend`), the MoE's token routing (`routing_backend`), the Llama-class
   * layers' (`llama_kernel_backend`) and ring attention's online softmax (`online_softmax_backend`).
   */
  template <class Op>
    requires ops::has_host_reference<Op>
  static void run(const Op& op) { host_reference(op); }
};

static_assert(backend<HostBackend>);
static_assert(detail::online_softmax_backend<HostBackend>);
static_assert(detail::llama_kernel_backend<HostBackend>);
static_assert(detail::routing_backend<HostBackend>);

}  // namespace mpar
