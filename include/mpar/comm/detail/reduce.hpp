#pragma once
/** @file The element-wise reduction kernel shared by the shared-memory collectives and adaptors. */
#include <algorithm>
#include <cstddef>

#include "mpar/core/dtype.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::detail {

/**
 * `dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[k-1][i])`, folded left to right in
 * `compute_type_t<T>` (float for 16-bit types) and rounded once; `avg` divides the sum by
 * `divisor`. `dst` may alias any source: each chunk is read completely before it is written.
 * The fixed left-to-right order makes the result independent of which rank computes it.
 */
template <element_type T>
void reduce_into(T* dst, const T* const* srcs, std::size_t k, std::size_t n, ReduceOp op, std::size_t divisor) {
  using A = compute_type_t<T>;
  constexpr std::size_t chunk = 1024;  // 4-8 KiB of accumulators: stays in L1 while sources stream
  A acc[chunk];
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::size_t m = std::min(chunk, n - base);
    const T* s0 = srcs[0] + base;
    for (std::size_t j = 0; j < m; ++j) acc[j] = A(s0[j]);
    for (std::size_t q = 1; q < k; ++q) {
      const T* s = srcs[q] + base;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (std::size_t j = 0; j < m; ++j) acc[j] += A(s[j]);
          break;
        case ReduceOp::max:
          for (std::size_t j = 0; j < m; ++j) acc[j] = std::max(acc[j], A(s[j]));
          break;
        case ReduceOp::min:
          for (std::size_t j = 0; j < m; ++j) acc[j] = std::min(acc[j], A(s[j]));
          break;
      }
    }
    if (op == ReduceOp::avg) {
      const A d = A(divisor);
      for (std::size_t j = 0; j < m; ++j) acc[j] /= d;
    }
    T* out = dst + base;
    for (std::size_t j = 0; j < m; ++j) out[j] = T(acc[j]);
  }
}

}  // namespace mpar::detail
