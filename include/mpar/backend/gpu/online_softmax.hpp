#pragma once
/**
 * @file CUDA kernels of the online-softmax steps of blockwise attention: a `launch(op, stream)` overload for each of
 * `ops::online_softmax_update`, `_finish`, `_delta` and `_backward` (backend/ops/online_softmax.hpp, whose host
 * reference they are tested against), which is how CudaBackend runs them. Compile
 * with nvcc (`SoftmaxBlock::visible` is constexpr, callable on the device under --expt-relaxed-constexpr), or g++
 * with MPAR_CUDA_EMULATION (backend/gpu/runtime.hpp).
 *
 * The update reduces each row's maximum and sum over a thread block, so its sums are in another order than
 * the host's loop: results agree with the host to float rounding, not bit for bit.
 */
#include <cmath>
#include <cstddef>

#include "mpar/backend/gpu/kernels.hpp"  // grid_for, block_threads, pick, block_reduce, check_launch
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/backend/ops/online_softmax.hpp"

namespace mpar::gpu {

namespace detail {

// Templates (instantiated once, for float), so that including this header in several translation units
// defines each kernel once.

/** One thread block per (head, row) of the score block (grid-stride): max, exp and sum reduced over the block. */
template <class T>
__global__ void online_softmax_update_kernel(SoftmaxBlock b, T* scores, T* row_max, T* row_sum, T* out) {
  for (std::size_t r = blockIdx.x; r < b.heads * b.rows; r += gridDim.x) {
    const std::size_t h = r / b.rows, i = r % b.rows, n = b.visible(i), st = h * b.stat_stride + i;
    T* s = scores + r * b.cols;
    if (n == 0) {  // uniform over the thread block: every thread skips the reductions below
      for (std::size_t c = threadIdx.x; c < b.cols; c += blockDim.x) s[c] = T(0);
      continue;
    }
    const T m_old = row_max[st];
    T mx = m_old;
    for (std::size_t c = threadIdx.x; c < n; c += blockDim.x) mx = fmaxf(mx, s[c]);
    mx = block_reduce(mx, MaxOp{});
    const T alpha = expf(m_old - mx);  // 0 for the row's first block (max = -inf)
    T sum = 0;
    for (std::size_t c = threadIdx.x; c < b.cols; c += blockDim.x) {
      const T e = c < n ? expf(s[c] - mx) : T(0);
      s[c] = e;
      sum += e;
    }
    sum = block_reduce(sum, SumOp{});  // its barriers also order every read of row_max before the write below
    if (threadIdx.x == 0) row_max[st] = mx, row_sum[st] = alpha * row_sum[st] + sum;
    T* o = out + i * b.out_ld + h * b.head_dim;
    for (std::size_t x = threadIdx.x; x < b.head_dim; x += blockDim.x) o[x] *= alpha;
  }
}
/** One thread per (head, row): out /= sum, max becomes the log-sum-exp. */
template <class T>
__global__ void online_softmax_finish_kernel(std::size_t heads, std::size_t rows, std::size_t head_dim,
                                             std::size_t stat_stride, std::size_t out_ld, T* row_max, const T* row_sum,
                                             T* out) {
  for (std::size_t r = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; r < heads * rows;
       r += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t h = r / rows, i = r % rows, st = h * stat_stride + i;
    if (row_sum[st] == T(0)) {  // no visible key: no distribution, the output keeps its accumulator
      row_max[st] = -INFINITY;
      continue;
    }
    T* o = out + i * out_ld + h * head_dim;
    for (std::size_t x = 0; x < head_dim; ++x) o[x] /= row_sum[st];
    row_max[st] += logf(row_sum[st]);
  }
}
/** One thread per (head, row): delta = rowsum(dout * out). */
template <class T>
__global__ void online_softmax_delta_kernel(std::size_t heads, std::size_t rows, std::size_t head_dim,
                                            std::size_t stat_stride, std::size_t out_ld, const T* dout, const T* out,
                                            T* delta) {
  for (std::size_t r = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; r < heads * rows;
       r += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t h = r / rows, i = r % rows, row = i * out_ld + h * head_dim;
    T acc = 0;
    for (std::size_t x = 0; x < head_dim; ++x) acc += dout[row + x] * out[row + x];
    delta[h * stat_stride + i] = acc;
  }
}
/** One thread per score: P = exp(s - lse) where visible, dS = P (dp - delta). */
template <class T>
__global__ void online_softmax_backward_kernel(SoftmaxBlock b, const T* lse, const T* delta, T* p, T* dp) {
  const std::size_t n = b.heads * b.rows * b.cols;
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < n;
       e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = e / b.cols, c = e % b.cols, h = r / b.rows, i = r % b.rows, st = h * b.stat_stride + i;
    const T pe = c < b.visible(i) ? expf(p[e] - lse[st]) : T(0);
    p[e] = pe;
    dp[e] = pe * (dp[e] - delta[st]);
  }
}

}  // namespace detail

// The operation objects (backend/ops/online_softmax.hpp), as CudaBackend::run launches them.
/** One key block's update of the running statistics and output rows. */
inline void launch(const ops::online_softmax_update& op, cudaStream_t s = nullptr) {
  const SoftmaxBlock& b = op.block;
  if (!b.heads || !b.rows || !b.cols) return;
  const std::size_t rows = b.heads * b.rows;
  MPAR_LAUNCH(detail::online_softmax_update_kernel<float>, unsigned(rows < 65536 ? rows : 65536), detail::block_threads,
              0, detail::pick(s), b, op.scores, op.row_max, op.row_sum, op.out);
  check_launch("gpu::online_softmax_update");
}
/** `out /= row_sum`, `row_max` becomes the log-sum-exp. */
inline void launch(const ops::online_softmax_finish& op, cudaStream_t s = nullptr) {
  if (!op.heads || !op.rows) return;
  MPAR_LAUNCH(detail::online_softmax_finish_kernel<float>, detail::grid_for(op.heads * op.rows), detail::block_threads,
              0, detail::pick(s), op.heads, op.rows, op.head_dim, op.stat_stride, op.out_ld, op.row_max, op.row_sum,
              op.out);
  check_launch("gpu::online_softmax_finish");
}
/** `delta = rowsum(dout * out)` per row and head. */
inline void launch(const ops::online_softmax_delta& op, cudaStream_t s = nullptr) {
  if (!op.heads || !op.rows) return;
  MPAR_LAUNCH(detail::online_softmax_delta_kernel<float>, detail::grid_for(op.heads * op.rows), detail::block_threads,
              0, detail::pick(s), op.heads, op.rows, op.head_dim, op.stat_stride, op.out_ld, op.dout, op.out, op.delta);
  check_launch("gpu::online_softmax_delta");
}
/** One block's backward: P from the scores and lse, dS from dP and delta. */
inline void launch(const ops::online_softmax_backward& op, cudaStream_t s = nullptr) {
  const SoftmaxBlock& b = op.block;
  const std::size_t n = b.heads * b.rows * b.cols;
  if (!n) return;
  MPAR_LAUNCH(detail::online_softmax_backward_kernel<float>, detail::grid_for(n), detail::block_threads, 0,
              detail::pick(s), b, op.lse, op.delta, op.p, op.dp);
  check_launch("gpu::online_softmax_backward");
}

}  // namespace mpar::gpu
