#pragma once
/**
 * @file `stream::Graph`: the host model of a CUDA graph — the operations an emulated stream capture
 * recorded (stream::Stream's `begin_capture` / `end_capture`), replayed by `launch`.
 *
 * Why: CUDA Graphs replay a captured step with one launch, but only if nothing in the step waits on
 * the host or reads a value the host chose at capture time and must change later. Code that breaks
 * either rule works eagerly and fails only on a GPU. Recording the stream-emulating backends'
 * operations (each a closure of its arguments, captured by value) and enqueuing them again gives the
 * same semantics on the CPU: a replay reads and writes the addresses of the capture, host scalars
 * passed at capture time stay frozen, and a host wait during the capture is a `capture_error`.
 *
 * Memory: a block freed during the capture (a temporary of the step) is not freed; the graph keeps the
 * free and issues it, in stream order, when the graph is dropped — like CUDA's graph memory nodes,
 * whose memory stays reserved for the graph's replays. Blocks allocated during the capture and kept
 * by their owner belong to the owner, who must keep them while the graph may be launched.
 */
#include <memory>
#include <utility>

#include "mpar/backend/stream/stream.hpp"
#include "mpar/core/error.hpp"

namespace mpar::stream {

/** @brief A recorded sequence of a stream's operations (see the file comment); movable, not copyable. */
class Graph {
 public:
  Graph() = default;
  Graph(std::shared_ptr<Stream> captured_on, Capture c) : stream_(std::move(captured_on)), capture_(std::move(c)) {}
  Graph(Graph&& o) noexcept : stream_(std::move(o.stream_)), capture_(std::move(o.capture_)) { o.capture_ = {}; }
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      release();
      stream_ = std::move(o.stream_);
      capture_ = std::move(o.capture_);
      o.capture_ = {};
    }
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() { release(); }

  /**
   * Enqueues one replay on `s`, the stream it was captured on (whose order also orders the deferred
   * frees after every replay); returns at once.
   */
  void launch(Stream& s) const {
    require(stream_ != nullptr,
            "stream::Graph::launch: the graph is empty. Fix: build it with begin_capture / end_capture");
    require(&s == stream_.get(), "stream::Graph::launch: a graph captured on ", stream_->name(), " launched on ",
            s.name(), ". Fix: launch it on the rank (thread) that captured it");
    s.launch(capture_);
  }
  /** Number of operations recorded (the nodes of the CUDA graph it models, frees aside). */
  [[nodiscard]] std::size_t nodes() const { return capture_.ops.size(); }
  [[nodiscard]] bool empty() const { return stream_ == nullptr; }

 private:
  /** Issues the frees the capture deferred, after every replay issued so far (stream order). */
  void release() noexcept {
    if (!stream_) return;
    for (auto& f : capture_.frees) {
      try {
        stream_->enqueue_free(f);  // kept by a capture under way, like any free
      } catch (...) {
        f();  // the stream is stopping: it has run everything, so the block is free now
      }
    }
    capture_ = {};
    stream_.reset();
  }

  std::shared_ptr<Stream> stream_;
  Capture capture_;
};

}  // namespace mpar::stream
