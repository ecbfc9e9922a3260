#pragma once
/**
 * @file Host reference of the online-softmax steps of blockwise attention (`online_softmax_backend`,
 * backend/online_softmax_backend.hpp): the loops ring attention used to run on the host between its GEMMs,
 * now operations of the rank's stream.
 *
 * Arithmetic in fp32 in index order, as the loops were, so the host results are unchanged by the move.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "mpar/backend/detail/online_softmax_backend.hpp"

namespace mpar::host {

/** One key block's update of the running statistics and output rows (see `online_softmax_backend`). */
inline void online_softmax_update(const SoftmaxBlock& b, float* scores, float* row_max, float* row_sum, float* out) {
  for (std::size_t h = 0; h < b.heads; ++h)
    for (std::size_t i = 0; i < b.rows; ++i) {
      float* s = scores + (h * b.rows + i) * b.cols;
      const std::size_t n = b.visible(i), st = h * b.stat_stride + i;
      if (n == 0) {  // no key of this block is visible to the row: nothing changes, its probabilities are 0
        std::fill_n(s, b.cols, 0.0f);
        continue;
      }
      float mx = row_max[st];
      for (std::size_t k = 0; k < n; ++k) mx = std::max(mx, s[k]);
      const float alpha = std::exp(row_max[st] - mx);  // 0 for the first block of the row (max = -inf)
      float sum = 0;
      for (std::size_t k = 0; k < n; ++k) sum += (s[k] = std::exp(s[k] - mx));
      for (std::size_t k = n; k < b.cols; ++k) s[k] = 0.0f;
      row_max[st] = mx, row_sum[st] = alpha * row_sum[st] + sum;
      float* o = out + i * b.out_ld + h * b.head_dim;
      for (std::size_t x = 0; x < b.head_dim; ++x) o[x] *= alpha;
    }
}

/** `out /= row_sum`; `row_max` becomes the log-sum-exp `max + log sum` (-inf for a row that saw no key). */
inline void online_softmax_finish(std::size_t heads, std::size_t rows, std::size_t head_dim, std::size_t stat_stride,
                                  std::size_t out_ld, float* row_max, const float* row_sum, float* out) {
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t st = h * stat_stride + i;
      if (row_sum[st] == 0.0f) {  // no visible key: no distribution; the output keeps its (zero) accumulator
        row_max[st] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float* o = out + i * out_ld + h * head_dim;
      for (std::size_t x = 0; x < head_dim; ++x) o[x] /= row_sum[st];
      row_max[st] += std::log(row_sum[st]);
    }
}

/** `delta = rowsum(dout * out)` per row and head: the softmax backward's correction term. */
inline void online_softmax_delta(std::size_t heads, std::size_t rows, std::size_t head_dim, std::size_t stat_stride,
                                 std::size_t out_ld, const float* dout, const float* out, float* delta) {
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t row = i * out_ld + h * head_dim;
      float acc = 0;
      for (std::size_t x = 0; x < head_dim; ++x) acc += dout[row + x] * out[row + x];
      delta[h * stat_stride + i] = acc;
    }
}

/** One block's backward: `p` (scores) becomes `P = exp(s - lse)`, `dp` (`dout V^T`) becomes `dS = P (dp - delta)`. */
inline void online_softmax_backward(const SoftmaxBlock& b, const float* lse, const float* delta, float* p, float* dp) {
  for (std::size_t h = 0; h < b.heads; ++h)
    for (std::size_t i = 0; i < b.rows; ++i) {
      const std::size_t n = b.visible(i), st = h * b.stat_stride + i;
      float *prow = p + (h * b.rows + i) * b.cols, *dprow = dp + (h * b.rows + i) * b.cols;
      for (std::size_t x = 0; x < b.cols; ++x) {
        prow[x] = x < n ? std::exp(prow[x] - lse[st]) : 0.0f;
        dprow[x] = prow[x] * (dprow[x] - delta[st]);
      }
    }
}

}  // namespace mpar::host
