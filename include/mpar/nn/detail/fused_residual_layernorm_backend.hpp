#pragma once
/**
 * @file The `fused_residual_layernorm_backend` concept: a backend with the residual add fused into the layer norm after it.
 */
#include <concepts>
#include <cstddef>

namespace mpar::nn::detail {

/**
 * @brief A backend with the residual add fused into the layer norm after it (CudaBackend:
 * gpu::residual_layernorm_*): `residual_layernorm_forward(rows, cols, x, branch, gamma, beta, h, y, mean, rstd)`
 * writes `h = x + branch` and `y = LN(h)`; `residual_layernorm_backward(rows, cols, h, mean, rstd, gamma, dy, dres,
 * dh, dgamma, dbeta)` writes `dh = dres + LN'(dy)` and accumulates dgamma, dbeta. `LayerNorm::residual_forward`
 * and `residual_backward` use it; a transformer block chooses them at compile time.
 */
template <class B>
concept fused_residual_layernorm_backend = requires(std::size_t n, const float* x, float* y) {
  B::residual_layernorm_forward(n, n, x, x, x, x, y, y, y, y);
  B::residual_layernorm_backward(n, n, x, x, x, x, x, x, y, y, y);
};

}  // namespace mpar::nn::detail
