#pragma once
/**
 * @file The `layer_kernel_backend` concept: a backend's elementwise and row kernels of the layers
 * (bias, GeLU, softmax, layer norm, dropout, embedding, the vocabulary-parallel loss).
 */
#include "mpar/backend/ops/layer_kernels.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/vocab_parallel.hpp"

namespace mpar::detail {

/**
 * @brief The layer-kernel family of `backend`: `B` runs the operation objects of the layers' elementwise and row
 * kernels (backend/ops/layer_kernels.hpp: `ops::add`, `ops::bias_add_forward`, `ops::bias_add_backward`
 * (accumulates), `ops::gelu_forward`, `ops::gelu_backward`, `ops::softmax_forward` (optionally causal),
 * `ops::softmax_backward`, `ops::layernorm_forward`, `ops::layernorm_backward` (accumulates dgamma/dbeta),
 * `ops::dropout_apply`) and of the vocabulary-parallel embedding and cross-entropy (backend/ops/vocab_parallel.hpp:
 * `ops::embedding_forward`, `ops::embedding_backward` (accumulates), `ops::vocab_parallel_max`,
 * `ops::vocab_parallel_sumexp`, `ops::vocab_parallel_loss`, `ops::vocab_parallel_backward`), with the semantics of
 * their host references.
 */
template <class B>
concept layer_kernel_backend =
    supports<B, ops::add> && supports<B, ops::bias_add_forward> && supports<B, ops::bias_add_backward> &&
    supports<B, ops::gelu_forward> && supports<B, ops::gelu_backward> && supports<B, ops::softmax_forward> &&
    supports<B, ops::softmax_backward> && supports<B, ops::layernorm_forward> && supports<B, ops::layernorm_backward> &&
    supports<B, ops::dropout_apply> && supports<B, ops::embedding_forward> && supports<B, ops::embedding_backward> &&
    supports<B, ops::vocab_parallel_max> && supports<B, ops::vocab_parallel_sumexp> &&
    supports<B, ops::vocab_parallel_loss> && supports<B, ops::vocab_parallel_backward>;

}  // namespace mpar::detail
