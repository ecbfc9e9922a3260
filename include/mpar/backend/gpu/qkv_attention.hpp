#pragma once
/**
 * @file Attention over the layers' QKV layout with the fused kernels: `nn`'s attention core keeps q, k, v
 * as the columns `(q | k | v)` of one `[tokens, 3 · heads · d]` matrix (token `b · s + i`, head `h` at
 * columns `h · d`), while cuDNN's SDPA and mpar's flash kernel take `[batch · heads, s, d]` heads. These
 * functions gather the heads out of the QKV matrix (converting to the kernels' storage type), run
 * `gpu::sdpa_forward/backward` (cuDNN where it takes the call, our flash kernel otherwise) and scatter the
 * result back into the layers' `[tokens, heads · d]` / `[tokens, 3 · heads · d]` fp32 layout.
 *
 * The gather is one element-wise pass over q, k and v (and dO in the backward); it is the price of
 * keeping the layers' projections unchanged, and small next to attention itself (4 · tokens · hl
 * elements against O(tokens · s · hl) work).
 *
 * Include from a translation unit compiled by nvcc (or by g++ against the emulated runtime).
 */
#include <cstddef>

#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/gpu/sdpa.hpp"

namespace mpar::gpu {

namespace detail {

/** Converts one element between storage types, rounding to nearest even as the host types do. */
template <class To, class From>
__device__ inline To convert_element(From x) {
  return from_compute<To>(compute_type_t<To>(to_compute(x)));
}

/**
 * Between the row layout `[nb · s, ld]` (head h of part p at column `offset + h · d`) and the head layout
 * `[nb · heads, s, d]`: `ToHeads` gathers rows into heads, otherwise heads are scattered into rows.
 */
template <bool ToHeads, class From, class To>
__global__ void heads_layout_kernel(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, std::size_t ld,
                                    std::size_t offset, const From* src, To* dst) {
  const std::size_t n = nb * heads * s * d;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t c = i % d, row = (i / d) % s, bh = i / (d * s), h = bh % heads, b = bh / heads;
    const std::size_t r = (b * s + row) * ld + offset + h * d + c;  // the element's place in the row layout
    if constexpr (ToHeads)
      dst[i] = convert_element<To>(src[r]);
    else
      dst[r] = convert_element<To>(src[i]);
  }
}

template <bool ToHeads, class From, class To>
void heads_layout(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, std::size_t ld, std::size_t offset,
                  const From* src, To* dst, cudaStream_t st, const char* what) {
  const std::size_t n = nb * heads * s * d;
  if (!n) return;
  MPAR_LAUNCH(heads_layout_kernel<ToHeads>, grid_for(n), block_threads, 0, st, nb, heads, s, d, ld, offset, src, dst);
  check_launch(what);
}

}  // namespace detail

/** True when `qkv_attention_forward/backward` take these sizes (mpar's flash kernel: d of 32, 64, 96, 128). */
[[nodiscard]] inline bool qkv_attention_supports(std::size_t batch_heads, std::size_t d) {
  return batch_heads >= 1 && batch_heads <= 65535 && (d == 32 || d == 64 || d == 96 || d == 128);
}

/**
 * @brief Attention of `nb` sequences of length `s` over `heads` heads of size `d` read from `qkv`
 * (`[nb · s, 3 · heads · d]`, storage type T: float, or bf16 / f16 under autocast): `o` (`[nb · s, heads · d]`
 * fp32) = softmax(scale · q kᵀ [causal]) v, and what the backward needs: `o_heads` (`[nb · heads, s, d]`, T)
 * and `lse` (`[nb · heads, s]` float). Says which implementation ran.
 */
template <class T>
AttentionPath qkv_attention_forward(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, float scale,
                                    bool causal, const T* qkv, float* o, T* o_heads, float* lse,
                                    cudaStream_t st = nullptr) {
  st = detail::pick(st);
  const std::size_t hl = heads * d, ld = 3 * hl, n = nb * heads * s * d;
  DeviceBuffer<T> q(n, st), k(n, st), v(n, st);
  detail::heads_layout<true>(nb, heads, s, d, ld, 0, qkv, q.data(), st, "gpu::qkv_attention_forward(q)");
  detail::heads_layout<true>(nb, heads, s, d, ld, hl, qkv, k.data(), st, "gpu::qkv_attention_forward(k)");
  detail::heads_layout<true>(nb, heads, s, d, ld, 2 * hl, qkv, v.data(), st, "gpu::qkv_attention_forward(v)");
  const AttentionPath path =
      sdpa_forward<T>(nb * heads, s, d, q.data(), k.data(), v.data(), o_heads, lse, scale, causal, st);
  detail::heads_layout<false>(nb, heads, s, d, hl, 0, static_cast<const T*>(o_heads), o, st,
                              "gpu::qkv_attention_forward(o)");
  return path;  // q, k, v are freed in stream order, after the kernels that read them
}

/**
 * @brief dqkv (`[nb · s, 3 · heads · d]` fp32, every element written) of qkv_attention_forward from `dout`
 * (`[nb · s, heads · d]` fp32) and the forward's `qkv`, `o_heads` and `lse`. Says which implementation ran.
 */
template <class T>
AttentionPath qkv_attention_backward(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, float scale,
                                     bool causal, const T* qkv, const T* o_heads, const float* lse, const float* dout,
                                     float* dqkv, cudaStream_t st = nullptr) {
  st = detail::pick(st);
  const std::size_t hl = heads * d, ld = 3 * hl, n = nb * heads * s * d;
  DeviceBuffer<T> q(n, st), k(n, st), v(n, st), go(n, st), dq(n, st), dk(n, st), dv(n, st);
  detail::heads_layout<true>(nb, heads, s, d, ld, 0, qkv, q.data(), st, "gpu::qkv_attention_backward(q)");
  detail::heads_layout<true>(nb, heads, s, d, ld, hl, qkv, k.data(), st, "gpu::qkv_attention_backward(k)");
  detail::heads_layout<true>(nb, heads, s, d, ld, 2 * hl, qkv, v.data(), st, "gpu::qkv_attention_backward(v)");
  detail::heads_layout<true>(nb, heads, s, d, hl, 0, dout, go.data(), st, "gpu::qkv_attention_backward(dO)");
  const AttentionPath path = sdpa_backward<T>(nb * heads, s, d, q.data(), k.data(), v.data(), o_heads, lse, go.data(),
                                              dq.data(), dk.data(), dv.data(), scale, causal, st);
  const T* grads[3] = {dq.data(), dk.data(), dv.data()};
  for (std::size_t p = 0; p < 3; ++p)
    detail::heads_layout<false>(nb, heads, s, d, ld, p * hl, grads[p], dqkv, st, "gpu::qkv_attention_backward(dqkv)");
  return path;
}

}  // namespace mpar::gpu
