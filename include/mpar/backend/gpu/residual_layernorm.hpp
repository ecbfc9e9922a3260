#pragma once
/**
 * @file Residual add and layer norm fused, forward and backward: the pre-LN transformer's
 * `h = x + branch; y = LN(h)` in one kernel, and its backward `dh = dres + LN'(dy)` with dgamma and
 * dbeta in one more.
 *
 * Unfused, the forward writes h, reads it back twice for the statistics and once more for y; the
 * backward reads x, dy and gamma for dx, again for dgamma/dbeta in a column kernel, and a third kernel
 * adds the residual's gradient. Fused, each row is read by one block that keeps it in L1/L2 across its
 * sweeps, and the parameter gradients are summed per block in shared memory (fp32) and added to the
 * global ones once per block and column.
 *
 * Include from a translation unit compiled by nvcc (or by g++ against the emulated runtime).
 */
#include <cmath>
#include <cstddef>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/core/error.hpp"

namespace mpar::gpu {

namespace detail {

/**
 * One block per row. h is rounded to T before the statistics are taken, so y is the layer norm of the
 * residual stream exactly as stored (what an unfused add-then-normalise computes). `h` may alias `x`
 * or `branch`; `y` must not alias h.
 */
template <class T>
__global__ void residual_layernorm_forward_kernel(std::size_t cols, const T* x, const T* branch, const T* gamma,
                                                  const T* beta, T* h, T* y, float* mean, float* rstd, float eps) {
  const std::size_t r = blockIdx.x;
  const T *xr = x + r * cols, *br = branch + r * cols;
  T* hr = h + r * cols;
  float s = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T v = from_compute<T>(to_compute(xr[c]) + to_compute(br[c]));
    hr[c] = v;
    s += float(to_compute(v));
  }
  const float m = block_reduce(s, SumOp{}) / float(cols);
  float var = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {  // each thread rereads what it wrote
    const float d = float(to_compute(hr[c])) - m;
    var += d * d;
  }
  const float rs = rsqrtf(block_reduce(var, SumOp{}) / float(cols) + eps);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x)
    y[r * cols + c] = from_compute<T>(compute_type_t<T>(
        (float(to_compute(hr[c])) - m) * rs * float(to_compute(gamma[c])) + float(to_compute(beta[c]))));
}

/**
 * Blocks stride over the rows. Thread i owns the columns i, i + blockDim, ... of every row it visits,
 * so its partial dgamma/dbeta in dynamic shared memory (2 · cols floats) need no barrier; at the end
 * each block adds its partials to the global sums with one atomic per column. `dh` may alias `dres` or
 * `dy` (a row's reads finish before the barrier inside the second reduction).
 */
template <class T>
__global__ void residual_layernorm_backward_kernel(std::size_t rows, std::size_t cols, const T* h, const float* mean,
                                                   const float* rstd, const T* gamma, const T* dy, const T* dres, T* dh,
                                                   float* dgamma, float* dbeta) {
  MPAR_DYNAMIC_SHARED(float, partial);  // [dgamma | dbeta] of this block, cols each
  float* pg = partial;
  float* pb = partial + cols;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) pg[c] = pb[c] = 0.0f;
  const float inv_n = 1.0f / float(cols);
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *hr = h + r * cols, *dyr = dy + r * cols;
    const float m = mean[r], rs = rstd[r];
    float sg = 0, sgx = 0;
    for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = float(to_compute(dyr[c])) * float(to_compute(gamma[c]));
      sg += g;
      sgx += g * (float(to_compute(hr[c])) - m) * rs;
    }
    sg = block_reduce(sg, SumOp{});
    sgx = block_reduce(sgx, SumOp{});
    for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = (float(to_compute(hr[c])) - m) * rs, g = float(to_compute(dyr[c]));
      const float d = rs * (g * float(to_compute(gamma[c])) - inv_n * (sg + xhat * sgx));
      const float res = dres ? float(to_compute(dres[r * cols + c])) : 0.0f;
      dh[r * cols + c] = from_compute<T>(compute_type_t<T>(res + d));
      pg[c] += g * xhat;
      pb[c] += g;
    }
  }
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    atomicAdd(dgamma + c, pg[c]);
    atomicAdd(dbeta + c, pb[c]);
  }
}

}  // namespace detail

/**
 * @brief `h = x + branch` (rounded to T), then `y = (h - mean) * rstd * gamma + beta` per row, in one
 * kernel; `mean` and `rstd` (float, length rows) are saved for the backward. `h` may alias `x` (the
 * residual stream updated in place).
 */
template <class T>
void residual_layernorm_forward(std::size_t rows, std::size_t cols, const T* x, const T* branch, const T* gamma,
                                const T* beta, T* h, T* y, float* mean, float* rstd, float eps = 1e-5f,
                                cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  require(rows <= 0x7fffffffu, "gpu::residual_layernorm_forward: ", rows, " rows exceed one grid dimension");
  MPAR_LAUNCH(detail::residual_layernorm_forward_kernel, unsigned(rows), detail::block_threads, 0, detail::pick(s),
              cols, x, branch, gamma, beta, h, y, mean, rstd, eps);
  check_launch("gpu::residual_layernorm_forward");
}

/**
 * @brief The backward of residual_layernorm_forward: `dh = dres + dLN/dh(dy)` is the gradient of both
 * `x` and `branch` (overwritten; `dres`, the gradient reaching h through the residual path, may be null
 * or alias dh); `dgamma` and `dbeta` (float, length cols) accumulate in fp32, as layernorm_backward's do.
 */
template <class T>
void residual_layernorm_backward(std::size_t rows, std::size_t cols, const T* h, const float* mean, const float* rstd,
                                 const T* gamma, const T* dy, const T* dres, T* dh, float* dgamma, float* dbeta,
                                 cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  s = detail::pick(s);
  int device = 0, sms = 0, smem_max = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute(SMs)");
  check(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(shared memory)");
  const std::size_t smem = 2 * cols * sizeof(float);
  // block_reduce's own shared memory comes on top of the partial sums: keep 1 KiB for it.
  require(smem + 1024 <= std::size_t(smem_max), "gpu::residual_layernorm_backward: ", cols, " columns need ", smem,
          " bytes of shared memory for the dgamma/dbeta partials; device ", device, " allows ", smem_max,
          " per block. Fix: use layernorm_backward and add the residual gradient separately");
  auto kernel = detail::residual_layernorm_backward_kernel<T>;
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cudaFuncSetAttribute(residual_layernorm_backward shared memory)");
  // Two blocks per SM: enough to fill the device, few enough that the per-block atomics stay cheap.
  const std::size_t want = 2 * std::size_t(sms > 0 ? sms : 1);
  const unsigned grid = unsigned(rows < want ? rows : want);
  MPAR_LAUNCH(kernel, grid, detail::block_threads, smem, s, rows, cols, h, mean, rstd, gamma, dy, dres, dh, dgamma,
              dbeta);
  check_launch("gpu::residual_layernorm_backward");
}

}  // namespace mpar::gpu
