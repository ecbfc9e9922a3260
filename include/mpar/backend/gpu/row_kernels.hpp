#pragma once
/**
 * @file CUDA kernels that move rows by index (MoE dispatch and combine): the device side of
 * `host::gather_rows`, `scatter_rows`, `scatter_add_rows` and `scatter_add_rows_backward`
 * (backend/host/row_kernels.hpp, the reference), same arguments plus a trailing optional stream; a
 * negative index names no row, as there. Compile with nvcc, or g++ with
 * MPAR_CUDA_EMULATION (backend/gpu/runtime.hpp).
 *
 * `scatter_add_rows` adds with atomics, so where several rows meet in one (a token routed to k
 * experts) the order of the k additions is not fixed: results agree with the host to float
 * rounding, not bit for bit.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/kernels.hpp"  // grid_for, block_threads, pick, block_reduce, check_launch
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/backend/ops/token_routing.hpp"

namespace mpar::gpu {

namespace detail {

// Templates (instantiated for float), so that including this header in several translation units
// defines each kernel once.
template <class T>
__global__ void gather_rows_kernel(std::size_t rows, std::size_t d, const std::int32_t* index, const T* src, T* dst) {
  const std::size_t n = rows * d;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x)
    dst[k] = index[k / d] < 0 ? T(0) : src[std::size_t(index[k / d]) * d + k % d];  // -1: an empty slot
}
template <class T>
__global__ void scatter_rows_kernel(std::size_t rows, std::size_t d, const std::int32_t* index, const T* src, T* dst) {
  const std::size_t n = rows * d;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x)
    if (index[k / d] >= 0) dst[std::size_t(index[k / d]) * d + k % d] = src[k];
}
template <class T>
__global__ void scatter_add_rows_kernel(std::size_t rows, std::size_t d, const std::int32_t* index, const T* weight,
                                        const T* src, T* dst) {
  const std::size_t n = rows * d;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / d;
    if (index[i] < 0) continue;
    atomicAdd(&dst[std::size_t(index[i]) * d + k % d], weight ? weight[i] * src[k] : src[k]);
  }
}
/** One block per row (grid-stride over rows): the scaled copy, and the dot product reduced over the block. */
template <class T>
__global__ void scatter_add_rows_backward_kernel(std::size_t rows, std::size_t d, const std::int32_t* index,
                                                 const T* weight, const T* dy, const T* src, T* dsrc, T* dot) {
  for (std::size_t i = blockIdx.x; i < rows; i += gridDim.x) {
    if (index[i] < 0) {  // an empty slot: uniform over the block, so the reduction below is skipped by all
      for (std::size_t c = threadIdx.x; c < d; c += blockDim.x) dsrc[i * d + c] = T(0);
      if (threadIdx.x == 0) dot[i] = T(0);
      continue;
    }
    const T* g = dy + std::size_t(index[i]) * d;
    const T w = weight[i];
    T s = 0;
    for (std::size_t c = threadIdx.x; c < d; c += blockDim.x) {
      dsrc[i * d + c] = w * g[c];
      s += g[c] * src[i * d + c];
    }
    s = block_reduce(s, SumOp{});
    if (threadIdx.x == 0) dot[i] = s;
  }
}

}  // namespace detail

/** `dst[i, :] = src[index[i], :]` for `i < rows`. */
inline void gather_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* src, float* dst,
                        cudaStream_t s = nullptr) {
  if (!rows || !d) return;
  MPAR_LAUNCH(detail::gather_rows_kernel<float>, detail::grid_for(rows * d), detail::block_threads, 0, detail::pick(s),
              rows, d, index, src, dst);
  check_launch("gpu::gather_rows");
}
/** `dst[index[i], :] = src[i, :]` for `i < rows` (distinct indices). */
inline void scatter_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* src, float* dst,
                         cudaStream_t s = nullptr) {
  if (!rows || !d) return;
  MPAR_LAUNCH(detail::scatter_rows_kernel<float>, detail::grid_for(rows * d), detail::block_threads, 0, detail::pick(s),
              rows, d, index, src, dst);
  check_launch("gpu::scatter_rows");
}
/** `dst[index[i], :] += weight[i] * src[i, :]` (`weight` null: weight 1), atomically. */
inline void scatter_add_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* weight,
                             const float* src, float* dst, cudaStream_t s = nullptr) {
  if (!rows || !d) return;
  MPAR_LAUNCH(detail::scatter_add_rows_kernel<float>, detail::grid_for(rows * d), detail::block_threads, 0,
              detail::pick(s), rows, d, index, weight, src, dst);
  check_launch("gpu::scatter_add_rows");
}
/** `dsrc[i, :] = weight[i] dy[index[i], :]`, `dot[i] = <dy[index[i], :], src[i, :]>`. */
inline void scatter_add_rows_backward(std::size_t rows, std::size_t d, const std::int32_t* index, const float* weight,
                                      const float* dy, const float* src, float* dsrc, float* dot,
                                      cudaStream_t s = nullptr) {
  if (!rows) return;
  const unsigned grid = rows < 65536 ? unsigned(rows) : 65536u;
  MPAR_LAUNCH(detail::scatter_add_rows_backward_kernel<float>, grid, detail::block_threads, 0, detail::pick(s), rows, d,
              index, weight, dy, src, dsrc, dot);
  check_launch("gpu::scatter_add_rows_backward");
}

// The operation objects (backend/ops/token_routing.hpp), as CudaBackend::run launches them.
inline void launch(const ops::gather_rows& op, cudaStream_t s) {
  gather_rows(op.rows, op.d, op.index, op.src, op.dst, s);
}
inline void launch(const ops::scatter_rows& op, cudaStream_t s) {
  scatter_rows(op.rows, op.d, op.index, op.src, op.dst, s);
}
inline void launch(const ops::scatter_add_rows& op, cudaStream_t s) {
  scatter_add_rows(op.rows, op.d, op.index, op.weight, op.src, op.dst, s);
}
inline void launch(const ops::scatter_add_rows_backward& op, cudaStream_t s) {
  scatter_add_rows_backward(op.rows, op.d, op.index, op.weight, op.dy, op.src, op.dsrc, op.dot, s);
}

}  // namespace mpar::gpu
