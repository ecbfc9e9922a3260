#pragma once
/**
 * @file The optional fused operations: each does in one pass what the layers otherwise compose from required
 * operations, and a layer takes it where `supports<B, Op>` holds, a choice made at compile time. See
 * backend/ops/operation.hpp.
 *
 * Only `gelu_backward_bias` has a host reference (HostBackend and the stream host backends run it); the others exist
 * where a backend has kernels for them (CudaBackend, gpu/fused_ops.hpp), so on the host the layers compose the unfused
 * operations, and the CUDA tests check each fused kernel against that composition.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/gelu_backward_bias.hpp"
#include "mpar/core/detail/half_precision.hpp"

namespace mpar::ops {

/**
 * GeLU's backward with the bias gradient and the 16-bit operand of the next product, in one pass: `g = dy *
 * gelu'(pre)`, `dbias += column sums of g`, `dpre = g` rounded to bf16 or f16. `pre` and `dy` are `[rows, cols]`.
 */
template <class T>
struct gelu_backward_bias {
  static constexpr const char* name = "gelu_backward_bias";
  std::size_t rows = 0, cols = 0;
  const float* pre = nullptr;
  const float* dy = nullptr;
  float* dbias = nullptr;
  T* dpre = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(pre), f(dy), f(dbias), f(dpre);
  }
};

/**
 * Softmax cross-entropy over `vocab` columns of each row of `logits` (leading dimension `ld`), its gradient and its
 * mean in one pass: `dlogits = grad_scale (softmax - onehot(target))`, `row_loss[r]`, `*loss` = the mean of the rows.
 */
struct fused_classifier {
  static constexpr const char* name = "fused_classifier";
  std::size_t rows = 0, vocab = 0, ld = 0;
  const float* logits = nullptr;
  const std::int32_t* targets = nullptr;
  float* dlogits = nullptr;
  float* row_loss = nullptr;
  float* loss = nullptr;
  float grad_scale = 1.0f;
  template <class F>
  void each_operand(F&& f) {
    f(logits), f(targets), f(dlogits), f(row_loss), f(loss);
  }
};

/** `h = x + branch`, `y = LayerNorm(h)` (epsilon 1e-5) with its per-row mean and 1/std kept for the backward. */
struct residual_layernorm_forward {
  static constexpr const char* name = "residual_layernorm_forward";
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  const float* branch = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* h = nullptr;
  float* y = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(branch), f(gamma), f(beta), f(h), f(y), f(mean), f(rstd);
  }
};

/** `dh = dres + LayerNorm'(dy)` at `h`; `dgamma` and `dbeta` accumulated (+=) in fp32. */
struct residual_layernorm_backward {
  static constexpr const char* name = "residual_layernorm_backward";
  std::size_t rows = 0, cols = 0;
  const float* h = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gamma = nullptr;
  const float* dy = nullptr;
  const float* dres = nullptr;
  float* dh = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(h), f(mean), f(rstd), f(gamma), f(dy), f(dres), f(dh), f(dgamma), f(dbeta);
  }
};

/**
 * Attention over the layers' QKV layout (`qkv` `[nb seq, 3 heads head_dim]` in compute type `T`) without the
 * `seq x seq` scores: `o` `[nb seq, heads head_dim]` in fp32, with the per-head output `o_heads` and the log-sum-exp
 * `lse` `[nb heads seq]` kept for the backward. `causal` masks future positions; `scale` multiplies the scores.
 */
template <class T>
struct attention_forward {
  static constexpr const char* name = "attention_forward";
  std::size_t nb = 0, heads = 0, seq = 0, head_dim = 0;
  float scale = 0;
  bool causal = true;
  const T* qkv = nullptr;
  float* o = nullptr;
  T* o_heads = nullptr;
  float* lse = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(qkv), f(o), f(o_heads), f(lse);
  }
};

/** The backward of `attention_forward`: `dqkv` (every element written) from `dout` and what the forward kept. */
template <class T>
struct attention_backward {
  static constexpr const char* name = "attention_backward";
  std::size_t nb = 0, heads = 0, seq = 0, head_dim = 0;
  float scale = 0;
  bool causal = true;
  const T* qkv = nullptr;
  const T* o_heads = nullptr;
  const float* lse = nullptr;
  const float* dout = nullptr;
  float* dqkv = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(qkv), f(o_heads), f(lse), f(dout), f(dqkv);
  }
};

template <mpar::detail::half_precision T>
void host_reference(const gelu_backward_bias<T>& op) {
  host::gelu_backward_bias<T>(op.rows, op.cols, op.pre, op.dy, op.dbias, op.dpre);
}

}  // namespace mpar::ops
