#pragma once
/**
 * @file ThreadsWorld: the state every rank of one run_threads shares (poison flag, departures, timeout).
 */
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mpar/comm/detail/collective_check.hpp"

namespace mpar::detail {

/**
 * State shared by every rank of one `run_threads`: the poison flag, departures, the timeout, on `Clock`.
 * A class template (`ThreadsWorld` is the one the library uses) so that its inline bodies, and the standard
 * templates they instantiate, are compiled only by the programs that run threads, not by every includer of
 * `mpar/mpar.hpp` (docs/performance.md, "Compile cost of the umbrella header").
 */
template <class Clock = std::chrono::steady_clock>
class BasicThreadsWorld {
 public:
  BasicThreadsWorld(int n, std::chrono::duration<double> timeout,
                    std::chrono::microseconds spin = std::chrono::microseconds(1000))
      : timeout_(timeout), spin_(spin), n_(n), departed_(std::size_t(n)) {}

  [[nodiscard]] std::chrono::duration<double> timeout() const { return timeout_; }
  [[nodiscard]] std::chrono::microseconds spin() const { return spin_; }
  /** The ranks (threads) of the run. */
  [[nodiscard]] int size() const { return n_; }
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
      aborted_at_ = Clock::now();
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
      const auto deadline = aborted_at_ + std::chrono::duration_cast<typename Clock::duration>(grace);
      if (Clock::now() >= deadline) {
        std::vector<int> stuck;
        for (int r = 0; r < n_; ++r)
          if (!departed_[std::size_t(r)].load()) stuck.push_back(r);
        return stuck;
      }
      returned_cv_.wait_until(l, deadline);
    }
  }
  [[nodiscard]] bool departed(int world_rank) const { return departed_[std::size_t(world_rank)].load(); }
  /** Records a group to wake when the run fails; `Group::wake()` is recorded with it. */
  template <class Group>
  void register_group(const std::shared_ptr<Group>& g) {
    std::lock_guard l(m_);
    groups_.push_back({g, [](void* p) { static_cast<Group*>(p)->wake(); }});
  }
  /** Wakes every rank sleeping in a barrier or a receive of any live group, to see the abort. */
  void wake_all() {
    std::vector<std::pair<std::shared_ptr<void>, void (*)(void*)>> live;
    {
      std::lock_guard l(m_);
      for (auto& [group, wake] : groups_)
        if (auto g = group.lock()) live.emplace_back(std::move(g), wake);
    }
    for (auto& [g, wake] : live) wake(g.get());
  }

 private:
  std::chrono::duration<double> timeout_;
  std::chrono::microseconds spin_;
  int n_;
  mutable std::mutex m_;
  std::condition_variable returned_cv_;
  int returned_ = 0;                       // guarded by m_
  typename Clock::time_point aborted_at_;  // guarded by m_
  std::atomic<bool> aborted_{false};
  std::string message_;
  std::vector<std::atomic<bool>> departed_;
  std::vector<std::pair<std::weak_ptr<void>, void (*)(void*)>> groups_;  // each group and its wake()
};

using ThreadsWorld = BasicThreadsWorld<>;

}  // namespace mpar::detail
