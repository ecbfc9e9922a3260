#pragma once
/**
 * @file The `fused_attention_backend` concept: a backend with fused attention over the QKV layout.
 */
#include <concepts>
#include <cstddef>

#include "mpar/backend/ops/fused.hpp"
#include "mpar/backend/ops/operation.hpp"

namespace mpar::nn::detail {

/**
 * @brief A backend with fused attention over the QKV layout (CudaBackend: cuDNN's SDPA or mpar's flash
 * kernel, never the s × s scores): `attention_supports(batch_heads, head_dim)` says which shapes it takes, and it
 * runs `ops::attention_forward<T>` (the fp32 output, the per-head output and log-sum-exp kept) and
 * `ops::attention_backward<T>` (every element of dqkv written; backend/ops/fused.hpp). The attention layers choose
 * it at compile time; HostBackend has none, so its path is the batched GEMMs and the softmax, with no test at run time.
 */
template <class B>
concept fused_attention_backend = supports<B, ops::attention_forward<float>> &&
    supports<B, ops::attention_backward<float>> && requires(std::size_t n) {
  { B::attention_supports(n, n) } -> std::convertible_to<bool>;
};

}  // namespace mpar::nn::detail
