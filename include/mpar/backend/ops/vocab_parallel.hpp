#pragma once
/**
 * @file The vocabulary-parallel operations: the embedding lookup over a block of the vocabulary
 * (`ops::embedding_forward`, `ops::embedding_backward`) and the cross-entropy over a block of the logit columns
 * (`ops::vocab_parallel_max`, `ops::vocab_parallel_sumexp`, `ops::vocab_parallel_loss`,
 * `ops::vocab_parallel_backward`). See backend/ops/operation.hpp for the pattern.
 *
 * Why these steps: a rank holds the columns `[col_offset, col_offset + cols)` of the logits, and only per-row
 * scalars cross ranks — max, all-reduce(max), sum of exponentials and the target's logit, all-reduce(sum), then the
 * loss and the gradient from those statistics — so the full `[tokens, vocab]` logits never meet on one rank.
 * Their host reference is the host kernels of backend/host/kernels.hpp and host/buffer_ops.hpp; all arrays fp32.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/buffer_ops.hpp"  // host::vocab_parallel_loss
#include "mpar/backend/host/kernels.hpp"

namespace mpar::ops {

/**
 * `out[t, :] = table[ids[t] - vocab_offset, :]` for the ids in `[vocab_offset, vocab_offset + vocab_local)`, zero
 * for the others, so the vocabulary blocks of a vocabulary-parallel embedding sum to the full lookup.
 */
struct embedding_forward {
  static constexpr const char* name = "embedding_forward";
  std::size_t tokens = 0, dim = 0;
  const std::int32_t* ids = nullptr;
  const float* table = nullptr;  ///< `[vocab_local, dim]`
  float* out = nullptr;          ///< `[tokens, dim]`, every row written
  std::size_t vocab_offset = 0, vocab_local = 0;
  template <class F>
  void each_operand(F&& f) {
    f(ids), f(table), f(out);
  }
};

/** `dtable[ids[t] - vocab_offset, :] += dout[t, :]` for the ids this block owns (repeated ids add up). */
struct embedding_backward {
  static constexpr const char* name = "embedding_backward";
  std::size_t tokens = 0, dim = 0;
  const std::int32_t* ids = nullptr;
  const float* dout = nullptr;
  float* dtable = nullptr;  ///< accumulates, as every parameter gradient does
  std::size_t vocab_offset = 0, vocab_local = 0;
  template <class F>
  void each_operand(F&& f) {
    f(ids), f(dout), f(dtable);
  }
};

/** `row_max[r]` = the largest of this block's `cols` logits of row `r`. */
struct vocab_parallel_max {
  static constexpr const char* name = "vocab_parallel_max";
  std::size_t rows = 0, cols = 0;
  const float* logits = nullptr;
  float* row_max = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(logits), f(row_max);
  }
};

/**
 * `sumexp[r]` = the sum over this block of `exp(logit - row_max[r])` (the all-reduced maximum), and
 * `target_logit[r]` = the target's logit where this block holds column `targets[r]`, else 0.
 */
struct vocab_parallel_sumexp {
  static constexpr const char* name = "vocab_parallel_sumexp";
  std::size_t rows = 0, cols = 0, col_offset = 0;
  const float* logits = nullptr;
  const std::int32_t* targets = nullptr;
  const float* row_max = nullptr;
  float* sumexp = nullptr;
  float* target_logit = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(logits), f(targets), f(row_max), f(sumexp), f(target_logit);
  }
};

/**
 * `*loss` = the mean over rows of `log(sumexp[r]) + row_max[r] - target_logit[r]` (summed in double) from the
 * all-reduced statistics, into one float of rank memory: the host reads one number, not three per token.
 */
struct vocab_parallel_loss {
  static constexpr const char* name = "vocab_parallel_loss";
  std::size_t rows = 0;
  const float* row_max = nullptr;
  const float* sumexp = nullptr;
  const float* target_logit = nullptr;
  float* loss = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(row_max), f(sumexp), f(target_logit), f(loss);
  }
};

/** This block's `dlogits = scale (softmax - onehot(target)) / rows`, the softmax from the global statistics. */
struct vocab_parallel_backward {
  static constexpr const char* name = "vocab_parallel_backward";
  std::size_t rows = 0, cols = 0, col_offset = 0;
  const float* logits = nullptr;
  const std::int32_t* targets = nullptr;
  const float* row_max = nullptr;
  const float* sumexp = nullptr;
  float* dlogits = nullptr;  ///< overwritten
  float scale = 1;
  template <class F>
  void each_operand(F&& f) {
    f(logits), f(targets), f(row_max), f(sumexp), f(dlogits);
  }
};

inline void host_reference(const embedding_forward& op) {
  host::embedding_forward(op.tokens, op.dim, op.ids, op.table, op.out, op.vocab_offset, op.vocab_local);
}
inline void host_reference(const embedding_backward& op) {
  host::embedding_backward(op.tokens, op.dim, op.ids, op.dout, op.dtable, op.vocab_offset, op.vocab_local);
}
inline void host_reference(const vocab_parallel_max& op) {
  host::vocab_parallel_max(op.rows, op.cols, op.logits, op.row_max);
}
inline void host_reference(const vocab_parallel_sumexp& op) {
  host::vocab_parallel_sumexp(op.rows, op.cols, op.col_offset, op.logits, op.targets, op.row_max, op.sumexp,
                              op.target_logit);
}
inline void host_reference(const vocab_parallel_loss& op) {
  host::vocab_parallel_loss(op.rows, op.row_max, op.sumexp, op.target_logit, op.loss);
}
inline void host_reference(const vocab_parallel_backward& op) {
  host::vocab_parallel_backward(op.rows, op.cols, op.col_offset, op.logits, op.targets, op.row_max, op.sumexp,
                                op.dlogits, op.scale);
}

}  // namespace mpar::ops
