#pragma once
/**
 * @file run_threads: runs a function on N rank threads, joins them, and reports a failed run.
 */
#include <algorithm>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/threads/group.hpp"
#include "mpar/comm/threads/run_failure.hpp"
#include "mpar/comm/threads/threads_communicator.hpp"
#include "mpar/comm/threads/threads_options.hpp"
#include "mpar/comm/threads/world.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

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
      std::fprintf(
          stderr,
          "mpar: run_threads: rank%s %s of group '%s' did not return within %g s after the run failed: %s "
          "stuck outside the communicator, and a thread cannot be interrupted; exiting the process (status 3)\n",
          stuck.size() > 1 ? "s" : "", detail::join_ranks(stuck).c_str(), opts.name.c_str(), opts.timeout.count(),
          stuck.size() > 1 ? "they are" : "it is");
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
void run_threads(int n, F&& f) { run_threads(n, ThreadsOptions{}, std::forward<F>(f)); }

}  // namespace mpar
