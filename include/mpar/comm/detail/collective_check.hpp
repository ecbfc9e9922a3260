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
#include "mpar/core/error.hpp"

namespace mpar::detail {

/** The collective operations, as named in error messages. */
enum class CollKind : std::uint8_t {
  all_reduce, broadcast, reduce, all_gather, reduce_scatter, gather, scatter, all_to_all, all_to_all_v, barrier, split
};

inline constexpr std::string_view coll_name(CollKind k) {
  switch (k) {
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::broadcast: return "broadcast";
    case CollKind::reduce: return "reduce";
    case CollKind::all_gather: return "all_gather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::gather: return "gather";
    case CollKind::scatter: return "scatter";
    case CollKind::all_to_all: return "all_to_all";
    case CollKind::all_to_all_v: return "all_to_all_v";
    case CollKind::barrier: return "barrier";
    case CollKind::split: return "split";
  }
  return "?";
}

/** The part of a collective call that must be identical on every rank of the group. */
struct Fingerprint {
  CollKind kind = CollKind::barrier;
  std::uint8_t dtype = 0;        ///< index into dtype_names (0: none)
  std::int8_t op = -1;           ///< ReduceOp, or -1 when the collective does not reduce
  std::int32_t root = -1;        ///< root rank, or -1
  std::uint64_t count = 0;       ///< the global element count (see each collective)
  std::uint64_t seq = 0;         ///< this group's collective sequence number, from 1
  friend constexpr bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

inline constexpr std::string_view dtype_names[] = {"-", "f32", "f64", "bf16", "f16"};

template <class T>
inline constexpr std::uint8_t dtype_code_v = std::is_same_v<T, float> ? 1 : std::is_same_v<T, double> ? 2
                                             : std::is_same_v<T, bf16>  ? 3
                                             : std::is_same_v<T, f16>   ? 4
                                                                        : 0;

/** "all_reduce(f32, count=16, op=sum)" */
inline std::string describe(const Fingerprint& f) {
  std::string s = cat(coll_name(f.kind), "(", dtype_names[f.dtype < 5 ? f.dtype : 0]);
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

/** The collective timeout: MPAR_COMM_TIMEOUT_S seconds if set, else 300 s. */
inline std::chrono::duration<double> default_comm_timeout() {
  if (const char* v = std::getenv("MPAR_COMM_TIMEOUT_S"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    require(end && *end == '\0' && s > 0, "MPAR_COMM_TIMEOUT_S='", v, "' is not a positive number of seconds");
    return std::chrono::duration<double>(s);
  }
  return std::chrono::duration<double>(300.0);
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
