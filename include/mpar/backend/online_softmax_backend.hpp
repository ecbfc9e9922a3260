#pragma once
/**
 * @file The `online_softmax_backend` concept: the per-block steps of an attention computed one key block at a
 * time (flash-style online softmax), as backend operations, so ring attention (nn/ring_attention.hpp) runs on
 * any backend that has them with no host step between its GEMMs.
 */
#include <concepts>
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

/**
 * @brief A backend with the online-softmax steps of blockwise attention, with the semantics of their
 * `mpar::host` reference (backend/host/online_softmax.hpp); every pointer is rank memory, fp32:
 * - `online_softmax_update(block, scores, row_max, row_sum, out)`: for each row, the new running maximum over
 *   the visible scores, `scores` replaced by `exp(s - max)` (0 where masked), `row_sum = alpha row_sum + sum`
 *   and the output row scaled by `alpha = exp(max_old - max_new)`; the caller then adds `P V` into `out`;
 * - `online_softmax_finish(heads, rows, head_dim, stat_stride, out_ld, row_max, row_sum, out)`: the final
 *   normalisation `out /= row_sum`, and `row_max` becomes the row log-sum-exp `max + log sum` (a row that saw
 *   no key keeps `out` and gets `-inf`);
 * - `online_softmax_delta(heads, rows, head_dim, stat_stride, out_ld, dout, out, delta)`: the backward's
 *   correction term `delta = rowsum(dout * out)` per row and head;
 * - `online_softmax_backward(block, lse, delta, p, dp)`: the backward of one block, `p` (scores in) becomes
 *   `P = exp(s - lse)` (0 where masked) and `dp` (`dout V^T` in) becomes `dS = P (dp - delta)`.
 * One operation per block step, so a ring step issues its GEMMs and these with no host wait between them.
 */
template <class B>
concept online_softmax_backend = requires(const SoftmaxBlock& block, const float* a, float* c, std::size_t n) {
  B::online_softmax_update(block, c, c, c, c);
  B::online_softmax_finish(n, n, n, n, n, c, a, c);
  B::online_softmax_delta(n, n, n, n, n, a, a, c);
  B::online_softmax_backward(block, a, a, c, c);
};

}  // namespace mpar
