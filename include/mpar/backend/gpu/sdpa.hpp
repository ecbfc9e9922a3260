#pragma once
/**
 * @file Scaled-dot-product attention, forward and backward: cuDNN's fused SDPA where it takes the call
 * (built with cuDNN, i.e. MPAR_HAVE_CUDNN; see cudnn_attention.hpp), our own flash kernel
 * (flash_attention.hpp) otherwise. Same layout and results as gpu::flash_attention_forward/backward.
 *
 * The first call that falls back although cuDNN is built in logs why on stderr, once per process, so a
 * run on a cuDNN that gives no engine is visible without flooding the log.
 *
 * Include from a translation unit compiled by nvcc.
 */
#include <atomic>
#include <cstddef>
#include <cstdio>

#include "mpar/backend/gpu/flash_attention.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#if defined(MPAR_HAVE_CUDNN)
#include "mpar/backend/gpu/cudnn_attention.hpp"
#endif

namespace mpar::gpu {

/** @brief Which implementation ran an attention call. */
enum class AttentionPath { cudnn, ours };

namespace detail {
inline void log_attention_fallback_once(const char* what, std::size_t d, bool causal) {
#if defined(MPAR_HAVE_CUDNN)
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true))
    std::fprintf(stderr,
                 "mpar: %s: cuDNN SDPA does not take this call (head dim %zu, %s, or no engine for the shape); "
                 "using mpar's flash attention kernel (logged once)\n",
                 what, d, causal ? "causal" : "not causal");
#else
  (void)what, (void)d, (void)causal;
#endif
}
}  // namespace detail

/** @brief o and lse of softmax(scale · q kᵀ [causal]) v (see flash_attention_forward); says which path ran. */
template <class T>
AttentionPath sdpa_forward(std::size_t batch_heads, std::size_t s, std::size_t d, const T* q, const T* k, const T* v,
                           T* o, float* lse, float scale, bool causal, cudaStream_t st = nullptr) {
  st = detail::pick(st);
#if defined(MPAR_HAVE_CUDNN)
  if (batch_heads && s && cudnn::sdpa_forward<T>(batch_heads, s, d, q, k, v, o, lse, scale, causal, st))
    return AttentionPath::cudnn;
#endif
  detail::log_attention_fallback_once("gpu::sdpa_forward", d, causal);
  flash_attention_forward<T>(batch_heads, s, d, q, k, v, o, lse, scale, causal, st);
  return AttentionPath::ours;
}

/** @brief dq, dk, dv of sdpa_forward (see flash_attention_backward); says which path ran. */
template <class T>
AttentionPath sdpa_backward(std::size_t batch_heads, std::size_t s, std::size_t d, const T* q, const T* k, const T* v,
                            const T* o, const float* lse, const T* dout, T* dq, T* dk, T* dv, float scale, bool causal,
                            cudaStream_t st = nullptr) {
  st = detail::pick(st);
#if defined(MPAR_HAVE_CUDNN)
  if (batch_heads && s &&
      cudnn::sdpa_backward<T>(batch_heads, s, d, q, k, v, o, lse, dout, dq, dk, dv, scale, causal, st))
    return AttentionPath::cudnn;
#endif
  detail::log_attention_fallback_once("gpu::sdpa_backward", d, causal);
  flash_attention_backward<T>(batch_heads, s, d, q, k, v, o, lse, dout, dq, dk, dv, scale, causal, st);
  return AttentionPath::ours;
}

}  // namespace mpar::gpu
