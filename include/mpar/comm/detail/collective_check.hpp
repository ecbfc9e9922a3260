#pragma once
/**
 * @file Collective fingerprints and the settings every communicator reads from the environment.
 *
 * A fingerprint is what every rank of a group must agree on before a collective runs: the
 * operation, the element type, the global count, the reduction, the root and the sequence number.
 * Communicators compare them across ranks (always for threads; behind MPAR_CHECK_COLLECTIVES=1 for
 * MPI) so a mismatch becomes a comm_error on every rank instead of a hang or silent corruption.
 */
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/error.hpp"

namespace mpar::detail {

/** The collective operations, as named in error messages. */
enum class CollKind : std::uint8_t {
  all_reduce,
  broadcast,
  reduce,
  all_gather,
  reduce_scatter,
  gather,
  scatter,
  all_to_all,
  all_to_all_v,
  barrier,
  split
};

inline constexpr std::string_view coll_name(CollKind k) {
  switch (k) {
    case CollKind::all_reduce:
      return "all_reduce";
    case CollKind::broadcast:
      return "broadcast";
    case CollKind::reduce:
      return "reduce";
    case CollKind::all_gather:
      return "all_gather";
    case CollKind::reduce_scatter:
      return "reduce_scatter";
    case CollKind::gather:
      return "gather";
    case CollKind::scatter:
      return "scatter";
    case CollKind::all_to_all:
      return "all_to_all";
    case CollKind::all_to_all_v:
      return "all_to_all_v";
    case CollKind::barrier:
      return "barrier";
    case CollKind::split:
      return "split";
  }
  return "?";
}

/** The part of a collective call that must be identical on every rank of the group. */
struct Fingerprint {
  CollKind kind = CollKind::barrier;
  std::uint8_t dtype = 0;   ///< dtype_code_v of the element type (0: none)
  std::int8_t op = -1;      ///< ReduceOp, or -1 when the collective does not reduce
  std::int32_t root = -1;   ///< root rank, or -1
  std::uint64_t count = 0;  ///< the global element count (see each collective)
  std::uint64_t seq = 0;    ///< this group's collective sequence number, from 1
  friend constexpr bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

/** "all_reduce(f32, count=16, op=sum)" */
inline std::string describe(const Fingerprint& f) {
  std::string s = cat(coll_name(f.kind), "(", dtype_name_of(f.dtype));
  if (f.kind != CollKind::barrier && f.kind != CollKind::split && f.kind != CollKind::all_to_all_v)
    s += cat(", count=", f.count);
  if (f.op >= 0) s += cat(", op=", reduce_op_name(static_cast<ReduceOp>(f.op)));
  if (f.root >= 0) s += cat(", root=", f.root);
  return s + cat(") #", f.seq);
}

/** "all_reduce #42 on group tensor" — the prefix of every collective error message. */
inline std::string op_prefix(std::string_view op, std::uint64_t seq, std::string_view group) {
  return cat(op, " #", seq, " on group ", group);
}

/** "1, 3" */
template <class Range>
std::string join_ranks(const Range& ranks) {
  std::string s;
  for (auto r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

/**
 * Timeouts at or above this many seconds (`inf` included) mean "no timeout": a deadline is a
 * steady_clock time point in nanoseconds, and now + 1e9 s (about 31 years) still fits in it, while
 * 1e10 s would overflow into the past and time out at once.
 */
inline constexpr double no_timeout_seconds = 1e9;

/** Whether a timeout means "wait forever" (see no_timeout_seconds). */
inline bool is_no_timeout(std::chrono::duration<double> t) { return !(t.count() < no_timeout_seconds); }

/** now + t on the steady clock, saturated at now + no_timeout_seconds instead of overflowing. */
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::duration<double> t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = is_no_timeout(t) ? no_timeout_seconds : t.count();
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

/**
 * The collective timeout: MPAR_COMM_TIMEOUT_S seconds if set, else 300 s. `inf` (or any value of at
 * least 1e9 s) means no timeout; anything but a positive number is refused here, before any rank starts.
 */
inline std::chrono::duration<double> default_comm_timeout() {
  if (const char* v = std::getenv("MPAR_COMM_TIMEOUT_S"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    require(end && *end == '\0' && s > 0, "MPAR_COMM_TIMEOUT_S='", v,
            "' is not a positive number of seconds (use e.g. 60, or inf for no timeout)");
    return std::chrono::duration<double>(s);
  }
  return std::chrono::duration<double>(300.0);
}

/**
 * How long a rank waiting at a threads barrier spins before it sleeps: MPAR_THREADS_SPIN_US
 * microseconds (a whole number, 0 = never spin, at most 10 s) if set, else 1000.
 */
inline std::chrono::microseconds default_spin_time() {
  if (const char* v = std::getenv("MPAR_THREADS_SPIN_US"); v && *v) {
    const std::string_view s(v);
    const bool digits = s.size() <= 8 && s.find_first_not_of("0123456789") == std::string_view::npos;
    const long long us = digits ? std::atoll(v) : -1;
    require(digits && us <= 10'000'000, "MPAR_THREADS_SPIN_US='", v,
            "' is not a whole number of microseconds from 0 to 10000000 (0: never spin; default 1000)");
    return std::chrono::microseconds(us);
  }
  return std::chrono::microseconds(1000);
}

/** Whether MPAR_CHECK_COLLECTIVES=1 (or MPAR_EXTRA_CHECKS at compile time) asks for fingerprint checks. */
inline bool check_collectives_enabled() {
#ifdef MPAR_EXTRA_CHECKS
  return true;
#else
  const char* v = std::getenv("MPAR_CHECK_COLLECTIVES");
  return v && *v && std::string_view(v) != "0";
#endif
}

}  // namespace mpar::detail
