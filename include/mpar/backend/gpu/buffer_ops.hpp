#pragma once
/**
 * @file Device buffer operations on a stream: `zero` (cudaMemsetAsync), `fill` and `init_values` (grid-stride
 * kernels). `copy` and `copy_2d` are `copy_on_device` and `copy_2d_on_device` (memory.hpp); `convert` is in
 * kernels.hpp.
 */
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/core/init.hpp"

namespace mpar::gpu {

namespace detail {
template <class T>
__global__ void fill_kernel(std::size_t n, T value, T* x) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

/**
 * x[i] = T(block.value(i)): the `MPAR_HOST_DEVICE` functions of core/init.hpp, so the hashing, the uniform's
 * rounding and the fp32 conversion are the host's, operation for operation. The block comes by value.
 */
template <class T>
__global__ void init_values_kernel(InitBlock block, std::uint64_t n, T* x) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::uint64_t(gridDim.x) * blockDim.x)
    x[i] = T(block.value(i));
}
}  // namespace detail

/** x[i] = 0 for i < n (all-zero bytes), ordered on `s`. */
template <class T>
void zero(std::size_t n, T* x, cudaStream_t s = nullptr) {
  if (n) check(cudaMemsetAsync(x, 0, n * sizeof(T), detail::pick(s)), "cudaMemsetAsync");
}
/** x[i] = value for i < n, ordered on `s`. */
template <class T>
void fill(std::size_t n, T value, T* x, cudaStream_t s = nullptr) {
  if (!n) return;
  MPAR_LAUNCH(detail::fill_kernel, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), n, value, x);
  check_launch("gpu::fill");
}
/** x[k] = T(block.value(k)) for k < block.size(): a parameter block's initial values, ordered on `s`. */
template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
void init_values(const InitBlock& block, T* x, cudaStream_t s = nullptr) {
  const std::uint64_t n = block.size();
  if (!n) return;
  MPAR_LAUNCH(detail::init_values_kernel, detail::grid_for(std::size_t(n)), detail::block_threads, 0, detail::pick(s),
              block, n, x);
  check_launch("gpu::init_values");
}

}  // namespace mpar::gpu
