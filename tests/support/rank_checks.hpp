#pragma once
// Checks made on rank threads. Catch2 2.x assertions are not thread-safe, so a rank records each
// check's outcome here (under a lock) and the main thread asserts on the record after the ranks joined.
#include <catch2/catch.hpp>

#include <cstddef>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mpar::testing {

class RankChecks {
 public:
  /** Records one check: `ok`, or a failure described by `what` (built only when it failed). */
  template <class What>
  bool expect(bool ok, What&& what) {
    std::lock_guard lock(m_);
    ++count_;
    if (!ok) {
      std::ostringstream s;
      s << std::forward<What>(what);
      failures_.push_back(s.str());
    }
    return ok;
  }
  /** `got` within `tol` of `want` (relative and absolute, as Approx(want).margin(tol).epsilon(tol)). */
  bool close(double got, double want, double tol, const std::string& what) {
    const bool ok = got == Approx(want).margin(tol).epsilon(tol);
    return expect(ok, [&] {
      std::ostringstream s;
      s << what << ": " << got << " vs " << want << " (tolerance " << tol << ")";
      return s.str();
    }());
  }
  /** On the main thread: at least `min_checks` checks ran, and none failed (each failure is reported). */
  void assert_all(std::size_t min_checks) {
    std::lock_guard lock(m_);
    CHECK(count_ >= min_checks);
    for (const std::string& f : failures_) FAIL_CHECK(f);
    CHECK(failures_.empty());
  }

 private:
  std::mutex m_;
  std::size_t count_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace mpar::testing
