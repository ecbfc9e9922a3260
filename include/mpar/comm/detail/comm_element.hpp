#pragma once
/**
 * @file The element types every communicator moves and reduces: mpar's element types (float, double, bf16, f16)
 * and the integers std::int32_t, std::int64_t, std::uint32_t, std::uint64_t (counts, hashes, identity keys,
 * flags), with the codes and names collective checks compare them by.
 *
 * Integers reduce exactly in their own type (sums wrap modulo 2^bits, as MPI's and NCCL's do); they have no
 * `avg`, because an integer average must round and no rounding suits every caller: a communicator refuses it
 * with a comm_error on every rank that asks (sum, then divide as the caller needs).
 */
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>

#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::detail {

template <class T>
inline constexpr bool is_comm_integer_v = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                                          std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::uint64_t>;

/** The integer element types of communicators: reduced exactly, never through a floating-point type. */
template <class T>
concept comm_integer = is_comm_integer_v<std::remove_cv_t<T>>;

/** What a communicator's buffers may hold (docs/communicators.md, "Element types"). */
template <class T>
concept comm_element = detail::element_type<T> || comm_integer<T>;

/** The type a reduction of `T` accumulates in: float for 16-bit types, `T` itself otherwise (integers too). */
template <class T>
struct comm_compute {
  using type = std::remove_cv_t<T>;
};
template <detail::half_precision T>
struct comm_compute<T> {
  using type = float;
};
template <comm_element T>
using comm_compute_t = typename comm_compute<T>::type;

/** The names of the codes below, as collective errors print them. */
inline constexpr std::string_view dtype_names[] = {"-", "f32", "f64", "bf16", "f16", "i32", "i64", "u32", "u64"};

/** The code a collective's fingerprint carries for `T`, so that ranks passing different types disagree. */
template <comm_element T>
inline constexpr std::uint8_t dtype_code_v = std::is_same_v<std::remove_cv_t<T>, float>           ? 1
                                             : std::is_same_v<std::remove_cv_t<T>, double>        ? 2
                                             : std::is_same_v<std::remove_cv_t<T>, bf16>          ? 3
                                             : std::is_same_v<std::remove_cv_t<T>, f16>           ? 4
                                             : std::is_same_v<std::remove_cv_t<T>, std::int32_t>  ? 5
                                             : std::is_same_v<std::remove_cv_t<T>, std::int64_t>  ? 6
                                             : std::is_same_v<std::remove_cv_t<T>, std::uint32_t> ? 7
                                                                                                  : 8;

/** The name of a dtype code; "-" for none or an unknown code (a corrupted fingerprint still prints). */
inline constexpr std::string_view dtype_name_of(std::uint8_t code) {
  return code < std::size(dtype_names) ? dtype_names[code] : dtype_names[0];
}

/** "f32", "i64", ...: the short name of a communicator element type. */
template <comm_element T>
inline constexpr std::string_view comm_dtype_name_v = dtype_names[dtype_code_v<T>];

/** `a + b`; integers wrap modulo 2^bits (through the unsigned type: signed overflow would be undefined). */
template <class A>
constexpr A comm_add(A a, A b) {
  if constexpr (std::is_integral_v<A>)
    return A(std::make_unsigned_t<A>(a) + std::make_unsigned_t<A>(b));
  else
    return a + b;
}

/**
 * Why `op` cannot reduce `T`, or "" when it can: integers have no `avg` (see the file comment). Communicators
 * prefix it with the operation and rank and throw it as comm_error before moving any data.
 */
template <comm_element T>
std::string reduce_op_error(ReduceOp op) {
  if constexpr (comm_integer<T>)
    if (op == ReduceOp::avg)
      return cat("op=avg over ", comm_dtype_name_v<T>,
                 " elements; integers reduce by sum, max or min only (an integer average would have to round: "
                 "reduce by sum and divide as the caller needs)");
  return {};
}

}  // namespace mpar::detail
