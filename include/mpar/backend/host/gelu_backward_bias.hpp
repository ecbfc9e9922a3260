#pragma once
/**
 * @file GeLU's backward fused with the two things that follow it in the MLP's first projection under `Autocast`:
 * the projection's bias gradient and the conversion of the gradient to its 16-bit GEMM operand.
 *
 * Why: unfused, the `[rows, cols]` gradient of the pre-activation is written in fp32 by GeLU's backward, read
 * back by the bias gradient, read once more by the conversion, and the fp32 copy is then thrown away: five
 * passes over an activation that does not fit in L2 (the MLP's widest). Fused, one pass reads the
 * pre-activation and the output gradient and writes the 16-bit gradient; the fp32 gradient exists only in a
 * block small enough for L1.
 *
 * Numerics: bit for bit the unfused composition. Each block is `host::gelu_backward` on the same values, its
 * rows are added to the bias gradient in row order as `host::bias_add_backward` adds them (so every column's
 * float sum is formed in the same order), and the conversion is `host::convert` (nearest even).
 */
#include <algorithm>
#include <cstddef>
#include <vector>

#include "mpar/backend/host/buffer_ops.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/core/detail/half_precision.hpp"

namespace mpar::host {

/**
 * @brief `g = dy * gelu'(pre)` over row-major `[rows, cols]` arrays: `dbias[c] += sum over rows of g[r, c]`
 * (accumulates), `dpre = g` rounded to the 16-bit `T`.
 */
template <mpar::detail::half_precision T>
void gelu_backward_bias(std::size_t rows, std::size_t cols, const float* pre, const float* dy, float* dbias, T* dpre) {
  if (rows == 0 || cols == 0) return;
  constexpr std::size_t block_floats = 4096;  // 16 KiB of fp32 gradient per block: it stays in L1
  const std::size_t block_rows = std::max<std::size_t>(1, block_floats / cols);
  std::vector<float> g(std::min(rows, block_rows) * cols);
  for (std::size_t r = 0; r < rows; r += block_rows) {
    const std::size_t nr = std::min(block_rows, rows - r), offset = r * cols, n = nr * cols;
    gelu_backward<float>(n, pre + offset, dy + offset, g.data());
    bias_add_backward<float>(nr, cols, g.data(), dbias);
    convert(n, static_cast<const float*>(g.data()), dpre + offset);
  }
}

}  // namespace mpar::host
