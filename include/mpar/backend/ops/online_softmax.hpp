#pragma once
/**
 * @file The online-softmax steps of blockwise (flash-style) attention (`ops::online_softmax_update`, `_finish`,
 * `_delta`, `_backward`), which ring attention (nn/ring_attention.hpp) issues between its GEMMs with no host wait,
 * with their host reference. See backend/ops/operation.hpp.
 *
 * Every pointer is rank memory, fp32. The host reference computes in fp32 in index order.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "mpar/backend/softmax_block.hpp"

namespace mpar::ops {

/**
 * One key block's update of the running statistics: per row, the new running maximum over the visible scores,
 * `scores` replaced by `exp(s - max)` (0 where masked), `row_sum = alpha row_sum + sum` and the output row scaled by
 * `alpha = exp(max_old - max_new)`; the caller then adds `P V` into `out`. A row that sees no key of the block is
 * unchanged and gets zero probabilities.
 */
struct online_softmax_update {
  static constexpr const char* name = "online_softmax_update";
  SoftmaxBlock block;
  float* scores = nullptr;  ///< `[heads, rows, cols]`, the probabilities written over them
  float* row_max = nullptr;
  float* row_sum = nullptr;
  float* out = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(scores), f(row_max), f(row_sum), f(out);
  }
};

/**
 * The final normalisation `out /= row_sum`; `row_max` becomes the row log-sum-exp `max + log sum` (a row that saw
 * no key keeps `out` and gets `-inf`). Row `i` of head `h`: statistics at `h * stat_stride + i`, output values at
 * `i * out_ld + h * head_dim`.
 */
struct online_softmax_finish {
  static constexpr const char* name = "online_softmax_finish";
  std::size_t heads = 0, rows = 0, head_dim = 0, stat_stride = 0, out_ld = 0;
  float* row_max = nullptr;
  const float* row_sum = nullptr;
  float* out = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(row_max), f(row_sum), f(out);
  }
};

/** The backward's correction term `delta = rowsum(dout * out)` per row and head (layout as `online_softmax_finish`). */
struct online_softmax_delta {
  static constexpr const char* name = "online_softmax_delta";
  std::size_t heads = 0, rows = 0, head_dim = 0, stat_stride = 0, out_ld = 0;
  const float* dout = nullptr;
  const float* out = nullptr;
  float* delta = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(dout), f(out), f(delta);
  }
};

/**
 * The backward of one block: `p` (the scores in) becomes `P = exp(s - lse)` (0 where masked) and `dp` (`dout V^T`
 * in) becomes `dS = P (dp - delta)`.
 */
struct online_softmax_backward {
  static constexpr const char* name = "online_softmax_backward";
  SoftmaxBlock block;
  const float* lse = nullptr;
  const float* delta = nullptr;
  float* p = nullptr;
  float* dp = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(lse), f(delta), f(p), f(dp);
  }
};

inline void host_reference(const online_softmax_update& op) {
  const SoftmaxBlock& b = op.block;
  for (std::size_t h = 0; h < b.heads; ++h)
    for (std::size_t i = 0; i < b.rows; ++i) {
      float* s = op.scores + (h * b.rows + i) * b.cols;
      const std::size_t n = b.visible(i), st = h * b.stat_stride + i;
      if (n == 0) {  // no key of this block is visible to the row: nothing changes, its probabilities are 0
        std::fill_n(s, b.cols, 0.0f);
        continue;
      }
      float mx = op.row_max[st];
      for (std::size_t k = 0; k < n; ++k) mx = std::max(mx, s[k]);
      const float alpha = std::exp(op.row_max[st] - mx);  // 0 for the first block of the row (max = -inf)
      float sum = 0;
      for (std::size_t k = 0; k < n; ++k) sum += (s[k] = std::exp(s[k] - mx));
      for (std::size_t k = n; k < b.cols; ++k) s[k] = 0.0f;
      op.row_max[st] = mx, op.row_sum[st] = alpha * op.row_sum[st] + sum;
      float* o = op.out + i * b.out_ld + h * b.head_dim;
      for (std::size_t x = 0; x < b.head_dim; ++x) o[x] *= alpha;
    }
}

inline void host_reference(const online_softmax_finish& op) {
  for (std::size_t h = 0; h < op.heads; ++h)
    for (std::size_t i = 0; i < op.rows; ++i) {
      const std::size_t st = h * op.stat_stride + i;
      if (op.row_sum[st] == 0.0f) {  // no visible key: no distribution; the output keeps its (zero) accumulator
        op.row_max[st] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float* o = op.out + i * op.out_ld + h * op.head_dim;
      for (std::size_t x = 0; x < op.head_dim; ++x) o[x] /= op.row_sum[st];
      op.row_max[st] += std::log(op.row_sum[st]);
    }
}

inline void host_reference(const online_softmax_delta& op) {
  for (std::size_t h = 0; h < op.heads; ++h)
    for (std::size_t i = 0; i < op.rows; ++i) {
      const std::size_t row = i * op.out_ld + h * op.head_dim;
      float acc = 0;
      for (std::size_t x = 0; x < op.head_dim; ++x) acc += op.dout[row + x] * op.out[row + x];
      op.delta[h * op.stat_stride + i] = acc;
    }
}

inline void host_reference(const online_softmax_backward& op) {
  const SoftmaxBlock& b = op.block;
  for (std::size_t h = 0; h < b.heads; ++h)
    for (std::size_t i = 0; i < b.rows; ++i) {
      const std::size_t n = b.visible(i), st = h * b.stat_stride + i;
      float *prow = op.p + (h * b.rows + i) * b.cols, *dprow = op.dp + (h * b.rows + i) * b.cols;
      for (std::size_t x = 0; x < b.cols; ++x) {
        prow[x] = x < n ? std::exp(prow[x] - op.lse[st]) : 0.0f;
        dprow[x] = prow[x] * (dprow[x] - op.delta[st]);
      }
    }
}

}  // namespace mpar::ops
