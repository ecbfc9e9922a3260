#pragma once
/**
 * @file ThreadsGroup: one group of a threads run (slots, the barrier every collective is built from, mailboxes).
 */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/threads/mailbox.hpp"
#include "mpar/comm/threads/slot.hpp"
#include "mpar/comm/threads/world.hpp"

namespace mpar::detail {

/** The CPUs this process may run on (its affinity mask where the system has one), at least 1. */
inline int available_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/**
 * One group (world or a split) of the ranks of a `World`: slots, a barrier with arrival tracking, and one
 * mailbox per rank. A class template (`ThreadsGroup` is the one the library uses) for the reason
 * `BasicThreadsWorld` is one: its inline bodies are compiled only by the programs that run threads.
 */
template <class World>
class BasicThreadsGroup {
 public:
  using world_type = World;

  BasicThreadsGroup(std::shared_ptr<World> world, std::string name, std::vector<int> world_ranks)
      : world_(std::move(world)), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
        size_(int(world_ranks_.size())), slots_(world_ranks_.size()),
        arrived_(std::make_unique<std::atomic<std::uint64_t>[]>(world_ranks_.size())),
        reading_(std::make_unique<std::atomic<bool>[]>(world_ranks_.size())) {
    for (int i = 0; i < size_; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
    // Spinning only pays when every rank of the run has a core: a group of 2 inside a world of 4 threads on 2
    // cores would spin while the peer it waits for waits for a core (measured: a 4-rank MoE run 3x slower).
    // Oversubscribed runs go straight to sleep.
    spin_ = world_->size() <= available_cpus();
    spin_time_ = world_->spin();
    if (spin_time_.count() <= 0) spin_ = false;
  }
  static std::shared_ptr<BasicThreadsGroup> create(std::shared_ptr<World> world, std::string name,
                                                   std::vector<int> world_ranks) {
    auto g = std::make_shared<BasicThreadsGroup>(world, std::move(name), std::move(world_ranks));
    world->register_group(g);
    return g;
  }

  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] World& world() const { return *world_; }
  [[nodiscard]] const std::shared_ptr<World>& world_ptr() const { return world_; }
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
    { std::lock_guard l(m_); }
    cv_.notify_all();
    for (auto& mb : mailboxes_) {
      { std::lock_guard l(mb->m); }
      mb->cv.notify_all();
    }
  }

 private:
  std::shared_ptr<World> world_;
  std::string name_;
  std::vector<int> world_ranks_;
  int size_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::atomic<std::uint64_t> state_{0};  // generation << 32 | arrivals
  std::atomic<int> sleepers_{0};         // ranks blocked on cv_: the last arriver only notifies when > 0
  std::chrono::microseconds spin_time_{1000};
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;  // generation + 1 of each rank's last arrival
  std::unique_ptr<std::atomic<bool>[]> reading_;           // rank is (about to be) reading peers' buffers
  std::mutex m_;
  std::condition_variable cv_;
  bool spin_ = true;
};

using ThreadsGroup = BasicThreadsGroup<ThreadsWorld>;

}  // namespace mpar::detail
