#pragma once
/**
 * @file The `layer_kernel_backend` concept: a backend's elementwise and row kernels of the layers
 * (bias, GeLU, softmax, layer norm, dropout, embedding, the vocabulary-parallel loss).
 */
#include <concepts>
#include <cstddef>

#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/vocab_parallel.hpp"
#include "mpar/backend/types.hpp"  // host::DropoutMask

namespace mpar::detail {

/**
 * @brief The layer-kernel family of `backend`, with the semantics of `mpar::host` (backend/host/kernels.hpp),
 * which is their reference: `add`, `bias_add_forward`, `bias_add_backward` (accumulates), `gelu_forward`,
 * `gelu_backward`, `softmax_forward` (optionally causal), `softmax_backward`, `layernorm_forward`,
 * `layernorm_backward` (accumulates dgamma/dbeta), `dropout_apply`; and the operation objects of the
 * vocabulary-parallel embedding and cross-entropy (backend/ops/vocab_parallel.hpp): `ops::embedding_forward`,
 * `ops::embedding_backward` (accumulates), `ops::vocab_parallel_max`, `ops::vocab_parallel_sumexp`,
 * `ops::vocab_parallel_loss` (the mean cross-entropy from the statistics, into one float of rank memory) and
 * `ops::vocab_parallel_backward`.
 */
template <class B>
concept layer_kernel_backend = requires(const float* a, float* c, const host::DropoutMask& mask, std::size_t n) {
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
}
&&supports<B, ops::embedding_forward>&& supports<B, ops::embedding_backward>&& supports<B, ops::vocab_parallel_max>&&
    supports<B, ops::vocab_parallel_sumexp>&& supports<B, ops::vocab_parallel_loss>&&
        supports<B, ops::vocab_parallel_backward>;

}  // namespace mpar::detail
