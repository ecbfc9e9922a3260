#pragma once
/**
 * @file StreamOrderedCommunicator: a threads or MPI communicator whose operations on rank buffers are
 * ordered with a stream-emulating backend's compute stream, as NCCL's are with a GPU's.
 *
 * Under the asynchronous backend contract (backend/backend.hpp) a buffer an operation produces is not
 * ready when the call returns, so a communicator that reads it on the calling thread would need the
 * host to synchronise the compute stream first — a stall per collective. NCCL avoids it by running
 * the collective on its own stream after an event of the compute stream, and making the compute
 * stream wait for the collective's event. This adaptor does the same on the CPU, for a backend that
 * runs operations on a worker per rank (`StreamHostBackend`, `DiscreteHostBackend`):
 *
 * - Every call is issued to the rank's **communication stream** (one worker per rank, shared by the
 *   communicators split from the same one, so a rank's collectives keep their issue order across
 *   groups) and returns at once. There it first waits until the compute stream has run everything
 *   issued before the call (the producing operations), then runs the wrapped communicator's call.
 * - Blocking calls (`all_reduce`, `send`, `recv`, ...): the compute stream waits for the call before
 *   its next operation, so a consumer issued afterwards reads the result; the host reads it after
 *   `B::synchronize()` or an event wait, like any result.
 * - `i*` calls return a request; `wait()` does not block the host: it makes the compute stream wait for
 *   the operation. `test()` says whether the operation has completed (after `wait()` semantics are
 *   applied), without blocking.
 * - `barrier()` and `split()` block the host until they have run (they are about the host's progress
 *   and return a value).
 * - Buffers are captured as spans when the call is issued (counts of `all_to_all_v` are copied): rank
 *   memory must stay allocated until the compute stream has passed the call (a blocking call, or the
 *   request's `wait()`, orders the buffer's stream-ordered free after it). Host memory must stay valid
 *   and unchanged until a synchronisation. With `DiscreteHostBackend`, buffers must be rank memory.
 * - A failure of the wrapped call is reported by the compute stream's next synchronisation, naming the
 *   operation; the communication stream stays failed (every later call reports it), like a NCCL
 *   communicator after an error.
 * - While the compute stream is being captured (`graph_backend`, backend/stream/stream_graph.hpp) a call is
 *   recorded with the capture (`Stream::record_at_launch`): each launch of the graph issues it to the
 *   communication stream when it reaches the call's place, after the operations before it, exactly as the
 *   eager call (and, for a blocking call or a request's `wait()`, makes the compute stream wait for it) — as
 *   NCCL's kernels become nodes of a captured CUDA graph, replayed with it. `test()`, `barrier()` and `split()`
 *   during a capture throw `stream::capture_error`: they answer the host, which a graph cannot.
 */
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/backend/stream/stream.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

namespace detail {
template <class C>
constexpr bool matches_in_order_v() {
  if constexpr (requires { C::matches_in_order; })
    return C::matches_in_order;
  else
    return false;
}
}  // namespace detail

/** @brief A communicator ordered with the compute stream of stream backend `B` (see the file comment). */
template <communicator Comm, class B>
  requires requires { B::stream(); }
class StreamOrderedCommunicator {
  struct Shared {
    Shared(Comm c, std::shared_ptr<stream::Stream> s) : inner(std::move(c)), comm_stream(std::move(s)) {}
    // The queued calls use `inner`: they run before it is destroyed, wherever the stream's last owner is.
    ~Shared() { comm_stream->drain(); }
    Comm inner;
    std::shared_ptr<stream::Stream> comm_stream;
  };

 public:
  static constexpr bool matches_in_order = detail::matches_in_order_v<Comm>();

  /** Wraps `inner`; its calls run on a new communication stream of the calling rank. */
  explicit StreamOrderedCommunicator(Comm inner)
      : rank_(inner.rank()), size_(inner.size()), name_(inner.name()),
        shared_(std::make_shared<Shared>(std::move(inner), std::make_shared<stream::Stream>(detail::cat(
                                                               "communication stream of ", name_, " rank ", rank_)))) {}

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] std::string name() const { return name_; }

  /** A request for an `i*` call: `wait()` orders the compute stream after it (see the file comment). */
  template <class InnerRequest>
  class Request {
   public:
    Request() = default;
    void wait() {
      if (captured_) {  // recorded: each launch orders the compute stream after this launch's operation
        B::stream()->record_at_launch("wait for communication", [comm = shared_->comm_stream, inner = inner_] {
          return wait_for(comm, issue_wait(comm, inner));
        });
        return;
      }
      (void)order_compute();
    }
    [[nodiscard]] bool test() {
      B::stream()->require_not_capturing("test (a communication request)");
      return shared_->comm_stream->done(order_compute());
    }

   private:
    friend class StreamOrderedCommunicator;
    Request(std::shared_ptr<Shared> shared, std::shared_ptr<std::optional<InnerRequest>> inner, bool captured)
        : shared_(std::move(shared)), inner_(std::move(inner)), captured_(captured) {}
    /** Issues the wait for the inner request to the communication stream; returns its ticket. */
    static std::uint64_t issue_wait(const std::shared_ptr<stream::Stream>& comm,
                                    const std::shared_ptr<std::optional<InnerRequest>>& inner) {
      return comm->enqueue("wait", [inner] {
        if (*inner) (*inner)->wait();
      });
    }
    std::uint64_t order_compute() {
      if (wait_ticket_ == 0) {
        wait_ticket_ = issue_wait(shared_->comm_stream, inner_);
        B::stream()->enqueue("wait for communication", wait_for(shared_->comm_stream, wait_ticket_));
      }
      return wait_ticket_;
    }
    std::shared_ptr<Shared> shared_;
    std::shared_ptr<std::optional<InnerRequest>> inner_;
    std::uint64_t wait_ticket_ = 0;
    bool captured_ = false;  ///< issued during a capture of the compute stream: its wait is recorded too
  };

  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    refuse_op<T>("all_reduce", op);
    blocking("all_reduce", [d = rank_span(data, "all_reduce"), op](Comm& c) { c.all_reduce(d, op); });
  }
  template <detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    blocking("broadcast", [d = rank_span(data, "broadcast"), root](Comm& c) { c.broadcast(d, root); });
  }
  template <detail::comm_element T>
  void reduce(in_span<T> send, std::span<T> recv, ReduceOp op, int root) {
    refuse_op<T>("reduce", op);
    blocking("reduce", [s = rank_span(send, "reduce"), r = rank_span(recv, "reduce"), op, root](Comm& c) {
      c.reduce(s, r, op, root);
    });
  }
  template <detail::comm_element T>
  void all_gather(in_span<T> send, std::span<T> recv) {
    blocking("all_gather",
             [s = rank_span(send, "all_gather"), r = rank_span(recv, "all_gather")](Comm& c) { c.all_gather(s, r); });
  }
  template <detail::comm_element T>
  void reduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    refuse_op<T>("reduce_scatter", op);
    blocking("reduce_scatter", [s = rank_span(send, "reduce_scatter"), r = rank_span(recv, "reduce_scatter"),
                                op](Comm& c) { c.reduce_scatter(s, r, op); });
  }
  template <detail::comm_element T>
  void gather(in_span<T> send, std::span<T> recv, int root) {
    blocking("gather",
             [s = rank_span(send, "gather"), r = rank_span(recv, "gather"), root](Comm& c) { c.gather(s, r, root); });
  }
  template <detail::comm_element T>
  void scatter(in_span<T> send, std::span<T> recv, int root) {
    blocking("scatter", [s = rank_span(send, "scatter"), r = rank_span(recv, "scatter"), root](Comm& c) {
      c.scatter(s, r, root);
    });
  }
  template <detail::comm_element T>
  void all_to_all(in_span<T> send, std::span<T> recv) {
    blocking("all_to_all",
             [s = rank_span(send, "all_to_all"), r = rank_span(recv, "all_to_all")](Comm& c) { c.all_to_all(s, r); });
  }
  template <detail::comm_element T>
  void all_to_all_v(in_span<T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    blocking("all_to_all_v", [s = rank_span(send, "all_to_all_v"), r = rank_span(recv, "all_to_all_v"),
                              sc = std::vector<std::size_t>(send_counts.begin(), send_counts.end()),
                              rc = std::vector<std::size_t>(recv_counts.begin(), recv_counts.end())](Comm& c) {
      c.all_to_all_v(s, std::span<const std::size_t>(sc), r, std::span<const std::size_t>(rc));
    });
  }
  template <detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    blocking("send", [d = rank_span(data, "send"), peer, tag](Comm& c) { c.send(d, peer, tag); });
  }
  template <detail::comm_element T>
  void send(std::span<T> data, int peer, int tag) {
    send(std::span<const T>(data), peer, tag);
  }
  template <detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    blocking("recv", [d = rank_span(data, "recv"), peer, tag](Comm& c) { c.recv(d, peer, tag); });
  }

  template <detail::comm_element T>
  [[nodiscard]] auto isend(std::span<const T> data, int peer, int tag) {
    return immediate("isend", [d = rank_span(data, "isend"), peer, tag](Comm& c) { return c.isend(d, peer, tag); });
  }
  template <detail::comm_element T>
  [[nodiscard]] auto isend(std::span<T> data, int peer, int tag) {
    return isend(std::span<const T>(data), peer, tag);
  }
  template <detail::comm_element T>
  [[nodiscard]] auto irecv(std::span<T> data, int peer, int tag) {
    return immediate("irecv", [d = rank_span(data, "irecv"), peer, tag](Comm& c) { return c.irecv(d, peer, tag); });
  }
  template <detail::comm_element T>
  [[nodiscard]] auto iall_reduce(std::span<T> data, ReduceOp op) {
    refuse_op<T>("iall_reduce", op);
    return immediate("iall_reduce", [d = rank_span(data, "iall_reduce"), op](Comm& c) { return c.iall_reduce(d, op); });
  }
  template <detail::comm_element T>
  [[nodiscard]] auto iall_gather(in_span<T> send, std::span<T> recv) {
    return immediate("iall_gather", [s = rank_span(send, "iall_gather"), r = rank_span(recv, "iall_gather")](Comm& c) {
      return c.iall_gather(s, r);
    });
  }
  template <detail::comm_element T>
  [[nodiscard]] auto ireduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    refuse_op<T>("ireduce_scatter", op);
    return immediate("ireduce_scatter", [s = rank_span(send, "ireduce_scatter"), r = rank_span(recv, "ireduce_scatter"),
                                         op](Comm& c) { return c.ireduce_scatter(s, r, op); });
  }

  /** Blocks the host until every rank of the group has issued it and the compute stream reached it. */
  void barrier() {
    B::stream()->require_not_capturing("barrier");
    host_wait(issue("barrier", [](Comm& c) { c.barrier(); }));
  }

  /** Collective: a sub-communicator sharing this rank's communication stream; blocks until it exists. */
  template <class... Extra>
  [[nodiscard]] StreamOrderedCommunicator split(int color, int key, Extra... extra) {
    B::stream()->require_not_capturing("split");
    auto out = std::make_shared<std::optional<Comm>>();
    host_wait(issue("split", [out, color, key, extra...](Comm& c) { out->emplace(c.split(color, key, extra...)); }));
    return StreamOrderedCommunicator(std::move(**out), shared_->comm_stream);
  }

  /** The wrapped communicator; use it only while no call is queued (after a synchronisation). */
  [[nodiscard]] Comm& inner() { return shared_->inner; }

 private:
  StreamOrderedCommunicator(Comm inner, std::shared_ptr<stream::Stream> comm_stream)
      : rank_(inner.rank()), size_(inner.size()), name_(inner.name()),
        shared_(std::make_shared<Shared>(std::move(inner), std::move(comm_stream))) {}

  /** On the host, before the call is queued: an op `T` cannot reduce (avg of integers) fails at the call. */
  template <class T>
  void refuse_op(const char* op, ReduceOp r) const {
    if (std::string why = detail::reduce_op_error<T>(r); !why.empty())
      throw comm_error(
          detail::cat("StreamOrderedCommunicator ", op, " on group ", name(), ": rank ", rank(), " passed ", why));
  }
  template <class T>
  static std::span<T> rank_span(std::span<T> s, const char* op) {
    return B::operation_span(s, op);
  }

  /** Issues `f(inner)` to the communication stream after the compute stream's current end; returns its ticket. */
  template <class F>
  std::uint64_t issue(const char* what, F f) {
    return issue_to(shared_, what, std::move(f));
  }
  template <class F>
  static std::uint64_t issue_to(const std::shared_ptr<Shared>& shared, const char* what, F f) {
    const std::shared_ptr<stream::Stream>& compute = B::stream();
    const std::uint64_t produced = compute->issued();
    Comm* inner = &shared->inner;  // outlives the queued call (see Shared)
    return shared->comm_stream->enqueue(what, [compute, produced, inner, f]() mutable {
      compute->wait_from_other_stream(produced);
      f(*inner);
    });
  }
  /** The compute stream's operation that waits for ticket `t` of the communication stream `comm`. */
  static std::function<void()> wait_for(std::shared_ptr<stream::Stream> comm, std::uint64_t t) {
    return [comm = std::move(comm), t] { comm->wait_from_other_stream(t); };
  }
  /**
   * During a capture of the compute stream: records `f(inner)` with it, so that each launch issues it to the
   * communication stream at its place (after the operations before it) and, if `wait`, makes the compute stream
   * wait for it. Returns false when no capture is under way.
   */
  template <class F>
  bool record_in_capture(const char* what, F f, bool wait) {
    const std::shared_ptr<stream::Stream>& compute = B::stream();
    if (!compute->capturing()) return false;
    compute->record_at_launch(what, [shared = shared_, what, f, wait]() -> std::function<void()> {
      const std::uint64_t t = issue_to(shared, what, f);  // the graph holds `shared`: the communicator outlives it
      if (!wait) return {};
      return wait_for(shared->comm_stream, t);
    });
    return true;
  }
  /** A call whose result the compute stream's later operations read. */
  template <class F>
  void blocking(const char* what, F f) {
    if (record_in_capture(what, f, true)) return;
    const std::uint64_t t = issue(what, std::move(f));
    B::stream()->enqueue("wait for communication", wait_for(shared_->comm_stream, t));
  }
  template <class F>
  auto immediate(const char* what, F f) {
    using InnerRequest = decltype(f(std::declval<Comm&>()));
    auto inner = std::make_shared<std::optional<InnerRequest>>();
    auto start = [inner, f](Comm& c) mutable { inner->emplace(f(c)); };
    if (record_in_capture(what, start, false)) return Request<InnerRequest>(shared_, inner, true);
    (void)issue(what, std::move(start));
    return Request<InnerRequest>(shared_, inner, false);
  }
  void host_wait(std::uint64_t t) { shared_->comm_stream->wait_from_other_stream(t); }

  int rank_, size_;
  std::string name_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace mpar
