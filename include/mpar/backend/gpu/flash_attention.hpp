#pragma once
/**
 * @file Scaled-dot-product attention without the s × s scores: a tiled online-softmax kernel
 * (FlashAttention, Dao et al. 2022; the backward of FlashAttention-2) of our own.
 *
 * Layout: `q, k, v, o` are `[batch · heads, s, d]` row-major (one head's sequence contiguous), `lse`
 * `[batch · heads, s]` float (the row's log-sum-exp of the scaled scores, saved for the backward).
 * `o = softmax(scale · q kᵀ) v`, with `causal` masking key j > query i. Arithmetic and statistics are
 * fp32 for float, bf16 and f16 storage. Head dimensions 32, 64, 96 and 128.
 *
 * How: a block of `rows_per_block` warps owns as many consecutive query rows (forward, dQ) or key rows
 * (dK/dV) of one head; the block stages 32 keys (or queries) at a time in shared memory as float, lane
 * l scores the l-th of them against the warp's row (a full dot product, so no shuffle per key), the
 * warp merges the 32 scores into its running maximum and sum, and each lane updates the d / 32 output
 * columns it owns. The backward recomputes the probabilities from `lse`: dQ by query rows, dK and dV by
 * key rows (no atomics: deterministic), after `delta_i = dO_i · O_i`. Written for correctness and
 * memory (O(s · d) per head), not for peak tensor-core throughput: the scores are fp32 FMAs, not MMA.
 *
 * Include from a translation unit compiled by nvcc (or by g++ against the emulated runtime).
 */
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/core/error.hpp"

namespace mpar::gpu {

namespace detail {

inline constexpr int attn_warps = 4;  ///< rows per block (one warp each)
inline constexpr int attn_tile = 32;  ///< keys (or queries) staged per step: one per lane

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/** Stages rows [r0, r0 + 32) of a [s, D] head into `tile` ([32][D + 1] floats, padded against bank conflicts); zero past s. */
template <class T, int D>
__device__ void stage_tile(const T* head, std::size_t s, std::size_t r0, float* tile) {
  for (int i = int(threadIdx.x); i < attn_tile * D; i += int(blockDim.x)) {
    const int r = i / D, c = i % D;
    tile[r * (D + 1) + c] =
        r0 + std::size_t(r) < s ? float(to_compute(head[(r0 + std::size_t(r)) * D + std::size_t(c)])) : 0.0f;
  }
}
template <int D>
__device__ float dot_row(const float* a, const float* tile_row) {
  float acc = 0.0f;
#pragma unroll 8
  for (int c = 0; c < D; ++c) acc += a[c] * tile_row[c];
  return acc;
}

template <class T, int D>
__global__ void flash_forward_kernel(std::size_t s, const T* q, const T* k, const T* v, T* o, float* lse, float scale,
                                     bool causal) {
  constexpr int U = D / 32;
  __shared__ float ks[attn_tile * (D + 1)], vs[attn_tile * (D + 1)], qs[attn_warps][D];
  const std::size_t bh = blockIdx.y, base = bh * s * D;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const std::size_t row0 = std::size_t(blockIdx.x) * attn_warps, i = row0 + std::size_t(warp);
  const bool active = i < s;
  if (active)
    for (int c = lane; c < D; c += 32) qs[warp][c] = float(to_compute(q[base + i * D + std::size_t(c)]));
  float m = -INFINITY, l = 0.0f, acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0.0f;
  const std::size_t last_row = row0 + attn_warps - 1 < s ? row0 + attn_warps - 1 : s - 1;
  const std::size_t kend = causal ? last_row + 1 : s;
  for (std::size_t t0 = 0; t0 < kend; t0 += attn_tile) {
    __syncthreads();  // the previous tile is consumed (and qs is written before the first)
    stage_tile<T, D>(k + base, s, t0, ks);
    stage_tile<T, D>(v + base, s, t0, vs);
    __syncthreads();
    if (!active) continue;
    const std::size_t j = t0 + std::size_t(lane);
    const bool valid = j < s && (!causal || j <= i);
    const float sc = valid ? scale * dot_row<D>(qs[warp], ks + lane * (D + 1)) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(sc));
    if (m_new == -INFINITY) continue;                                          // nothing visible yet
    const float p = valid ? expf(sc - m_new) : 0.0f, alpha = expf(m - m_new);  // exp(-inf) = 0
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] *= alpha;
    for (int jj = 0; jj < attn_tile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u] += pj * vs[jj * (D + 1) + lane + 32 * u];
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
#pragma unroll
  for (int u = 0; u < U; ++u)
    o[base + i * D + std::size_t(lane + 32 * u)] = from_compute<T>(compute_type_t<T>(acc[u] * inv));
  if (lane == 0) lse[bh * s + i] = m + logf(l);
}

/** delta[r] = dO_r · O_r, one warp per row (the softmax backward's row term). */
template <class T, int D>
__global__ void flash_delta_kernel(std::size_t rows, const T* o, const T* dout, float* delta) {
  const std::size_t r = std::size_t(blockIdx.x) * attn_warps + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int c = lane; c < D; c += 32)
    acc += float(to_compute(o[r * D + std::size_t(c)])) * float(to_compute(dout[r * D + std::size_t(c)]));
  acc = warp_sum(acc);
  if (lane == 0) delta[r] = acc;
}

/** dQ_i = scale · sum_j P_ij (dP_ij - delta_i) K_j with dP_ij = dO_i · V_j, by query rows. */
template <class T, int D>
__global__ void flash_backward_dq_kernel(std::size_t s, const T* q, const T* k, const T* v, const T* dout,
                                         const float* lse, const float* delta, T* dq, float scale, bool causal) {
  constexpr int U = D / 32;
  __shared__ float ks[attn_tile * (D + 1)], vs[attn_tile * (D + 1)], qs[attn_warps][D], dos[attn_warps][D];
  const std::size_t bh = blockIdx.y, base = bh * s * D;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const std::size_t row0 = std::size_t(blockIdx.x) * attn_warps, i = row0 + std::size_t(warp);
  const bool active = i < s;
  if (active)
    for (int c = lane; c < D; c += 32) {
      qs[warp][c] = float(to_compute(q[base + i * D + std::size_t(c)]));
      dos[warp][c] = float(to_compute(dout[base + i * D + std::size_t(c)]));
    }
  const float li = active ? lse[bh * s + i] : 0.0f, di = active ? delta[bh * s + i] : 0.0f;
  float acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0.0f;
  const std::size_t last_row = row0 + attn_warps - 1 < s ? row0 + attn_warps - 1 : s - 1;
  const std::size_t kend = causal ? last_row + 1 : s;
  for (std::size_t t0 = 0; t0 < kend; t0 += attn_tile) {
    __syncthreads();
    stage_tile<T, D>(k + base, s, t0, ks);
    stage_tile<T, D>(v + base, s, t0, vs);
    __syncthreads();
    if (!active) continue;
    const std::size_t j = t0 + std::size_t(lane);
    const bool valid = j < s && (!causal || j <= i);
    float ds = 0.0f;
    if (valid) {
      const float p = expf(scale * dot_row<D>(qs[warp], ks + lane * (D + 1)) - li);
      ds = p * (dot_row<D>(dos[warp], vs + lane * (D + 1)) - di);
    }
    for (int jj = 0; jj < attn_tile; ++jj) {
      const float dj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u] += dj * ks[jj * (D + 1) + lane + 32 * u];
    }
  }
  if (!active) return;
#pragma unroll
  for (int u = 0; u < U; ++u)
    dq[base + i * D + std::size_t(lane + 32 * u)] = from_compute<T>(compute_type_t<T>(scale * acc[u]));
}

/** dV_j = sum_i P_ij dO_i and dK_j = scale · sum_i P_ij (dP_ij - delta_i) Q_i, by key rows. */
template <class T, int D>
__global__ void flash_backward_dkdv_kernel(std::size_t s, const T* q, const T* k, const T* v, const T* dout,
                                           const float* lse, const float* delta, T* dk, T* dv, float scale,
                                           bool causal) {
  constexpr int U = D / 32;
  __shared__ float qts[attn_tile * (D + 1)], dots[attn_tile * (D + 1)], ks[attn_warps][D], vs[attn_warps][D];
  __shared__ float lse_t[attn_tile], delta_t[attn_tile];
  const std::size_t bh = blockIdx.y, base = bh * s * D;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const std::size_t key0 = std::size_t(blockIdx.x) * attn_warps, j = key0 + std::size_t(warp);
  const bool active = j < s;
  if (active)
    for (int c = lane; c < D; c += 32) {
      ks[warp][c] = float(to_compute(k[base + j * D + std::size_t(c)]));
      vs[warp][c] = float(to_compute(v[base + j * D + std::size_t(c)]));
    }
  float adk[U], adv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) adk[u] = adv[u] = 0.0f;
  // Causal: queries before the block's first key see none of its keys.
  const std::size_t qbegin = causal ? key0 / attn_tile * attn_tile : 0;
  for (std::size_t t0 = qbegin; t0 < s; t0 += attn_tile) {
    __syncthreads();
    stage_tile<T, D>(q + base, s, t0, qts);
    stage_tile<T, D>(dout + base, s, t0, dots);
    if (threadIdx.x < attn_tile) {
      const std::size_t r = t0 + threadIdx.x;
      lse_t[threadIdx.x] = r < s ? lse[bh * s + r] : 0.0f;
      delta_t[threadIdx.x] = r < s ? delta[bh * s + r] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const std::size_t i = t0 + std::size_t(lane);
    const bool valid = i < s && (!causal || j <= i);
    float p = 0.0f, ds = 0.0f;
    if (valid) {
      p = expf(scale * dot_row<D>(ks[warp], qts + lane * (D + 1)) - lse_t[lane]);
      ds = p * (dot_row<D>(vs[warp], dots + lane * (D + 1)) - delta_t[lane]);
    }
    for (int ii = 0; ii < attn_tile; ++ii) {
      const float pi = __shfl_sync(0xffffffffu, p, ii), di = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        adv[u] += pi * dots[ii * (D + 1) + lane + 32 * u];
        adk[u] += di * qts[ii * (D + 1) + lane + 32 * u];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    dk[base + j * D + std::size_t(lane + 32 * u)] = from_compute<T>(compute_type_t<T>(scale * adk[u]));
    dv[base + j * D + std::size_t(lane + 32 * u)] = from_compute<T>(compute_type_t<T>(adv[u]));
  }
}

/** Calls f(std::integral_constant<int, D>) for the supported head dimension d. */
template <class F>
void with_head_dim(std::size_t d, const char* what, F&& f) {
  switch (d) {
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    case 96:
      f(std::integral_constant<int, 96>{});
      break;
    case 128:
      f(std::integral_constant<int, 128>{});
      break;
    default:
      require(false, what, ": head dimension ", d,
              " is not supported (32, 64, 96 or 128). "
              "Fix: pad the heads, or use gemm_strided_batched and softmax_forward");
  }
}
inline dim3 attention_grid(std::size_t batch_heads, std::size_t s, const char* what) {
  require(batch_heads >= 1 && batch_heads <= 65535, what, ": ", batch_heads,
          " batch x heads exceed the grid's second dimension (65535)");
  return dim3(unsigned((s + attn_warps - 1) / attn_warps), unsigned(batch_heads));
}

}  // namespace detail

/**
 * @brief o = softmax(scale · q kᵀ [causal]) v per head, and the rows' log-sum-exp for the backward, without
 * materialising the scores. `q, k, v, o`: `[batch_heads, s, d]`; `lse`: `[batch_heads, s]` float.
 */
template <class T>
void flash_attention_forward(std::size_t batch_heads, std::size_t s, std::size_t d, const T* q, const T* k, const T* v,
                             T* o, float* lse, float scale, bool causal, cudaStream_t st = nullptr) {
  if (!batch_heads || !s) return;
  const dim3 grid = detail::attention_grid(batch_heads, s, "gpu::flash_attention_forward");
  st = detail::pick(st);
  detail::with_head_dim(d, "gpu::flash_attention_forward", [&](auto D) {
    const auto kernel = detail::flash_forward_kernel<T, decltype(D)::value>;
    MPAR_LAUNCH(kernel, grid, detail::attn_warps * 32, 0, st, s, q, k, v, o, lse, scale, causal);
  });
  check_launch("gpu::flash_attention_forward");
}

/**
 * @brief The gradients dq, dk, dv (overwritten) of flash_attention_forward from `dout`, the forward's `o`
 * and `lse`. A `[batch_heads, s]` float scratch for `dO · O` is allocated and freed in stream order.
 */
template <class T>
void flash_attention_backward(std::size_t batch_heads, std::size_t s, std::size_t d, const T* q, const T* k, const T* v,
                              const T* o, const float* lse, const T* dout, T* dq, T* dk, T* dv, float scale,
                              bool causal, cudaStream_t st = nullptr) {
  if (!batch_heads || !s) return;
  const dim3 grid = detail::attention_grid(batch_heads, s, "gpu::flash_attention_backward");
  st = detail::pick(st);
  DeviceBuffer<float> delta(batch_heads * s, st);
  detail::with_head_dim(d, "gpu::flash_attention_backward", [&](auto D) {
    constexpr int Dv = decltype(D)::value;
    const std::size_t rows = batch_heads * s;
    const auto delta_kernel = detail::flash_delta_kernel<T, Dv>;
    const auto dq_kernel = detail::flash_backward_dq_kernel<T, Dv>;
    const auto dkdv_kernel = detail::flash_backward_dkdv_kernel<T, Dv>;
    MPAR_LAUNCH(delta_kernel, unsigned((rows + detail::attn_warps - 1) / detail::attn_warps), detail::attn_warps * 32,
                0, st, rows, o, dout, delta.data());
    check_launch("gpu::flash_attention_backward(delta)");
    MPAR_LAUNCH(dq_kernel, grid, detail::attn_warps * 32, 0, st, s, q, k, v, dout, lse, delta.data(), dq, scale,
                causal);
    check_launch("gpu::flash_attention_backward(dq)");
    MPAR_LAUNCH(dkdv_kernel, grid, detail::attn_warps * 32, 0, st, s, q, k, v, dout, lse, delta.data(), dk, dv, scale,
                causal);
  });
  check_launch("gpu::flash_attention_backward(dk, dv)");
}

}  // namespace mpar::gpu
