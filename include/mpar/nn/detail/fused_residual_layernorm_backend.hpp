#pragma once
/**
 * @file The `fused_residual_layernorm_backend` concept: a backend with the residual add fused into the layer norm after it.
 */
#include "mpar/backend/ops/fused.hpp"
#include "mpar/backend/ops/operation.hpp"

namespace mpar::nn::detail {

/**
 * @brief A backend that runs `ops::residual_layernorm_forward` (`h = x + branch`, `y = LN(h)`) and
 * `ops::residual_layernorm_backward` (`dh = dres + LN'(dy)`, dgamma and dbeta accumulated; backend/ops/fused.hpp;
 * CudaBackend: gpu::residual_layernorm_*). `LayerNorm::residual_forward` and `residual_backward` use it; a
 * transformer block chooses them at compile time.
 */
template <class B>
concept fused_residual_layernorm_backend =
    supports<B, ops::residual_layernorm_forward> && supports<B, ops::residual_layernorm_backward>;

}  // namespace mpar::nn::detail
