#pragma once
/**
 * @file The `fused_attention_backend` concept: a backend with fused attention over the QKV layout.
 */
#include <concepts>
#include <cstddef>

namespace mpar::nn::detail {

/**
 * @brief A backend with fused attention over the QKV layout (CudaBackend: cuDNN's SDPA or mpar's flash
 * kernel, never the s × s scores): `attention_supports(batch_heads, head_dim)` says which shapes it takes,
 * `attention_forward<T>(nb, heads, s, d, scale, causal, qkv, o, o_heads, lse)` writes the fp32 output and
 * keeps the per-head output and log-sum-exp, `attention_backward<T>(..., qkv, o_heads, lse, dout, dqkv)`
 * writes every element of dqkv. The attention layers choose it at compile time; HostBackend has none, so
 * its path is the batched GEMMs and the softmax, with no test at run time.
 */
template <class B>
concept fused_attention_backend = requires(std::size_t n, float a, const float* x, float* y) {
  { B::attention_supports(n, n) } -> std::convertible_to<bool>;
  B::template attention_forward<float>(n, n, n, n, a, true, x, y, y, y);
  B::template attention_backward<float>(n, n, n, n, a, true, x, x, x, x, y);
};

}  // namespace mpar::nn::detail
