#pragma once
/**
 * @file Device buffer operations on a stream: `zero` (cudaMemsetAsync) and `fill` (a grid-stride kernel).
 * `copy` is `copy_on_device` (memory.hpp) and `convert` is in kernels.hpp.
 */
#include <cuda_runtime.h>

#include <cstddef>

#include "mpar/backend/gpu/error.hpp"
#include "mpar/backend/gpu/kernels.hpp"

namespace mpar::gpu {

namespace detail {
template <class T>
__global__ void fill_kernel(std::size_t n, T value, T* x) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = value;
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
  detail::fill_kernel<<<detail::grid_for(n), detail::block_threads, 0, detail::pick(s)>>>(n, value, x);
  check_launch("gpu::fill");
}

}  // namespace mpar::gpu
