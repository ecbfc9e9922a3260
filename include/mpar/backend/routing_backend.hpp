#pragma once
/**
 * @file The `routing_backend` concept: a backend's row kernels that route tokens (MoE dispatch and combine).
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace mpar {

/**
 * @brief The routing family of `backend`: the row kernels that route tokens (MoE dispatch and combine),
 * with the semantics of their `mpar::host` reference (backend/host/row_kernels.hpp); `index` is
 * `std::int32_t` in rank memory: `gather_rows(rows, d, index, src, dst)`, `scatter_rows(rows, d, index, src,
 * dst)`, `scatter_add_rows(rows, d, index, weight, src, dst)` (accumulates; `weight` may be null) and its
 * backward `scatter_add_rows_backward(rows, d, index, weight, dy, src, dsrc, dot)`.
 */
template <class B>
concept routing_backend = requires(const float* a, float* c, const std::int32_t* ids, std::size_t n) {
  B::gather_rows(n, n, ids, a, c);
  B::scatter_rows(n, n, ids, a, c);
  B::scatter_add_rows(n, n, ids, a, a, c);
  B::scatter_add_rows_backward(n, n, ids, a, a, a, c, c);
};

}  // namespace mpar
