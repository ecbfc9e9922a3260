#pragma once
/**
 * @file The `fused_gelu_backward_backend` concept: a backend with GeLU's backward fused with the bias gradient
 * and the 16-bit conversion that follow it in the MLP's first projection under `Autocast`.
 */
#include <cstddef>

#include "mpar/core/dtype.hpp"

namespace mpar::nn::detail {

/**
 * @brief A backend with `gelu_backward_bias(rows, cols, pre, dy, dbias, dpre)` for bf16 and f16 `dpre`, with the
 * semantics of `mpar::host::gelu_backward_bias` (backend/host/gelu_backward_bias.hpp): `g = dy * gelu'(pre)`,
 * `dbias += column sums of g`, `dpre = g` rounded to 16 bits. HostBackend and the stream host backends have it;
 * `ColumnParallelGelu` uses it under `Autocast` where the backend has it and composes the three operations
 * otherwise, a choice made at compile time.
 */
template <class B>
concept fused_gelu_backward_backend = requires(std::size_t n, const float* x, float* y, bf16* h, f16* f) {
  B::gelu_backward_bias(n, n, x, x, y, h);
  B::gelu_backward_bias(n, n, x, x, y, f);
};

}  // namespace mpar::nn::detail
