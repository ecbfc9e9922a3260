#pragma once
/**
 * @file ProgressThread: one rank's thread that runs its asynchronous collectives in issue order.
 */
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace mpar::detail {

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
 * One rank's progress thread: runs asynchronous collectives (each a `Task`, called with no arguments) in
 * issue order, so they overlap with whatever the rank computes meanwhile. Started on the first asynchronous
 * call. A class template (`ProgressThread` is the one the library uses) so that its inline bodies (a thread,
 * a queue of std::function) are compiled only by the programs that run threads.
 */
template <class Task = std::function<void()>>
class BasicProgressThread {
 public:
  BasicProgressThread() = default;
  BasicProgressThread(const BasicProgressThread&) = delete;
  BasicProgressThread& operator=(const BasicProgressThread&) = delete;
  ~BasicProgressThread() {
    {
      std::lock_guard l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void submit(Task task) {
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
  std::deque<Task> queue_;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

using ProgressThread = BasicProgressThread<>;

}  // namespace mpar::detail
