#pragma once
/**
 * @file The `layer_kernel_backend` concept: a backend's elementwise and row kernels of the layers
 * (bias, GeLU, softmax, layer norm, dropout, embedding, the vocabulary-parallel loss).
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/types.hpp"  // host::DropoutMask

namespace mpar::detail {

/**
 * @brief The layer-kernel family of `backend`, with the semantics of `mpar::host` (backend/host/kernels.hpp),
 * which is their reference: `add`, `bias_add_forward`, `bias_add_backward` (accumulates), `gelu_forward`,
 * `gelu_backward`, `softmax_forward` (optionally causal), `softmax_backward`, `layernorm_forward`,
 * `layernorm_backward` (accumulates dgamma/dbeta), `dropout_apply`, `embedding_forward`,
 * `embedding_backward` (accumulates), `vocab_parallel_max`, `vocab_parallel_sumexp`,
 * `vocab_parallel_backward`, and `vocab_parallel_loss(rows, row_max, sumexp, target_logit, loss)`: the mean
 * cross-entropy from the statistics, into one float of rank memory.
 */
template <class B>
concept layer_kernel_backend = requires(const float* a, float* c, const std::int32_t* ids,
                                        const host::DropoutMask& mask, std::size_t n) {
  B::add(n, a, a, c);
  B::bias_add_forward(n, n, a, c);
  B::bias_add_backward(n, n, a, c);
  B::gelu_forward(n, a, c);
  B::gelu_backward(n, a, a, c);
  B::softmax_forward(n, n, a, c, true);
  B::softmax_backward(n, n, a, a, c);
  B::layernorm_forward(n, n, a, a, a, c, c, c);
  B::layernorm_backward(n, n, a, a, a, a, a, c, c, c);
  B::dropout_apply(mask, n, n, a, c);
  B::embedding_forward(n, n, ids, a, c, n, n);
  B::embedding_backward(n, n, ids, a, c, n, n);
  B::vocab_parallel_max(n, n, a, c);
  B::vocab_parallel_sumexp(n, n, n, a, ids, a, c, c);
  B::vocab_parallel_backward(n, n, n, a, ids, a, a, c, 1.0f);
  B::vocab_parallel_loss(n, a, a, a, c);
};

}  // namespace mpar::detail
