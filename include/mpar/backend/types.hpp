#pragma once
/**
 * @file The value types the `backend` concept's operations take, the same on every backend: whether a
 * GEMM operand is transposed (`Trans`) and the counter-based dropout mask (`host::DropoutMask`). The
 * concept includes this instead of the host implementation, which includes the concept.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/core/error.hpp"
#include "mpar/core/init.hpp"  // CounterRng

namespace mpar {

/** @brief Whether a GEMM operand is used as stored or transposed. */
enum class Trans { no, yes };

/**
 * @brief Where the entries of a two-level GEMM batch start in one operand: entry (i, j) at
 * `i * outer + j * inner` elements. Attention's products batch over sequences (outer) and heads (inner),
 * whose blocks sit in one matrix at two unrelated strides, so one stride cannot cover both.
 */
struct BatchStrides {
  std::size_t outer = 0, inner = 0;
  bool operator==(const BatchStrides&) const = default;
};
/** @brief The extents of a two-level GEMM batch: `outer x inner` products. */
struct BatchExtents {
  std::size_t outer = 1, inner = 1;
  bool operator==(const BatchExtents&) const = default;
};

}  // namespace mpar

namespace mpar::host {

/**
 * @brief Dropout whose keep/drop decision for an element depends only on (seed, stream, global index),
 * so a sharded activation drops exactly the elements the unsharded one would.
 *
 * The local block is `[rows, cols]` at `(row_offset, col_offset)` of a global `[*, global_cols]` matrix.
 * Kept elements are scaled by 1 / (1 - p). Backward applies the same mask to the gradient.
 */
struct DropoutMask {
  std::uint64_t seed = 0, stream = 0;
  double p = 0.0;
  std::size_t global_cols = 0, row_offset = 0, col_offset = 0;

  [[nodiscard]] bool keep(std::size_t r, std::size_t c) const {
    const std::uint64_t g = std::uint64_t(row_offset + r) * global_cols + col_offset + c;
    return CounterRng{seed, stream}.uniform(g) >= p;
  }
  template <class T>
  void apply(std::size_t rows, std::size_t cols, const T* x, T* y) const {
    require(p >= 0.0 && p < 1.0, "dropout: probability ", p, " must be in [0, 1)");
    const T s = T(1.0 / (1.0 - p));
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = keep(r, c) ? x[r * cols + c] * s : T(0);
  }
};

}  // namespace mpar::host
