#pragma once
/**
 * @file `StreamHostBackend` and `DiscreteHostBackend`: the host kernels run asynchronously, on a
 * worker thread per rank in issue order, so the CPU test suite proves that code keeps the backend
 * contract (backend/backend.hpp) a GPU relies on.
 *
 * - Every operation of the `backend` concept returns at once; its arguments are captured by value
 *   when it is issued (pointers, sizes, the dropout mask), and the worker runs the `mpar::host`
 *   reference kernel later. What the caller must keep alive: the memory behind every pointer until
 *   the stream has passed the operation. Rank memory (from `allocate`, or any `Buffer`/`Tensor`
 *   created after `init_rank()`) is freed in stream order and needs nothing; host memory handed to
 *   an operation (a `pinned_buffer`, a `std::vector`) must stay allocated and unchanged until a wait.
 * - `synchronize()`, `wait_event(e)` and an operation that returns a value (none of the concept's
 *   do: results stay in rank memory) block until the worker has run everything up to that point; a failure on the worker surfaces there as
 *   `stream::stream_error` naming the operation (the original exception nested).
 * - Fresh rank memory is NaN-filled and freed in stream order (backend/stream/emulated_memory.hpp).
 * - `DiscreteHostBackend` also gives the host only `PROT_NONE` addresses of rank memory and
 *   translates each pointer argument to the readable mapping when the operation is issued; a
 *   pointer outside rank memory is an error naming the operation and the argument. The host then
 *   reaches rank memory only through `copy_to_host_async` / `copy_from_host_async`.
 *
 * - Capture (`graph_backend`): between `begin_capture()` and `end_capture()` the rank's operations are
 *   recorded into a `stream::Graph` instead of run, and `launch(g)` enqueues them again
 *   (backend/stream/stream_graph.hpp); a host wait during the capture throws `stream::capture_error`.
 *
 * Adding a backend operation: an operation object (backend/ops/operation.hpp) needs nothing here (`run` forwards
 * every one).
 */
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/copy_2d_shape.hpp"
#include "mpar/backend/detail/graph_backend.hpp"
#include "mpar/backend/detail/llama_kernel_backend.hpp"
#include "mpar/backend/detail/online_softmax_backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/stream/emulated_memory.hpp"
#include "mpar/backend/stream/stream.hpp"
#include "mpar/backend/stream/stream_graph.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/tensor.hpp"

namespace mpar {

/** @brief Memory-space tag: host memory reached in stream order (the emulated device memory of a rank). */
struct StreamMemory {
  static constexpr const char* name = "stream-emulated";
};

namespace stream {

/** @brief Rank memory with one address for host and operations (StreamHostBackend). */
struct SharedView {
  static constexpr const char* backend_name = "stream-host";
  [[nodiscard]] static EmulatedRankMemory& resource() { return shared_memory_resource(); }
  template <class T>
  [[nodiscard]] static T* address(T* p, const char*, std::size_t) {
    return p;
  }
};

/** @brief Rank memory the host cannot touch (DiscreteHostBackend): operations use the second mapping. */
struct DiscreteView {
  static constexpr const char* backend_name = "stream-host-discrete";
  [[nodiscard]] static EmulatedRankMemory& resource() { return discrete_memory_resource(); }
  template <class T>
  [[nodiscard]] static T* address(T* p, const char* op, std::size_t position) {
    if (p == nullptr) return p;
    void* q = discrete_memory_resource().operation_address(p);
    require(q != nullptr, "DiscreteHostBackend: argument ", position, " of ", op,
            " does not point into rank memory (allocate it after init_rank(), e.g. with allocate<T>(n) or a "
            "Tensor, not in a std::vector): a device operation could not reach it");
    return static_cast<T*>(q);
  }
};

}  // namespace stream

/**
 * @brief A backend that runs the host kernels on a worker thread per rank (see the file comment);
 * `View` says whether the host can address rank memory (`stream::SharedView`) or not
 * (`stream::DiscreteView`). Stateless like HostBackend: the rank's stream is thread-local.
 */
template <class View>
struct BasicStreamHostBackend {
  using memory_space = StreamMemory;
  template <class T, std::size_t R>
  using tensor_type = Tensor<T, R>;
  static constexpr const char* name = View::backend_name;
  /** Operations return before they run: only waits synchronise the host (observe::CountingBackend counts so). */
  static constexpr bool operations_block_host = false;

  /** Starts the calling rank's stream (its worker prepares itself like a HostBackend rank) and installs its rank memory. */
  static void init_rank() {
    (void)stream();
    set_current_memory_resource(View::resource());
  }
  /** Blocks until the calling rank's stream has run everything issued so far; reports a failure. */
  static void synchronize() {
    if (const auto& s = stream::thread_stream_slot()) {
      s->require_not_capturing("synchronize");
      s->synchronize();
    }
  }
  /** The calling thread's stream, started on first use. */
  [[nodiscard]] static const std::shared_ptr<stream::Stream>& stream() {
    auto& s = stream::thread_stream_slot();
    if (!s) {
      static std::atomic<int> counter{0};
      s = std::make_shared<stream::Stream>(mpar::detail::cat("stream ", counter.fetch_add(1)),
                                           [] { HostBackend::init_rank(); });
    }
    return s;
  }
  /** Where operations reach `data` (the same span, or its readable mapping for DiscreteHostBackend). */
  template <class T, std::size_t E>
  [[nodiscard]] static std::span<T> operation_span(std::span<T, E> data, const char* op, std::size_t position = 1) {
    return data.empty() ? std::span<T>() : std::span<T>(View::address(data.data(), op, position), data.size());
  }

  // Stream-ordered execution (see `stream_ordered` in backend.hpp).
  using event_type = stream::Event;
  template <class T>
  using pinned_buffer = std::vector<T>;
  static void record_event(event_type& e) { stream::record(e, stream()); }
  static void wait_event(const event_type& e) {
    if (const auto& s = stream::thread_stream_slot()) s->require_not_capturing("wait_event");
    stream::wait(e);
  }
  static void stream_wait_event(const event_type& e) { stream::stream_wait(*stream(), e); }
  [[nodiscard]] static bool event_done(const event_type& e) {
    if (const auto& s = stream::thread_stream_slot()) s->require_not_capturing("event_done");
    return stream::passed(e);
  }

  // Capture (see `graph_backend`): the rank's operations recorded into a graph, replayed by `launch`.
  using graph_type = stream::Graph;
  static void begin_capture() { stream()->begin_capture(); }
  [[nodiscard]] static graph_type end_capture() { return graph_type(stream(), stream()->end_capture()); }
  static void launch(const graph_type& g) { g.launch(*stream()); }
  // An empty copy may come with null pointers (an empty vector's data()), which memcpy must not be given.
  template <class T>
  static void copy_to_host_async(std::size_t n, const T* src, T* dst) {
    const T* from = View::address(src, "copy_to_host_async", 2);
    stream()->enqueue("copy_to_host_async", [n, from, dst] {
      if (n != 0) std::memcpy(dst, from, n * sizeof(T));
    });
  }
  template <class T>
  static void copy_from_host_async(std::size_t n, const T* src, T* dst) {
    T* to = View::address(dst, "copy_from_host_async", 3);
    stream()->enqueue("copy_from_host_async", [n, src, to] {
      if (n != 0) std::memcpy(to, src, n * sizeof(T));
    });
  }
  /** `n` elements of rank memory, NaN-filled (never written by the host). */
  template <class T>
  [[nodiscard]] static Buffer<T> allocate(std::size_t n) {
    return uninitialized_buffer<T>(n, View::resource());
  }

  /**
   * An operation object (backend/ops/operation.hpp), issued to the rank's stream as one operation that HostBackend
   * runs: its rank-memory operands (`op.each_operand`) are translated when it is issued, as every pointer argument
   * is, so every operation object is forwarded by this one entry.
   */
  template <class Op>
    requires supports<HostBackend, Op>
  static void run(const Op& op) {
    ops::check_when_issued(op, View::backend_name);  // a bad call throws here, not at the next wait
    Op issued = op;
    std::size_t position = 0;
    issued.each_operand([&](auto& p) { p = View::address(p, Op::name, ++position); });
    stream()->enqueue(Op::name, [issued] { HostBackend::run(issued); });
  }
};

/** @brief Host kernels in stream order on a worker thread per rank (see the file comment). */
using StreamHostBackend = BasicStreamHostBackend<stream::SharedView>;
/** @brief StreamHostBackend whose rank memory the host cannot touch: a host access faults. */
using DiscreteHostBackend = BasicStreamHostBackend<stream::DiscreteView>;

static_assert(backend<StreamHostBackend>);
static_assert(backend<DiscreteHostBackend>);
static_assert(mpar::detail::graph_backend<StreamHostBackend>);
static_assert(mpar::detail::graph_backend<DiscreteHostBackend>);
static_assert(mpar::detail::online_softmax_backend<StreamHostBackend> &&
              mpar::detail::online_softmax_backend<DiscreteHostBackend>);
static_assert(mpar::detail::llama_kernel_backend<StreamHostBackend> &&
              mpar::detail::llama_kernel_backend<DiscreteHostBackend>);

}  // namespace mpar
