#pragma once
/**
 * @file The `llama_kernel_backend` concept: the row kernels of the Llama-class layers (RMSNorm, rotary position
 * embedding, the SwiGLU gate), an optional family of `backend` that only those layers require.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace mpar::detail {

/**
 * @brief A backend with the Llama-class layers' kernels, with the semantics of their `mpar::host` reference
 * (backend/host/llama_kernels.hpp); pointers are rank memory, activations row-major fp32:
 * - `rmsnorm_forward(rows, cols, eps, x, gain, y, rstd)`: `rstd = 1 / sqrt(mean(x^2) + eps)` per row and
 *   `y = x * rstd * gain`;
 * - `rmsnorm_backward(rows, cols, x, rstd, gain, dy, dx, dgain)`: the input gradient (overwritten) and
 *   `dgain += sum over rows of dy * x * rstd` (accumulates, as every parameter gradient does);
 * - `rope_forward(rows, heads, head_dim, ld, positions, theta, x, y)`: the rotate-half rotary embedding of
 *   Hugging Face's Llama on `heads` heads of `head_dim` (even) values per row, row `r` at `r * ld`: with
 *   `a = positions[r] * theta^(-2i / head_dim)`, `y_i = x_i cos a - x_{i+d/2} sin a` and
 *   `y_{i+d/2} = x_{i+d/2} cos a + x_i sin a` for `i < head_dim / 2`; `positions` are `std::int32_t`;
 * - `rope_backward(rows, heads, head_dim, ld, positions, theta, dy, dx)`: its transpose, the rotation by `-a`;
 * - `silu_gate_forward(rows, cols, gate_up, y)`: `y = silu(gate) * up` where row `r` of `gate_up` holds
 *   `cols` gate values then `cols` up values;
 * - `silu_gate_backward(rows, cols, gate_up, dy, dgate_up)`: the gradient of both halves (overwritten).
 * In the rotary kernels `x` may equal `y` (and `dy` `dx`): a head is read whole before it is written.
 */
template <class B>
concept llama_kernel_backend = requires(const float* a, float* c, const std::int32_t* pos, std::size_t n) {
  B::rmsnorm_forward(n, n, 1e-5f, a, a, c, c);
  B::rmsnorm_backward(n, n, a, a, a, a, c, c);
  B::rope_forward(n, n, n, n, pos, 10000.0, a, c);
  B::rope_backward(n, n, n, n, pos, 10000.0, a, c);
  B::silu_gate_forward(n, n, a, c);
  B::silu_gate_backward(n, n, a, a, c);
};

}  // namespace mpar::detail
