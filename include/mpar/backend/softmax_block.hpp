#pragma once
/**
 * @file `SoftmaxBlock`: where one block of attention scores and the rows it updates lie in rank memory, the
 * argument of the online-softmax operations (backend/ops/online_softmax.hpp).
 */
#include <cstddef>

namespace mpar {

/**
 * @brief Where one score block and the rows it updates lie in rank memory, for every head at once.
 *
 * - scores (and the probabilities written over them): `[heads, rows, cols]` contiguous;
 * - per-row statistics (running maximum, running sum, log-sum-exp, delta): row `i` of head `h` at
 *   `h * stat_stride + i`;
 * - output rows (`out`, `dout`): row `i` of head `h` is `head_dim` values at `i * out_ld + h * head_dim`.
 *
 * The causal mask is given by position: key `k` is visible to row `i` iff `k <= i + causal_offset`
 * (the query block's first position minus the key block's). A block wholly before the queries has
 * `causal_offset >= cols - 1` and masks nothing; a diagonal block has 0; a row that sees no key of the block
 * (`i + causal_offset < 0`) is left unchanged by the forward and gets zero probabilities.
 */
struct SoftmaxBlock {
  std::size_t heads = 0, rows = 0, cols = 0, head_dim = 0, stat_stride = 0, out_ld = 0;
  std::ptrdiff_t causal_offset = 0;
  /** How many leading keys row `i` sees (0 .. cols). */
  [[nodiscard]] constexpr std::size_t visible(std::size_t i) const {
    const std::ptrdiff_t n = std::ptrdiff_t(i) + causal_offset + 1;
    return n <= 0 ? 0 : (std::size_t(n) < cols ? std::size_t(n) : cols);
  }
};

}  // namespace mpar
