#pragma once
/**
 * @file The element-wise reduction kernel shared by the shared-memory collectives and adaptors: floating-point
 * types accumulate in `comm_compute_t` (float for 16-bit types); integers in their own type, exactly.
 */
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::detail {

/**
 * `dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[k-1][i])`, folded left to right in
 * `comm_compute_t<T>` (float for 16-bit types, integers exactly) and rounded once; `avg` (never of integers:
 * communicators refuse it) divides the sum by
 * `divisor`. `dst` may alias any source: each chunk is read completely before it is written.
 * The fixed left-to-right order makes the result independent of which rank computes it.
 */
/** One chunk of `m` elements; a compile-time `m` lets -O2 vectorise without an epilogue. */
template <comm_element T, class M>
inline void reduce_chunk(T* out, const T* const* srcs, std::size_t base, std::size_t k, M m, ReduceOp op,
                         comm_compute_t<T> divisor, comm_compute_t<T>* acc) {
  using A = comm_compute_t<T>;
  const T* s0 = srcs[0] + base;
  for (std::size_t j = 0; j < std::size_t(m); ++j) acc[j] = A(s0[j]);
  for (std::size_t q = 1; q < k; ++q) {
    const T* s = srcs[q] + base;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        for (std::size_t j = 0; j < std::size_t(m); ++j) acc[j] = comm_add(acc[j], A(s[j]));
        break;
      case ReduceOp::max:
        for (std::size_t j = 0; j < std::size_t(m); ++j) acc[j] = acc[j] < A(s[j]) ? A(s[j]) : acc[j];
        break;
      case ReduceOp::min:
        for (std::size_t j = 0; j < std::size_t(m); ++j) acc[j] = A(s[j]) < acc[j] ? A(s[j]) : acc[j];
        break;
    }
  }
  if (op == ReduceOp::avg)
    for (std::size_t j = 0; j < std::size_t(m); ++j) acc[j] /= divisor;
  T* o = out + base;
  for (std::size_t j = 0; j < std::size_t(m); ++j) o[j] = T(acc[j]);
}

/**
 * `dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[k-1][i])`, folded left to right in
 * `comm_compute_t<T>` (float for 16-bit types, integers exactly) and rounded once; `avg` (never of integers:
 * communicators refuse it) divides the sum by
 * `divisor`. `dst` may alias any source: each chunk is read completely before it is written.
 * The fixed left-to-right order makes the result independent of which rank computes it.
 */
template <comm_element T>
void reduce_into(T* dst, const T* const* srcs, std::size_t k, std::size_t n, ReduceOp op, std::size_t divisor) {
  using A = comm_compute_t<T>;
  constexpr std::size_t chunk = 1024;  // 4-8 KiB of accumulators: stays in L1 while sources stream
  if constexpr (!detail::half_precision<T>) {
    if (k == 2 && op == ReduceOp::sum) {
      // The common case (two ranks, sum) without the accumulator round trip. Element-wise, so an
      // output equal to either source is fine (ivdep); a + b == b + a exactly in IEEE arithmetic.
      const T* a = srcs[0];
      const T* b = srcs[1];
      std::size_t base = 0;
      for (; base + chunk <= n; base += chunk) {
#pragma GCC ivdep
        for (std::size_t j = 0; j < chunk; ++j) dst[base + j] = comm_add(a[base + j], b[base + j]);
      }
      for (; base < n; ++base) dst[base] = comm_add(a[base], b[base]);
      return;
    }
  }
  alignas(64) A acc[chunk];
  const A d = A(divisor);
  std::size_t base = 0;
  for (; base + chunk <= n; base += chunk)
    reduce_chunk(dst, srcs, base, k, std::integral_constant<std::size_t, chunk>{}, op, d, acc);
  if (base < n) reduce_chunk(dst, srcs, base, k, n - base, op, d, acc);
}

}  // namespace mpar::detail
