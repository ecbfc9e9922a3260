#pragma once
/**
 * @file ThreadsCommunicator: N ranks as threads of one process, collectives in shared memory.
 *
 * Every collective publishes each rank's buffer pointers in a per-group slot table, meets at a
 * barrier, and then every rank reads its peers' buffers directly: all_reduce is a shared-memory
 * reduce-scatter (rank r reduces block_of(n, p, r) straight from all peers' buffers into its own)
 * followed by an all-gather (each rank copies the other reduced blocks from their owners). There is
 * no staging buffer: the only copies are the ones the result needs.
 *
 * Failure semantics (see docs/communicators.md): fingerprints are always compared after the first
 * barrier, so mismatched calls throw the same comm_error on every rank (and leave the group usable);
 * a rank that throws out of `run_threads`, a timeout, or a peer that has already returned poisons
 * the whole run, and every rank blocked in, or later entering, a collective gets a comm_error.
 */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/detail/reduce.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/** @brief Options of a threads run: the world group's name, the collective timeout, the barrier spin. */
struct ThreadsOptions {
  std::string name = "world";
  /**
   * A collective or receive that waits longer than this for a peer fails on every rank; and once the
   * run has failed, a rank that has not returned this long afterwards is stuck outside the
   * communicator, so `run_threads` reports and ends the process (see run_threads). At least 1e9 s
   * (`MPAR_COMM_TIMEOUT_S=inf`) means no timeout.
   */
  std::chrono::duration<double> timeout = detail::default_comm_timeout();
  /** How long a rank spins at a barrier before it sleeps (MPAR_THREADS_SPIN_US; 0: never spin). */
  std::chrono::microseconds spin = detail::default_spin_time();
};

/**
 * @brief The exception `run_threads` rethrows in the caller: the first failure of any rank, its
 * rank in the message ("rank 2: ...") and the original exception nested (`rethrow_nested()`).
 */
class rank_failure : public comm_error, public std::nested_exception {
 public:
  rank_failure(int rank, const std::string& what) : comm_error(detail::cat("rank ", rank, ": ", what)), rank_(rank) {}
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

namespace detail {

class ThreadsGroup;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/** State shared by every rank of one `run_threads`: the poison flag, departures, the timeout. */
class ThreadsWorld {
 public:
  ThreadsWorld(int n, std::chrono::duration<double> timeout,
               std::chrono::microseconds spin = std::chrono::microseconds(1000))
      : timeout_(timeout), spin_(spin), n_(n), departed_(std::size_t(n)) {}

  [[nodiscard]] std::chrono::duration<double> timeout() const { return timeout_; }
  [[nodiscard]] std::chrono::microseconds spin() const { return spin_; }
  [[nodiscard]] bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string abort_message() const {
    std::lock_guard l(m_);
    return message_;
  }
  /** Poisons the run; returns whether this call was the first failure (the root cause). */
  bool abort(const std::string& message) {
    {
      std::lock_guard l(m_);
      if (aborted_.load(std::memory_order_relaxed)) return false;
      message_ = message;
      aborted_at_ = std::chrono::steady_clock::now();
      aborted_.store(true, std::memory_order_release);
    }
    returned_cv_.notify_all();
    wake_all();
    return true;
  }
  /** Marks a world rank as returned from its function: waiting for it is pointless from now on. */
  void depart(int world_rank) {
    departed_[std::size_t(world_rank)].store(true);
    {
      std::lock_guard l(m_);
      ++returned_;
    }
    returned_cv_.notify_all();
    wake_all();
  }
  /**
   * Waits until every rank has returned from its function; once the run has failed, for at most
   * `grace` longer. Returns the ranks still running then (empty: all returned).
   */
  std::vector<int> wait_for_ranks(std::chrono::duration<double> grace) {
    std::unique_lock l(m_);
    for (;;) {
      if (returned_ == n_) return {};
      if (!aborted_.load(std::memory_order_relaxed) || is_no_timeout(grace)) {
        returned_cv_.wait(l);
        continue;
      }
      const auto deadline =
          aborted_at_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(grace);
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<int> stuck;
        for (int r = 0; r < n_; ++r)
          if (!departed_[std::size_t(r)].load()) stuck.push_back(r);
        return stuck;
      }
      returned_cv_.wait_until(l, deadline);
    }
  }
  [[nodiscard]] bool departed(int world_rank) const { return departed_[std::size_t(world_rank)].load(); }
  void register_group(const std::shared_ptr<ThreadsGroup>& g) {
    std::lock_guard l(m_);
    groups_.push_back(g);
  }
  inline void wake_all();

 private:
  std::chrono::duration<double> timeout_;
  std::chrono::microseconds spin_;
  int n_;
  mutable std::mutex m_;
  std::condition_variable returned_cv_;
  int returned_ = 0;  // guarded by m_
  std::chrono::steady_clock::time_point aborted_at_;  // guarded by m_
  std::atomic<bool> aborted_{false};
  std::string message_;
  std::vector<std::atomic<bool>> departed_;
  std::vector<std::weak_ptr<ThreadsGroup>> groups_;
};

/** What a rank publishes for the collective in flight; read by peers between two barriers. */
struct Slot {
  Fingerprint fp;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t src_count = 0, dst_count = 0;
  const std::size_t* counts_a = nullptr;  // all_to_all_v send counts
  const std::size_t* counts_b = nullptr;  // all_to_all_v recv counts
  int color = 0, key = 0;
  std::shared_ptr<ThreadsGroup> new_group;  // split: published by the lowest rank of each color
  std::string error;                        // this rank's own argument error, reported by every rank
};

/** A receive waiting for its message (posted by irecv/recv before the matching send arrived). */
struct PostedRecv {
  void* dst = nullptr;
  std::size_t count = 0;
  std::uint8_t dtype = 0;
  int src = 0, tag = 0;
  std::uint64_t seq = 0;
  bool done = false;  // guarded by the mailbox mutex
  std::string error;
};

/** A message sent before its receive was posted: the eager copy that makes sends never block. */
struct Message {
  int src = 0, tag = 0;
  std::uint8_t dtype = 0;
  std::size_t count = 0;
  std::vector<std::byte> data;
};

struct Mailbox {
  std::mutex m;
  std::condition_variable cv;
  std::deque<Message> unexpected;
  std::list<std::shared_ptr<PostedRecv>> posted;
};

/** One group (world or a split): slots, a barrier with arrival tracking, and one mailbox per rank. */
class ThreadsGroup {
 public:
  ThreadsGroup(std::shared_ptr<ThreadsWorld> world, std::string name, std::vector<int> world_ranks)
      : world_(std::move(world)), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
        size_(int(world_ranks_.size())), slots_(world_ranks_.size()),
        arrived_(std::make_unique<std::atomic<std::uint64_t>[]>(world_ranks_.size())),
        reading_(std::make_unique<std::atomic<bool>[]>(world_ranks_.size())) {
    for (int i = 0; i < size_; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
    // Spinning only pays when every rank has a core; oversubscribed runs go straight to sleep.
    spin_ = size_ <= int(std::max(1u, std::thread::hardware_concurrency()));
    spin_time_ = world_->spin();
    if (spin_time_.count() <= 0) spin_ = false;
  }
  static std::shared_ptr<ThreadsGroup> create(std::shared_ptr<ThreadsWorld> world, std::string name,
                                              std::vector<int> world_ranks) {
    auto g = std::make_shared<ThreadsGroup>(world, std::move(name), std::move(world_ranks));
    world->register_group(g);
    return g;
  }

  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] ThreadsWorld& world() const { return *world_; }
  [[nodiscard]] const std::shared_ptr<ThreadsWorld>& world_ptr() const { return world_; }
  [[nodiscard]] int world_rank(int r) const { return world_ranks_[std::size_t(r)]; }
  [[nodiscard]] Slot& slot(int r) { return slots_[std::size_t(r)]; }
  [[nodiscard]] Mailbox& mailbox(int r) { return *mailboxes_[std::size_t(r)]; }

  [[noreturn]] void throw_aborted(std::string_view op, std::uint64_t seq) const {
    throw comm_error(cat(op_prefix(op, seq, name_), " aborted: ", world_->abort_message()));
  }

  /**
   * The barrier every collective is built from. Fails (never hangs) when the run is poisoned,
   * when a missing peer has already returned from its function, or after the timeout; the last
   * two poison the run too. A failing rank first withdraws its arrival (so the barrier can no
   * longer complete and release peers into reading its buffers) and waits until no peer is still
   * reading from an earlier phase; only then may its buffers go away with the exception.
   */
  void arrive_and_wait(int rank, std::string_view op, std::uint64_t seq) {
    if (world_->aborted()) {
      quiesce(rank);
      throw_aborted(op, seq);
    }
    if (size_ == 1) return;
    // state_ = generation << 32 | arrivals, updated by CAS only so that arriving, completing and
    // withdrawing are one linear history.
    std::uint64_t st = state_.load();
    std::uint32_t g = 0;
    for (;;) {
      g = std::uint32_t(st >> 32);
      const bool last = (st & 0xffffffffu) + 1 == std::uint64_t(size_);
      const std::uint64_t next = last ? std::uint64_t(g + 1) << 32 : st + 1;
      if (state_.compare_exchange_weak(st, next)) {
        if (!last) break;
        if (sleepers_.load() > 0) {  // seq_cst with the sleeper's increment: it sees the change or is woken
          { std::lock_guard l(m_); }
          cv_.notify_all();
        }
        return;
      }
    }
    arrived_[std::size_t(rank)].store(std::uint64_t(g) + 1, std::memory_order_relaxed);
    auto done = [&] { return std::uint32_t(state_.load(std::memory_order_acquire) >> 32) != g; };
    if (spin_) {
      // Peers usually arrive within microseconds; sleeping costs a scheduler round trip.
      const auto spin_until = std::chrono::steady_clock::now() + spin_time_;
      for (unsigned i = 1;; ++i) {
        if (done()) return;
        if ((i & 63u) == 0 && (world_->aborted() || std::chrono::steady_clock::now() >= spin_until)) break;
        cpu_relax();
      }
    }
    const auto deadline = deadline_after(world_->timeout());
    std::unique_lock l(m_);
    ++sleepers_;
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { --n; }
    } leave{sleepers_};
    for (;;) {
      if (done()) return;
      std::string failure;
      bool poison = true;
      if (world_->aborted()) {
        failure = cat(op_prefix(op, seq, name_), " aborted: ", world_->abort_message());
        poison = false;
      } else {
        std::vector<int> missing, gone;
        for (int q = 0; q < size_; ++q) {
          if (arrived_[std::size_t(q)].load(std::memory_order_relaxed) == std::uint64_t(g) + 1) continue;
          missing.push_back(q);
          if (world_->departed(world_rank(q))) gone.push_back(q);
        }
        if (!gone.empty())
          failure = cat(op_prefix(op, seq, name_), ": rank", gone.size() > 1 ? "s " : " ", join_ranks(gone),
                        gone.size() > 1 ? " have" : " has", " already returned and will never arrive");
        else if (std::chrono::steady_clock::now() >= deadline)
          failure = cat(op_prefix(op, seq, name_), " timed out after ", world_->timeout().count(), " s: rank",
                        missing.size() > 1 ? "s " : " ", join_ranks(missing), " never arrived");
      }
      if (!failure.empty()) {
        l.unlock();
        if (!withdraw(rank, g)) return;  // the barrier completed meanwhile: carry on
        if (poison) world_->abort(failure);
        quiesce(rank);
        throw comm_error(failure);
      }
      cv_.wait_until(l, deadline);
    }
  }

  /** Marks that `rank` will read peers' buffers after its next barrier, until the phase ends. */
  void set_reading(int rank, bool on) { reading_[std::size_t(rank)].store(on); }

  /** Poisons the run with `message` (unless already poisoned) and throws it here. */
  [[noreturn]] void fail(const std::string& message) {
    world_->abort(message);
    throw comm_error(message);
  }

 private:
  /** Takes back this rank's arrival at generation g; false if the barrier already completed. */
  bool withdraw(int rank, std::uint32_t g) {
    std::uint64_t st = state_.load();
    while (std::uint32_t(st >> 32) == g)
      if (state_.compare_exchange_weak(st, st - 1)) {
        arrived_[std::size_t(rank)].store(0, std::memory_order_relaxed);
        return true;
      }
    return false;
  }
  /**
   * Before a failing rank unwinds (and frees its buffers): waits until no peer is inside a data
   * phase that reads them. Phases are plain copies, so this takes microseconds; bounded anyway.
   */
  void quiesce(int rank) {
    set_reading(rank, false);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int q = 0; q < size_; ++q)
      while (reading_[std::size_t(q)].load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 public:

  void wake() {
    {
      std::lock_guard l(m_);
    }
    cv_.notify_all();
    for (auto& mb : mailboxes_) {
      {
        std::lock_guard l(mb->m);
      }
      mb->cv.notify_all();
    }
  }

 private:
  std::shared_ptr<ThreadsWorld> world_;
  std::string name_;
  std::vector<int> world_ranks_;
  int size_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::atomic<std::uint64_t> state_{0};  // generation << 32 | arrivals
  std::atomic<int> sleepers_{0};  // ranks blocked on cv_: the last arriver only notifies when > 0
  std::chrono::microseconds spin_time_{1000};
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;  // generation + 1 of each rank's last arrival
  std::unique_ptr<std::atomic<bool>[]> reading_;           // rank is (about to be) reading peers' buffers
  std::mutex m_;
  std::condition_variable cv_;
  bool spin_ = true;
};

inline void ThreadsWorld::wake_all() {
  std::vector<std::shared_ptr<ThreadsGroup>> live;
  {
    std::lock_guard l(m_);
    for (auto& w : groups_)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  for (auto& g : live) g->wake();
}

/**
 * The completion state of an asynchronous collective run by the progress thread. A failure is kept
 * as its message and thrown as a new comm_error by the waiting rank: rethrowing the progress
 * thread's exception object would share one object between two threads.
 */
struct TaskState {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;  ///< empty: success
  void finish(std::string e) {
    {
      std::lock_guard l(m);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};

/**
 * One rank's progress thread: runs asynchronous collectives in issue order, so they overlap
 * with whatever the rank computes meanwhile. Started on the first asynchronous call.
 */
class ProgressThread {
 public:
  ProgressThread() = default;
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;
  ~ProgressThread() {
    {
      std::lock_guard l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard l(m_);
      queue_.push_back(std::move(task));
      ++pending_;
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
  }
  /** Blocks until every submitted task has finished: blocking calls keep issue order. */
  void drain() {
    std::unique_lock l(m_);
    idle_.wait(l, [&] { return pending_ == 0; });
  }

 private:
  void loop() {
    std::unique_lock l(m_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      task();  // tasks catch their own exceptions into their TaskState
      l.lock();
      if (--pending_ == 0) idle_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> queue_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace detail

class ThreadsCommunicator;

/**
 * @brief The request of an asynchronous ThreadsCommunicator operation.
 *
 * Collectives run on the rank's progress thread and overlap with the caller; `isend` completes
 * on issue (eager copy); `irecv` completes when the matching send arrives. Destroying an
 * unfinished collective request waits for it (the progress thread still writes the buffer);
 * destroying an unfinished receive cancels it.
 */
class ThreadsRequest {
 public:
  ThreadsRequest() = default;
  ThreadsRequest(ThreadsRequest&& o) noexcept { swap(o); }
  ThreadsRequest& operator=(ThreadsRequest&& o) noexcept {
    ThreadsRequest tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ThreadsRequest(const ThreadsRequest&) = delete;
  ThreadsRequest& operator=(const ThreadsRequest&) = delete;
  ~ThreadsRequest() {
    if (task_) {
      std::unique_lock l(task_->m);
      task_->cv.wait(l, [&] { return task_->done; });
    } else if (recv_) {
      auto& mb = group_->mailbox(rank_);
      std::lock_guard l(mb.m);
      if (!recv_->done) mb.posted.remove(recv_);
    }
  }

  /** Blocks until the operation finished; rethrows its error. */
  void wait() {
    if (task_) {
      std::string e;
      {
        std::unique_lock l(task_->m);
        task_->cv.wait(l, [&] { return task_->done; });
        e = task_->error;
      }
      if (!e.empty()) throw comm_error(e);
    } else if (recv_) {
      wait_recv();
    }
    if (!error_.empty()) throw comm_error(error_);
  }
  /** Whether the operation finished (wait() then returns at once). */
  [[nodiscard]] bool test() const {
    if (task_) {
      std::lock_guard l(task_->m);
      return task_->done;
    }
    if (recv_) {
      auto& mb = group_->mailbox(rank_);
      std::lock_guard l(mb.m);
      return recv_->done;
    }
    return true;
  }

 private:
  friend class ThreadsCommunicator;
  void swap(ThreadsRequest& o) noexcept {
    std::swap(task_, o.task_);
    std::swap(recv_, o.recv_);
    std::swap(group_, o.group_);
    std::swap(rank_, o.rank_);
    std::swap(error_, o.error_);
  }
  void wait_recv() {
    auto& g = *group_;
    auto& mb = g.mailbox(rank_);
    auto& pr = *recv_;
    const auto prefix = detail::op_prefix("recv", pr.seq, g.name());
    const auto deadline = detail::deadline_after(g.world().timeout());
    std::unique_lock l(mb.m);
    for (;;) {
      if (pr.done) break;
      if (g.world().aborted()) {
        mb.posted.remove(recv_);
        l.unlock();
        g.throw_aborted("recv", pr.seq);
      }
      if (g.world().departed(g.world_rank(pr.src))) {
        mb.posted.remove(recv_);
        l.unlock();
        g.fail(detail::cat(prefix, ": rank ", pr.src, " has already returned without sending tag ", pr.tag, " to rank ",
                           rank_));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        mb.posted.remove(recv_);
        l.unlock();
        g.fail(detail::cat(prefix, " timed out after ", g.world().timeout().count(), " s: rank ", pr.src,
                           " never sent tag ", pr.tag, " to rank ", rank_));
      }
      mb.cv.wait_until(l, deadline);
    }
    const std::string err = pr.error;
    recv_.reset();
    l.unlock();
    if (!err.empty()) throw comm_error(err);
  }

  std::shared_ptr<detail::TaskState> task_;
  std::shared_ptr<detail::PostedRecv> recv_;
  std::shared_ptr<detail::ThreadsGroup> group_;
  int rank_ = 0;
  std::string error_;  // an error found at issue time, reported by wait()
};

/**
 * @brief A rank of a group of threads; satisfies `communicator`.
 *
 * Copies share the same rank state (sequence numbers, progress thread), so a communicator can be
 * held by value in several layers. Obtain one from `run_threads` (or `single()`), and
 * sub-communicators from `split`.
 */
class ThreadsCommunicator {
 public:
  using request_type = ThreadsRequest;

  ThreadsCommunicator(std::shared_ptr<detail::ThreadsGroup> group, int rank)
      : st_(std::make_shared<State>(std::move(group), rank)) {}

  /** A one-rank world, for serial code paths and tests. */
  [[nodiscard]] static ThreadsCommunicator single(const ThreadsOptions& opts = {}) {
    auto world = std::make_shared<detail::ThreadsWorld>(1, opts.timeout, opts.spin);
    return ThreadsCommunicator(detail::ThreadsGroup::create(world, opts.name, {0}), 0);
  }

  [[nodiscard]] int rank() const { return st_->rank; }
  [[nodiscard]] int size() const { return st_->group->size(); }
  [[nodiscard]] std::string name() const { return st_->group->name(); }
  /** This rank's index in the `run_threads` world. */
  [[nodiscard]] int world_rank() const { return st_->group->world_rank(st_->rank); }
  /** The number of collectives this rank has issued on this group (the next one is `seq() + 1`). */
  [[nodiscard]] std::uint64_t seq() const { return st_->seq; }

  // ---- blocking collectives ------------------------------------------------------------------

  /** In place: every rank ends with op over all ranks' `data`. */
  template <element_type T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    drain();
    all_reduce_impl(data, op);
  }
  /** In place: every rank ends with root's `data`. */
  template <element_type T>
  void broadcast(std::span<T> data, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::broadcast, data.size(), -1, root));
    s.dst = data.data();
    auto& g = *st_->group;
    collective([&] {
      if (rank() != root && !data.empty()) std::memcpy(data.data(), g.slot(root).dst, data.size_bytes());
    });
  }
  /** `recv` (root only, size = send.size()) receives op over all ranks' `send`. */
  template <element_type T>
  void reduce(in_span<T> send, std::span<T> recv, ReduceOp op, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::reduce, send.size(), int(op), root));
    s.src = send.data();
    s.dst = recv.data();
    if (rank() == root && recv.size() != send.size())
      s.error = detail::cat("rank ", rank(), " (root) passed recv of ", recv.size(), " elements, expected ", send.size());
    auto& g = *st_->group;
    collective([&] {
      // Every rank reduces its own block into root's recv: the work is spread as in all_reduce.
      const Block b = block_of(send.size(), std::size_t(size()), std::size_t(rank()));
      if (b.extent == 0) return;
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).src) + b.offset; });
      detail::reduce_into(static_cast<T*>(g.slot(root).dst) + b.offset, srcs.data(), srcs.size(), b.extent, op,
                          std::size_t(size()));
    });
  }
  /** recv.size() = n; rank r contributes block_of(n, p, r). `send` may be that block of `recv`. */
  template <element_type T>
  void all_gather(in_span<T> send, std::span<T> recv) {
    drain();
    all_gather_impl(send, recv);
  }
  /** send.size() = n; rank r receives block_of(n, p, r), reduced with op. */
  template <element_type T>
  void reduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    drain();
    reduce_scatter_impl(send, recv, op);
  }
  /** recv (root only) has n elements; rank r contributes block_of(n, p, r). */
  template <element_type T>
  void gather(in_span<T> send, std::span<T> recv, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::gather, 0, -1, root));
    s.src = send.data();
    s.src_count = send.size();
    s.dst = recv.data();
    s.dst_count = recv.size();
    auto& g = *st_->group;
    collective(
        [&] {
          const Block b = block_of(g.slot(root).dst_count, std::size_t(size()), std::size_t(rank()));
          if (b.extent) std::memcpy(static_cast<T*>(g.slot(root).dst) + b.offset, send.data(), b.extent * sizeof(T));
        },
        [&]() -> std::string { return check_blocks("send", root, [&](int q) { return g.slot(q).src_count; }); });
  }
  /** send (root only) has n elements; rank r receives block_of(n, p, r). */
  template <element_type T>
  void scatter(in_span<T> send, std::span<T> recv, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::scatter, 0, -1, root));
    s.src = send.data();
    s.src_count = send.size();
    s.dst_count = recv.size();
    auto& g = *st_->group;
    collective(
        [&] {
          const Block b = block_of(g.slot(root).src_count, std::size_t(size()), std::size_t(rank()));
          if (b.extent) std::memcpy(recv.data(), static_cast<const T*>(g.slot(root).src) + b.offset, b.extent * sizeof(T));
        },
        [&]() -> std::string { return check_blocks("recv", root, [&](int q) { return g.slot(q).dst_count; }); });
  }
  /** Equal blocks: send.size() = recv.size() = p*b; recv block q on rank r = send block r of rank q. */
  template <element_type T>
  void all_to_all(in_span<T> send, std::span<T> recv) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::all_to_all, send.size(), -1, -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    if (recv.size() != send.size() || send.size() % p != 0)
      s.error = detail::cat("rank ", rank(), " passed send of ", send.size(), " and recv of ", recv.size(),
                            " elements; both must be equal and divisible by the group size ", p);
    auto& g = *st_->group;
    collective([&] {
      const std::size_t b = send.size() / p;
      if (b == 0) return;
      for (int q = 0; q < size(); ++q)
        std::memcpy(recv.data() + std::size_t(q) * b, static_cast<const T*>(g.slot(q).src) + std::size_t(rank()) * b,
                    b * sizeof(T));
    });
  }
  /** Variable blocks: rank r sends send_counts[q] elements to q and receives recv_counts[q] from q, packed in rank order. */
  template <element_type T>
  void all_to_all_v(in_span<T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::all_to_all_v, 0, -1, -1));
    const auto p = std::size_t(size());
    s.src = send.data();
    s.counts_a = send_counts.data();
    s.counts_b = recv_counts.data();
    if (send_counts.size() != p || recv_counts.size() != p)
      s.error = detail::cat("rank ", rank(), " passed ", send_counts.size(), " send counts and ", recv_counts.size(),
                            " recv counts; the group has ", p, " ranks");
    else if (std::reduce(send_counts.begin(), send_counts.end(), std::size_t(0)) > send.size() ||
             std::reduce(recv_counts.begin(), recv_counts.end(), std::size_t(0)) > recv.size())
      s.error = detail::cat("rank ", rank(), ": the counts exceed the buffers (send ", send.size(), ", recv ",
                            recv.size(), " elements)");
    auto& g = *st_->group;
    collective(
        [&] {
          std::size_t roff = 0;
          for (int q = 0; q < size(); ++q) {
            const std::size_t* sc = g.slot(q).counts_a;
            const std::size_t soff = std::accumulate(sc, sc + rank(), std::size_t(0));
            const std::size_t c = recv_counts[std::size_t(q)];
            if (c) std::memcpy(recv.data() + roff, static_cast<const T*>(g.slot(q).src) + soff, c * sizeof(T));
            roff += c;
          }
        },
        [&]() -> std::string {
          for (int q = 0; q < size(); ++q)
            for (int r = 0; r < size(); ++r)
              if (g.slot(q).counts_a[r] != g.slot(r).counts_b[q])
                return detail::cat("rank ", q, " sends ", g.slot(q).counts_a[r], " elements to rank ", r,
                                   " but rank ", r, " expects ", g.slot(r).counts_b[q]);
          return {};
        });
  }
  void barrier() {
    drain();
    st_->begin(detail::Fingerprint{detail::CollKind::barrier});
    collective([] {});
  }

  // ---- point to point --------------------------------------------------------------------------

  /**
   * Eager: copies `data` straight into the receiver's buffer when its receive is already posted,
   * otherwise into the receiver's mailbox, and returns; two ranks sending to each other first
   * never deadlock.
   */
  template <element_type T>
  void send(std::span<const T> data, int peer, int tag) {
    check_peer("send", peer);
    auto& mb = st_->group->mailbox(peer);
    {
      std::lock_guard l(mb.m);
      for (auto it = mb.posted.begin(); it != mb.posted.end(); ++it) {
        auto& pr = **it;
        if (pr.src != rank() || pr.tag != tag) continue;
        if (pr.dtype != detail::dtype_code_v<T> || pr.count != data.size())
          pr.error = mismatch_message(pr, peer, detail::dtype_code_v<T>, data.size());
        else if (!data.empty())
          std::memcpy(pr.dst, data.data(), data.size_bytes());
        pr.done = true;
        mb.posted.erase(it);
        mb.cv.notify_all();
        return;
      }
      detail::Message msg{rank(), tag, detail::dtype_code_v<T>, data.size(), std::vector<std::byte>(data.size_bytes())};
      if (!data.empty()) std::memcpy(msg.data.data(), data.data(), data.size_bytes());
      mb.unexpected.push_back(std::move(msg));
    }
    mb.cv.notify_all();
  }
  template <element_type T>
  void send(std::span<T> data, int peer, int tag) {
    send(std::span<const T>(data), peer, tag);
  }
  /** Blocks until the message with `tag` from `peer` arrived; its element type and count must match. */
  template <element_type T>
  void recv(std::span<T> data, int peer, int tag) {
    irecv(data, peer, tag).wait();
  }
  /** Completes at once (see send). */
  template <element_type T>
  [[nodiscard]] ThreadsRequest isend(std::span<const T> data, int peer, int tag) {
    send(data, peer, tag);
    return {};
  }
  template <element_type T>
  [[nodiscard]] ThreadsRequest isend(std::span<T> data, int peer, int tag) {
    return isend(std::span<const T>(data), peer, tag);
  }
  template <element_type T>
  [[nodiscard]] ThreadsRequest irecv(std::span<T> data, int peer, int tag) {
    check_peer("recv", peer);
    ThreadsRequest req;
    auto& mb = st_->group->mailbox(rank());
    const std::uint64_t seq = ++st_->p2p_seq;
    std::lock_guard l(mb.m);
    for (auto it = mb.unexpected.begin(); it != mb.unexpected.end(); ++it) {
      if (it->src != peer || it->tag != tag) continue;
      if (it->dtype != detail::dtype_code_v<T> || it->count != data.size()) {
        detail::PostedRecv pr{data.data(), data.size(), detail::dtype_code_v<T>, peer, tag, seq};
        req.error_ = mismatch_message(pr, rank(), it->dtype, it->count);
      } else if (!data.empty()) {
        std::memcpy(data.data(), it->data.data(), data.size_bytes());
      }
      mb.unexpected.erase(it);
      return req;
    }
    req.recv_ = std::make_shared<detail::PostedRecv>(
        detail::PostedRecv{data.data(), data.size(), detail::dtype_code_v<T>, peer, tag, seq});
    req.group_ = st_->group;
    req.rank_ = rank();
    mb.posted.push_back(req.recv_);
    return req;
  }

  // ---- asynchronous collectives (run on this rank's progress thread, in issue order) ------------

  template <element_type T>
  [[nodiscard]] ThreadsRequest iall_reduce(std::span<T> data, ReduceOp op) {
    return submit([data, op](ThreadsCommunicator& c) { c.all_reduce_impl(data, op); });
  }
  template <element_type T>
  [[nodiscard]] ThreadsRequest iall_gather(in_span<T> send, std::span<T> recv) {
    return submit([send, recv](ThreadsCommunicator& c) { c.all_gather_impl(send, recv); });
  }
  template <element_type T>
  [[nodiscard]] ThreadsRequest ireduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    return submit([send, recv, op](ThreadsCommunicator& c) { c.reduce_scatter_impl(send, recv, op); });
  }

  // ---- groups ----------------------------------------------------------------------------------

  /** The ranks with equal `color` (>= 0), ordered by (key, rank); named "<parent>.<color>". */
  [[nodiscard]] ThreadsCommunicator split(int color, int key) { return split(color, key, {}); }
  /** As split(color, key), with the new group's name for error messages ("tensor", "data", ...). */
  [[nodiscard]] ThreadsCommunicator split(int color, int key, std::string name) {
    drain();
    auto& s = st_->begin(detail::Fingerprint{detail::CollKind::split});
    s.color = color;
    s.key = key;
    if (color < 0) s.error = detail::cat("rank ", rank(), " passed color ", color, "; colors must be >= 0");
    auto& g = *st_->group;
    std::vector<int> members;
    auto me = [&] { return int(std::find(members.begin(), members.end(), rank()) - members.begin()); };
    // Phase 1: agree on the members; the lowest rank of each color creates the group.
    run_phase_checked([] { return std::string{}; });
    for (int q = 0; q < size(); ++q)
      if (g.slot(q).color == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return g.slot(a).key < g.slot(b).key; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank()) {
      std::vector<int> world_ranks;
      for (int q : members) world_ranks.push_back(g.world_rank(q));
      g.slot(rank()).new_group = detail::ThreadsGroup::create(
          g.world_ptr(), name.empty() ? detail::cat(g.name(), ".", color) : std::move(name), std::move(world_ranks));
    }
    g.arrive_and_wait(rank(), "split", st_->seq);
    ThreadsCommunicator sub(g.slot(leader).new_group, me());
    g.arrive_and_wait(rank(), "split", st_->seq);
    g.slot(rank()).new_group.reset();
    return sub;
  }

 private:
  struct State {
    State(std::shared_ptr<detail::ThreadsGroup> g, int r) : group(std::move(g)), rank(r) {}
    /** Starts a collective: bumps the sequence number and publishes its fingerprint. */
    detail::Slot& begin(detail::Fingerprint f) {
      f.seq = ++seq;
      auto& s = group->slot(rank);
      s = detail::Slot{};
      s.fp = f;
      return s;
    }
    std::shared_ptr<detail::ThreadsGroup> group;
    int rank;
    std::uint64_t seq = 0;
    std::uint64_t p2p_seq = 0;
    detail::ProgressThread progress;  // last: joined before the rest is destroyed
  };

  explicit ThreadsCommunicator(std::shared_ptr<State> st) : st_(std::move(st)) {}

  template <class T>
  static detail::Fingerprint fp(detail::CollKind k, std::size_t count, int op, int root) {
    return {k, detail::dtype_code_v<T>, std::int8_t(op), root, count, 0};
  }

  void drain() { st_->progress.drain(); }

  void check_peer(std::string_view op, int peer) const {
    if (peer < 0 || peer >= size())
      throw comm_error(detail::cat(op, " on group ", name(), ": rank ", rank(), " named peer ", peer,
                                   "; the group has ranks 0..", size() - 1));
  }

  /** The receiver's error for a message whose type or count differs from its receive. */
  std::string mismatch_message(const detail::PostedRecv& pr, int receiver, std::uint8_t sent_dtype,
                               std::size_t sent_count) const {
    return detail::cat(detail::op_prefix("recv", pr.seq, name()), ": rank ", receiver, " expected ", pr.count, " ",
                       detail::dtype_names[pr.dtype], " from rank ", pr.src, " with tag ", pr.tag, ", but rank ", pr.src,
                       " sent ", sent_count, " ", detail::dtype_names[sent_dtype]);
  }

  /**
   * Meets the peers, then checks every rank's fingerprint and argument errors (`extra` adds
   * cross-rank checks). Every rank reads the same slots, so all throw the same message; they
   * meet once more first so no rank overwrites its slot while a peer still reads it.
   */
  template <class Extra>
  void run_phase_checked(Extra&& extra) {
    auto& g = *st_->group;
    const auto& mine = g.slot(rank()).fp;
    const auto op = detail::coll_name(mine.kind);
    g.arrive_and_wait(rank(), op, st_->seq);
    std::string err;
    std::vector<int> bad;
    for (int q = 1; q < size(); ++q)
      if (!(g.slot(q).fp == g.slot(0).fp)) bad.push_back(q);
    if (!bad.empty()) {
      err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ranks called different collectives: rank 0 ",
                        detail::describe(g.slot(0).fp));
      for (int q : bad) err += detail::cat("; rank ", q, " ", detail::describe(g.slot(q).fp));
    } else {
      for (int q = 0; q < size() && err.empty(); ++q)
        if (!g.slot(q).error.empty()) err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ", g.slot(q).error);
      if (err.empty())
        if (std::string x = extra(); !x.empty()) err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ", x);
    }
    if (!err.empty()) {
      g.set_reading(rank(), false);
      g.arrive_and_wait(rank(), op, st_->seq);
      throw comm_error(err);
    }
  }

  /** Flags this rank as reading peers' buffers from the next barrier until `end()` (or unwinding). */
  class ReadingScope {
   public:
    ReadingScope(detail::ThreadsGroup& g, int rank) : g_(g), rank_(rank) { g_.set_reading(rank_, true); }
    ~ReadingScope() { end(); }
    ReadingScope(const ReadingScope&) = delete;
    ReadingScope& operator=(const ReadingScope&) = delete;
    void end() { g_.set_reading(rank_, false); }

   private:
    detail::ThreadsGroup& g_;
    int rank_;
  };

  /** A checked collective whose data movement is `body`, run between two barriers. */
  template <class Body, class Extra>
  void collective(Body&& body, Extra&& extra) {
    auto& g = *st_->group;
    ReadingScope reading(g, rank());
    run_phase_checked(std::forward<Extra>(extra));
    body();
    reading.end();
    g.arrive_and_wait(rank(), detail::coll_name(g.slot(rank()).fp.kind), st_->seq);
  }
  template <class Body>
  void collective(Body&& body) {
    collective(std::forward<Body>(body), [] { return std::string{}; });
  }

  /** gather/scatter: root's count n; every rank's own count must be block_of(n, p, rank). */
  template <class CountOf>
  std::string check_blocks(std::string_view what, int root, CountOf&& count_of) {
    auto& g = *st_->group;
    const std::size_t n = (what == "send") ? g.slot(root).dst_count : g.slot(root).src_count;
    for (int q = 0; q < size(); ++q) {
      const Block b = block_of(n, std::size_t(size()), std::size_t(q));
      if (count_of(q) != b.extent)
        return detail::cat("rank ", q, " passed ", what, " of ", count_of(q), " elements, expected block_of(", n, ", ",
                           size(), ", ", q, ") = ", b.extent, " (root ", root, " has ", n, ")");
    }
    return {};
  }

  template <class T, class F>
  std::vector<const T*> peer_ptrs(F&& f) const {
    std::vector<const T*> v(static_cast<std::size_t>(size()));
    for (int q = 0; q < size(); ++q) v[std::size_t(q)] = f(q);
    return v;
  }

  template <element_type T>
  void all_reduce_impl(std::span<T> data, ReduceOp op) {
    auto& s = st_->begin(fp<T>(detail::CollKind::all_reduce, data.size(), int(op), -1));
    s.dst = data.data();
    auto& g = *st_->group;
    const auto p = std::size_t(size());
    ReadingScope reading(g, rank());
    run_phase_checked([] { return std::string{}; });
    if (p == 1) return;  // sum, avg, max and min of one buffer are the buffer
    // Reduce-scatter: rank r reduces its block straight from every peer's buffer into its own.
    const Block mine = block_of(data.size(), p, std::size_t(rank()));
    if (mine.extent) {
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).dst) + mine.offset; });
      detail::reduce_into(data.data() + mine.offset, srcs.data(), p, mine.extent, op, p);
    }
    g.arrive_and_wait(rank(), "all_reduce", st_->seq);
    // All-gather: copy the other reduced blocks from their owners' buffers.
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const Block b = block_of(data.size(), p, std::size_t(q));
      if (b.extent)
        std::memcpy(data.data() + b.offset, static_cast<const T*>(g.slot(q).dst) + b.offset, b.extent * sizeof(T));
    }
    reading.end();
    g.arrive_and_wait(rank(), "all_reduce", st_->seq);  // peers may still read our buffer until here
  }

  template <element_type T>
  void all_gather_impl(std::span<const T> send, std::span<T> recv) {
    auto& s = st_->begin(fp<T>(detail::CollKind::all_gather, recv.size(), -1, -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    const Block mine = block_of(recv.size(), p, std::size_t(rank()));
    if (send.size() != mine.extent)
      s.error = detail::cat("rank ", rank(), " passed send of ", send.size(), " elements, expected block_of(",
                            recv.size(), ", ", p, ", ", rank(), ") = ", mine.extent);
    auto& g = *st_->group;
    collective([&] {
      for (int q = 0; q < size(); ++q) {
        const Block b = block_of(recv.size(), p, std::size_t(q));
        const T* src = static_cast<const T*>(g.slot(q).src);
        if (b.extent && src != recv.data() + b.offset) std::memcpy(recv.data() + b.offset, src, b.extent * sizeof(T));
      }
    });
  }

  template <element_type T>
  void reduce_scatter_impl(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    auto& s = st_->begin(fp<T>(detail::CollKind::reduce_scatter, send.size(), int(op), -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    const Block mine = block_of(send.size(), p, std::size_t(rank()));
    if (recv.size() != mine.extent)
      s.error = detail::cat("rank ", rank(), " passed recv of ", recv.size(), " elements, expected block_of(",
                            send.size(), ", ", p, ", ", rank(), ") = ", mine.extent);
    auto& g = *st_->group;
    collective([&] {
      if (!mine.extent) return;
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).src) + mine.offset; });
      detail::reduce_into(recv.data(), srcs.data(), p, mine.extent, op, p);
    });
  }

  template <class F>
  ThreadsRequest submit(F&& f) {
    ThreadsRequest req;
    req.task_ = std::make_shared<detail::TaskState>();
    State* st = st_.get();
    st->progress.submit([st, f = std::forward<F>(f), task = req.task_]() mutable {
      // The task runs through a communicator sharing nothing but the raw state: holding st_
      // here would keep the state (and this thread) alive forever.
      ThreadsCommunicator self{std::shared_ptr<State>(std::shared_ptr<State>{}, st)};
      try {
        f(self);
        task->finish({});
      } catch (const std::exception& e) {
        task->finish(*e.what() ? e.what() : "asynchronous operation failed");
      } catch (...) {
        task->finish("unknown exception in an asynchronous operation");
      }
    });
    return req;
  }

  std::shared_ptr<State> st_;
};

static_assert(communicator<ThreadsCommunicator>);

namespace detail {

/** One rank's failure in a threads run. */
struct RankError {
  int rank = -1;
  std::string what;
  std::exception_ptr error;
  bool reports_peers = false;  ///< it only reports other ranks' failures (a peer_failure_report)
};

/** Whether `e` only reports other ranks' failures: it derives from peer_failure_report. */
[[nodiscard]] inline bool reports_peer_failures(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const peer_failure_report&) {
    return true;
  } catch (...) {
    return false;
  }
}

/**
 * A failed run's errors in the order of its report. First the root cause: the rank that reported a
 * timeout (its error is the abort message), else the rank whose exception poisoned the run; but a
 * report of other ranks' failures gives way to the earliest own error of a failing rank, since which
 * of the two threw first is a race and the report refers to it. Then the other ranks' own errors,
 * reports of peers' failures last; otherwise in the order the ranks failed.
 */
[[nodiscard]] inline std::vector<RankError> order_failures(std::vector<RankError> errors, int root_rank,
                                                           const std::string& abort_message) {
  if (errors.empty()) return errors;
  std::stable_partition(errors.begin(), errors.end(), [](const RankError& e) { return !e.reports_peers; });
  const auto echoes_abort = [&](const RankError& e) {
    return !abort_message.empty() && e.what.find(abort_message) != std::string::npos;
  };
  auto first = std::find_if(errors.begin(), errors.end(), [&](const RankError& e) { return e.rank == root_rank; });
  for (auto it = errors.begin(); it != errors.end(); ++it)
    if (it->what == abort_message) first = it;
  if (first == errors.end() || first->reports_peers) {
    const auto own = std::find_if(errors.begin(), errors.end(),
                                  [&](const RankError& e) { return !e.reports_peers && !echoes_abort(e); });
    if (own != errors.end()) first = own;
  }
  if (first == errors.end()) first = errors.begin();
  std::rotate(errors.begin(), first, std::next(first));
  return errors;
}

/**
 * The message of a failed run, from its errors in report order (order_failures): the first failure,
 * then every other rank's own failure, one per line; a rank whose error merely reports the run's abort
 * is left out, and so is a message already listed (the same report from several ranks).
 */
inline std::string run_failure_message(const std::vector<RankError>& ordered, const std::string& abort_message) {
  if (ordered.empty()) return {};
  std::string msg = ordered.front().what;
  std::vector<const std::string*> listed{&ordered.front().what};
  std::size_t more = 0;
  for (const auto& e : ordered) {
    if (std::any_of(listed.begin(), listed.end(), [&](const std::string* w) { return *w == e.what; })) continue;
    if (!abort_message.empty() && e.what.find(abort_message) != std::string::npos) continue;
    if (listed.size() > 8) {
      ++more;
      continue;
    }
    listed.push_back(&e.what);
    msg += cat("\nrank ", e.rank, ": ", e.what);
  }
  if (more) msg += cat("\n(and ", more, " more ranks failed)");
  return msg;
}

}  // namespace detail

/**
 * @brief Runs `f(ThreadsCommunicator&)` on `n` threads (ranks 0..n-1 of a group named
 * `opts.name`), joins them, and rethrows the first failure as `rank_failure`; its message goes on
 * with every other rank's own failure, one per line. A failure that only reports other ranks'
 * failures (a `peer_failure_report`) comes after their own errors (see detail::order_failures).
 *
 * A rank that throws poisons the run: every rank blocked in, or later entering, a collective gets
 * a comm_error naming the operation, group, sequence number and the failed rank.
 *
 * A rank that has not returned `opts.timeout` after the run failed is stuck outside the
 * communicator (in a computation or a lock of its own): a thread cannot be interrupted and its
 * stack still holds the run's state, so, as an MPI job aborts, `run_threads` prints the failures
 * and the stuck ranks to stderr and ends the process with exit status 3 instead of waiting forever.
 */
template <class F>
  requires std::invocable<F&, ThreadsCommunicator&>
void run_threads(int n, const ThreadsOptions& opts, F&& f) {
  require(n >= 1, "run_threads: needs at least one rank, got ", n);
  auto world = std::make_shared<detail::ThreadsWorld>(n, opts.timeout, opts.spin);
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = detail::ThreadsGroup::create(world, opts.name, ranks);
  std::mutex fm;
  int first_rank = -1;
  std::vector<detail::RankError> errors;
  auto body = [&](int r) {
    {
      ThreadsCommunicator comm(group, r);
      try {
        f(comm);
      } catch (...) {
        auto e = std::current_exception();
        const std::string what = detail::what_of(e);
        // A communicator failure (a timeout, a mismatch) poisons the run itself before it throws, so
        // this may not be the call that aborts; the run must fail all the same.
        const bool root_cause = world->abort(detail::cat("rank ", r, " threw: ", what));
        std::lock_guard l(fm);
        if (root_cause || first_rank < 0) first_rank = r;
        errors.push_back({r, what, e, detail::reports_peer_failures(e)});
      }
    }  // ~comm drains pending asynchronous work, which fails fast once the run is poisoned
    world->depart(r);
  };
  auto failure = [&] {
    std::lock_guard l(fm);
    if (first_rank < 0) return std::string{};
    const std::string abort_message = world->abort_message();
    const auto ordered = detail::order_failures(errors, first_rank, abort_message);
    first_rank = ordered.front().rank;
    return detail::run_failure_message(ordered, abort_message);
  };
  if (n == 1) {
    body(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(std::size_t(n));
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
    if (const auto stuck = world->wait_for_ranks(opts.timeout); !stuck.empty()) {
      std::string why = failure();
      if (why.empty()) why = world->abort_message();
      std::fprintf(stderr, "mpar: run_threads: the run failed: rank %d: %s\n", first_rank, why.c_str());
      std::fprintf(stderr,
                   "mpar: run_threads: rank%s %s of group '%s' did not return within %g s after the run failed: %s "
                   "stuck outside the communicator, and a thread cannot be interrupted; exiting the process (status 3)\n",
                   stuck.size() > 1 ? "s" : "", detail::join_ranks(stuck).c_str(), opts.name.c_str(),
                   opts.timeout.count(), stuck.size() > 1 ? "they are" : "it is");
      std::fflush(stderr);
      std::_Exit(3);
    }
    for (auto& t : threads) t.join();
  }
  if (const std::string why = failure(); !why.empty()) {
    std::exception_ptr first;
    for (const auto& e : errors)
      if (e.rank == first_rank) first = e.error;
    try {
      std::rethrow_exception(first);
    } catch (...) {
      throw rank_failure(first_rank, why);
    }
  }
}

template <class F>
  requires std::invocable<F&, ThreadsCommunicator&>
void run_threads(int n, F&& f) {
  run_threads(n, ThreadsOptions{}, std::forward<F>(f));
}

}  // namespace mpar
