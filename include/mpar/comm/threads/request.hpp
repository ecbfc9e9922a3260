#pragma once
/**
 * @file ThreadsRequest: the request of an asynchronous ThreadsCommunicator operation.
 */
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/threads/group.hpp"
#include "mpar/comm/threads/mailbox.hpp"
#include "mpar/comm/threads/progress_thread.hpp"

namespace mpar {

template <class Derived, class Group>
class BasicThreadsCommunicator;

/**
 * @brief The request of an asynchronous ThreadsCommunicator operation.
 *
 * Collectives run on the rank's progress thread and overlap with the caller; `isend` completes
 * on issue (eager copy); `irecv` completes when the matching send arrives. Destroying an
 * unfinished collective request waits for it (the progress thread still writes the buffer);
 * destroying an unfinished receive cancels it. A class template over the communicator's `Group` (`ThreadsRequest`
 * is the one the library uses) so that its inline bodies are compiled only by the programs that run threads.
 */
template <class Group>
class BasicThreadsRequest {
 public:
  BasicThreadsRequest() = default;
  BasicThreadsRequest(BasicThreadsRequest&& o) noexcept { swap(o); }
  BasicThreadsRequest& operator=(BasicThreadsRequest&& o) noexcept {
    BasicThreadsRequest tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  BasicThreadsRequest(const BasicThreadsRequest&) = delete;
  BasicThreadsRequest& operator=(const BasicThreadsRequest&) = delete;
  ~BasicThreadsRequest() {
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
  template <class, class>
  friend class BasicThreadsCommunicator;
  void swap(BasicThreadsRequest& o) noexcept {
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
  std::shared_ptr<Group> group_;
  int rank_ = 0;
  std::string error_;  // an error found at issue time, reported by wait()
};

using ThreadsRequest = BasicThreadsRequest<detail::ThreadsGroup>;

}  // namespace mpar
