#pragma once
/**
 * @file The `online_softmax_backend` concept: the per-block steps of an attention computed one key block at a
 * time (flash-style online softmax), as backend operations, so ring attention (nn/ring_attention.hpp) runs on
 * any backend that has them with no host step between its GEMMs.
 */
#include <cstddef>

#include "mpar/backend/softmax_block.hpp"

namespace mpar::detail {

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

}  // namespace mpar::detail
