#pragma once
/**
 * @file The `fused_gelu_backward_backend` concept: a backend with GeLU's backward fused with the bias gradient
 * and the 16-bit conversion that follow it in the MLP's first projection under `Autocast`.
 */
#include "mpar/backend/ops/fused.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/core/dtype.hpp"

namespace mpar::nn::detail {

/**
 * @brief A backend that runs `ops::gelu_backward_bias<T>` for bf16 and f16 `dpre` (backend/ops/fused.hpp):
 * `g = dy * gelu'(pre)`, `dbias += column sums of g`, `dpre = g` rounded to 16 bits. HostBackend and the stream host
 * backends have it; `ColumnParallelGelu` uses it under `Autocast` where the backend has it and composes the three
 * operations otherwise, a choice made at compile time.
 */
template <class B>
concept fused_gelu_backward_backend =
    supports<B, ops::gelu_backward_bias<bf16>> && supports<B, ops::gelu_backward_bias<f16>>;

}  // namespace mpar::nn::detail
