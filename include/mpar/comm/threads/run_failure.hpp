#pragma once
/**
 * @file rank_failure and the report of a failed threads run: every failing rank's own error, in a fixed order.
 */
#include <algorithm>
#include <exception>
#include <iterator>
#include <string>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

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
 * reports of peers' failures last; otherwise in the order the ranks failed. `RankErrors` is a sequence of
 * RankError: a template only so that its body is compiled by the programs that call run_threads, not by every
 * includer of `mpar/mpar.hpp`.
 */
template <class RankErrors = std::vector<RankError>>
[[nodiscard]] RankErrors order_failures(RankErrors errors, int root_rank, const std::string& abort_message) {
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
template <class RankErrors = std::vector<RankError>>
std::string run_failure_message(const RankErrors& ordered, const std::string& abort_message) {
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

}  // namespace mpar
