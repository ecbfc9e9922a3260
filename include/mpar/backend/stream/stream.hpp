#pragma once
/**
 * @file `stream::Stream`: an in-order queue of operations run by one worker thread — the host model
 * of a CUDA stream — and `stream::Event`, a position in it.
 *
 * Why: the backend contract (backend/backend.hpp) lets an operation return before it has run. On the
 * host every backend used to run operations before returning, so code that reads a result without
 * waiting for it worked by accident. Running the operations on a worker thread makes such code wrong
 * in a way tests see: a read not ordered by an event or `synchronize()` either follows the write,
 * a data race ThreadSanitizer reports, or precedes it (the worker lags behind the host) and reads a
 * stale or NaN-filled value, which an equivalence test sees.
 *
 * Semantics:
 * - `enqueue(what, op)` appends `op` and returns its ticket (1, 2, ...: the stream's count of issued
 *   operations); the worker runs operations in ticket order, one at a time.
 * - `wait(ticket)` blocks until the worker has finished every operation up to `ticket`. Everything
 *   those operations wrote happens-before the return (the completion count is published under a
 *   mutex), which is what makes the host's subsequent reads race-free.
 * - An operation that throws puts the stream in error: later operations are skipped (their results
 *   would be garbage, as after a failed kernel on a GPU) except those enqueued as `always`, which
 *   release memory and signal other streams. The next `wait` on the host throws `stream_error`
 *   naming the stream, the operation and its ticket, with the original exception nested, and clears
 *   the error; operations issued after that run again.
 * - The destructor runs what is queued and joins the worker; an error nobody waited for is printed
 *   to stderr (a destructor cannot throw).
 * - Capture (the host model of CUDA stream capture, see backend/stream/stream_graph.hpp): between
 *   `begin_capture()` and `end_capture()` an enqueued operation is recorded instead of run (it gets no
 *   ticket), and `launch(c)` enqueues the recorded operations again, as often as wanted. What CUDA
 *   rejects during capture is rejected here with `capture_error` naming the operation: a host wait
 *   (`wait`, `synchronize`, a progress query), an event recorded or waited for across streams. A free
 *   issued during capture is kept with the capture and runs when its owner drops it, so memory the
 *   captured operations use stays valid for every replay (CUDA's graph memory nodes).
 */
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"

namespace mpar::stream {

/** @brief An operation that failed on a stream, reported at the next wait; the original is nested. */
class stream_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/** @brief What CUDA rejects during stream capture, done during an emulated capture (see the file comment). */
class capture_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/** @brief Whether an operation runs after an earlier one failed (see the file comment). */
enum class OnError { skip, always };

/** @brief The operations a capture recorded, and the frees it deferred (see the file comment). */
struct Capture {
  struct Op {
    std::function<void()> op;
    const char* what;
    OnError mode;
    /// Set instead of `op` by `record_at_launch`: called on the host at each launch, in this operation's place.
    std::function<std::function<void()>()> at_launch;
  };
  std::vector<Op> ops;
  std::vector<std::function<void()>> frees;  ///< issued during the capture: run when the capture is dropped
};

/** @brief An in-order queue of operations and the worker thread that runs them (see the file comment). */
class Stream {
 public:
  /** `name` appears in error messages ("stream 3", "communication stream of tensor rank 1"); `on_start` runs first on the worker. */
  explicit Stream(std::string name, std::function<void()> on_start = {}) : name_(std::move(name)) {
    worker_ = std::thread([this, start = std::move(on_start)] {
      if (start) start();
      run();
    });
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    push(new Node{{}, "stop", OnError::always, 0, nullptr, true});  // runs after everything issued
    if (worker_.get_id() == std::this_thread::get_id())
      worker_.detach();  // last owner was an operation
    else
      worker_.join();
    std::lock_guard lock(done_m_);
    if (error_ && !error_reported_)
      std::fprintf(stderr, "mpar: %s: an error nobody waited for: %s\n", name_.c_str(), describe_error().c_str());
  }

  [[nodiscard]] const std::string& name() const { return name_; }

  /**
   * Appends `op` (named `what`, a string literal) and returns its ticket; never blocks on the worker.
   * During a capture the operation is recorded instead, and the ticket of the last operation issued returned.
   */
  std::uint64_t enqueue(const char* what, std::function<void()> op, OnError mode = OnError::skip) {
    {
      std::lock_guard lock(push_m_);
      if (capture_) {
        capture_->ops.push_back({std::move(op), what, mode, {}});
        return issued_;
      }
    }
    return push(new Node{std::move(op), what, mode, 0, nullptr, false});
  }
  /**
   * Appends `release` (the free of a block that operations issued so far may use) as an `always` operation;
   * during a capture it is kept with the capture instead: replays still use the block.
   */
  void enqueue_free(std::function<void()> release) {
    {
      std::lock_guard lock(push_m_);
      if (capture_) {
        capture_->frees.push_back(std::move(release));
        return;
      }
    }
    push(new Node{std::move(release), "free", OnError::always, 0, nullptr, false});
  }

  /** Starts recording the operations enqueued from now on instead of running them (see the file comment). */
  void begin_capture() {
    std::lock_guard lock(push_m_);
    if (capture_)
      throw capture_error(mpar::detail::cat(name_,
                                            ": begin_capture while a capture is under way (captures do not nest; "
                                            "end the first with end_capture)"));
    capture_.emplace();
  }
  /** Ends the capture and returns what it recorded. */
  [[nodiscard]] Capture end_capture() {
    std::lock_guard lock(push_m_);
    if (!capture_) throw capture_error(mpar::detail::cat(name_, ": end_capture without begin_capture"));
    Capture c = std::move(*capture_);
    capture_.reset();
    return c;
  }
  /** Whether a capture is under way. */
  [[nodiscard]] bool capturing() const {
    std::lock_guard lock(push_m_);
    return capture_.has_value();
  }
  /** Throws capture_error naming `operation` (what the host tried: "synchronize", an operation's name) during a capture. */
  void require_not_capturing(const char* operation) const {
    if (capturing())
      throw capture_error(mpar::detail::cat(
          name_, ": '", operation,
          "' during a capture: it would make the host wait for (or query) the stream, which a captured graph cannot "
          "do (CUDA rejects it too). Fix: move it before begin_capture or after end_capture, and keep what the step "
          "needs in rank memory"));
  }
  /**
   * During a capture: records `issue`, which each launch calls on the host when it reaches this operation; what
   * it returns (if anything) is enqueued in the operation's place. For work of another stream that a replay must
   * order as the eager call did — a communicator's call issued to its own stream after the operations before it
   * (comm/stream_ordered_communicator.hpp) — where a recorded operation could only issue it once it runs, behind whatever the
   * other stream was given meanwhile. Throws capture_error when no capture is under way.
   */
  void record_at_launch(const char* what, std::function<std::function<void()>()> issue) {
    std::lock_guard lock(push_m_);
    if (!capture_) throw capture_error(mpar::detail::cat(name_, ": record_at_launch ('", what, "') without a capture"));
    capture_->ops.push_back({{}, what, OnError::skip, std::move(issue)});
  }
  /** Enqueues every operation of `c` again, in the order they were recorded (a replay). */
  void launch(const Capture& c) {
    for (const Capture::Op& o : c.ops) {
      if (!o.at_launch) {
        enqueue(o.what, o.op, o.mode);
      } else if (std::function<void()> op = o.at_launch()) {
        enqueue(o.what, std::move(op), o.mode);
      }
    }
  }

  /** The ticket of the last operation issued (0: none yet). */
  [[nodiscard]] std::uint64_t issued() const {
    std::lock_guard lock(push_m_);
    return issued_;
  }
  /** Whether every operation up to `ticket` has finished (if so, their results may be read); never blocks on the worker. */
  [[nodiscard]] bool done(std::uint64_t ticket) const {
    std::lock_guard lock(done_m_);
    return completed_ >= ticket;
  }

  /**
   * Host wait: blocks until every operation up to `ticket` has finished, then throws stream_error for
   * an operation that failed (and clears the error). On the worker itself it does not block (the
   * operations before the calling one have finished).
   */
  void wait(std::uint64_t ticket) {
    if (std::this_thread::get_id() != worker_.get_id()) require_not_capturing("a host wait (wait_event, synchronize)");
    std::unique_lock lock(done_m_);
    if (std::this_thread::get_id() != worker_.get_id()) done_cv_.wait(lock, [&] { return completed_ >= ticket; });
    if (error_ && error_ticket_ <= ticket) {
      const std::string what = describe_error();
      const std::exception_ptr e = std::exchange(error_, nullptr);
      error_reported_ = true;
      lock.unlock();
      try {
        std::rethrow_exception(e);
      } catch (...) {
        std::throw_with_nested(stream_error(what));
      }
    }
  }
  /** Blocks until everything issued so far has run; reports nothing (for owners about to go away). */
  void drain() noexcept {
    if (std::this_thread::get_id() == worker_.get_id()) return;
    const std::uint64_t last = issued();
    std::unique_lock lock(done_m_);
    done_cv_.wait(lock, [&] { return completed_ >= last; });
  }
  /** Waits for everything issued so far (see wait). */
  void synchronize() { wait(issued()); }

  /**
   * Device-side wait, called by an operation of another stream: blocks until `ticket` is passed and
   * throws stream_error if this stream failed at or before it (without clearing the error, which
   * stays this stream's to report), so a dependent stream does not compute on garbage.
   */
  void wait_from_other_stream(std::uint64_t ticket) const {
    std::unique_lock lock(done_m_);
    done_cv_.wait(lock, [&] { return completed_ >= ticket; });
    if (error_ && error_ticket_ <= ticket) {
      // The message carries the original's text, but the original is not nested: an exception object
      // owned by two streams' threads would be released by whichever drops it last, and that
      // reference count lives in the standard library, outside what a race detector can see.
      const std::string what = describe_error();
      error_reported_ = true;  // the dependent stream reports it
      lock.unlock();
      throw stream_error(what);
    }
  }

 private:
  struct Node {
    std::function<void()> op;
    const char* what;
    OnError mode;
    std::uint64_t ticket;
    Node* next;
    bool stop;
  };

  /*
   * Synchronisation runs one way only, so that ThreadSanitizer sees a host read that no wait orders
   * after the producing operation as the data race it is. Issuing goes host -> worker: producers
   * serialise on push_m_ (which the worker never takes) and publish on `incoming_` with release; the
   * worker takes the list with an acquire exchange, which does not release anything back. Completion
   * goes worker -> host only through done_m_, which the host takes in waits and queries. A queue
   * under one mutex would order every operation the worker has finished before every later issue,
   * hiding such races.
   */
  std::uint64_t push(Node* n) {
    std::lock_guard lock(push_m_);
    if (stopped_) {
      const char* what = n->what;
      delete n;
      throw config_error(
          mpar::detail::cat(name_, ": operation '", what, "' issued to a stream that is being destroyed"));
    }
    if (n->stop)
      stopped_ = true;
    else
      n->ticket = ++issued_;
    const std::uint64_t ticket = n->ticket;  // once published, the node belongs to the worker
    n->next = incoming_.load(std::memory_order_relaxed);
    while (!incoming_.compare_exchange_weak(n->next, n, std::memory_order_release, std::memory_order_relaxed)) {}
    incoming_.notify_one();
    return ticket;
  }

  void run() {
    for (;;) {
      incoming_.wait(nullptr, std::memory_order_acquire);
      Node* list = incoming_.exchange(nullptr, std::memory_order_acquire);
      Node* in_order = nullptr;  // the list is newest first
      while (list) {
        Node* next = list->next;
        list->next = in_order;
        in_order = list;
        list = next;
      }
      while (in_order) {
        Node* task = in_order;
        in_order = task->next;
        if (task->stop) {
          delete task;
          return;  // the stop node is the last one ever issued
        }
        bool skip;
        {
          std::lock_guard lock(done_m_);
          skip = error_ != nullptr && task->mode == OnError::skip;
        }
        std::exception_ptr failure;
        if (!skip) {
          try {
            task->op();
          } catch (...) {
            failure = std::current_exception();
          }
        }
        const std::uint64_t ticket = task->ticket;
        const char* what = task->what;
        delete task;  // release what the operation captured before it counts as finished
        {
          std::lock_guard lock(done_m_);
          if (failure && !error_) {
            error_ = std::move(failure);  // the worker keeps no reference: the host releases it
            error_what_ = what;
            error_ticket_ = ticket;
            error_reported_ = false;
          }
          completed_ = ticket;
        }
        done_cv_.notify_all();
      }
    }
  }

  [[nodiscard]] std::string describe_error() const {
    return mpar::detail::cat(name_, ": operation '", error_what_, "' (#", error_ticket_,
                             " on this stream) failed: ", detail::what_of(error_));
  }

  std::string name_;
  mutable std::mutex push_m_;       // producers only
  std::uint64_t issued_ = 0;        // guarded by push_m_
  bool stopped_ = false;            // guarded by push_m_
  std::optional<Capture> capture_;  // guarded by push_m_: set while a capture records
  std::atomic<Node*> incoming_{nullptr};
  mutable std::mutex done_m_;  // the worker -> host direction
  mutable std::condition_variable done_cv_;
  std::uint64_t completed_ = 0;  // guarded by done_m_, like the error state below
  std::exception_ptr error_;
  const char* error_what_ = "";
  std::uint64_t error_ticket_ = 0;
  mutable bool error_reported_ = false;
  std::thread worker_;  // assigned in the constructor body, after every other member exists
};

/**
 * @brief The calling thread's rank stream (null until a stream-emulating backend's `init_rank()` or
 * first operation creates it). Thread-local: a rank is a thread; at the thread's exit the stream runs
 * what is queued and stops, unless something else (an event, another stream waiting on it) holds it.
 */
[[nodiscard]] inline std::shared_ptr<Stream>& thread_stream_slot() {
  thread_local std::shared_ptr<Stream> s;
  return s;
}

/** @brief A position in a stream: passed once the stream has run every operation issued before it was recorded. */
struct Event {
  std::shared_ptr<Stream> stream;  ///< null: never recorded, which counts as passed
  std::uint64_t ticket = 0;
};

/** Records `e` at the current end of `s`. */
inline void record(Event& e, const std::shared_ptr<Stream>& s) {
  // A captured operation has no ticket: an event after it could not say when a replay has passed it.
  s->require_not_capturing("record_event");
  e.stream = s;
  e.ticket = s->issued();
}
/** Whether `e` is passed, without blocking. */
[[nodiscard]] inline bool passed(const Event& e) {
  if (e.stream) e.stream->require_not_capturing("event_done");
  return !e.stream || e.stream->done(e.ticket);
}
/** Host wait for `e`; reports an error of its stream (see Stream::wait). */
inline void wait(const Event& e) {
  if (e.stream) e.stream->wait(e.ticket);
}
/** Makes `s` wait for `e` before its next operation, without blocking the caller. */
inline void stream_wait(Stream& s, const Event& e) {
  if (!e.stream || e.stream.get() == &s || e.ticket == 0) return;  // own stream: already in order
  // A recorded wait would name this ticket at every replay, long passed: it would order nothing.
  s.require_not_capturing("stream_wait_event (on another stream's event)");
  s.enqueue("stream_wait_event", [other = e.stream, t = e.ticket] { other->wait_from_other_stream(t); });
}

}  // namespace mpar::stream
