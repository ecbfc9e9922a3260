#pragma once
/**
 * @file The fused classifier: softmax, cross-entropy and its gradient in one kernel over the logits.
 *
 * The unfused path (`cross_entropy_forward` + `cross_entropy_backward`, or the three vocabulary-parallel
 * steps) reads the `[tokens, vocab]` logits three times and writes the probabilities once; for a GPT the
 * logits are the largest activation of the step. Here one block owns one row: a single read keeps an
 * online maximum and sum of exponentials (Milakov & Gimelshein 2018) in fp32, the block combines the
 * threads' (max, sum) pairs, and a second sweep over the same row (still in L2) writes the gradient.
 * Padded vocabulary columns (`[vocab, ld)`, the rounding of the LM head's width to a multiple of 64 or
 * 128 for tensor cores) take no part in the softmax and get a zero gradient.
 *
 * Include from a translation unit compiled by nvcc, or by g++ with MPAR_CUDA_EMULATION (backend/gpu/runtime.hpp).
 */
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/kernels.hpp"  // block_threads, pick, check_launch
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime and CUB, or their emulation
#include "mpar/core/error.hpp"

namespace mpar::gpu {

namespace detail {

/** The running state of an online softmax: the maximum seen and the sum of exp(x - max). */
struct OnlineSoftmax {
  float max;
  float sum;
};
/** Merges two partial states; an empty one (max = -inf, sum = 0) is the identity, without a NaN from inf - inf. */
struct OnlineSoftmaxOp {
  __device__ OnlineSoftmax operator()(OnlineSoftmax a, OnlineSoftmax b) const {
    if (a.max < b.max) {
      const OnlineSoftmax t = a;
      a = b;
      b = t;
    }
    if (b.max == -INFINITY) return a;
    return {a.max, a.sum + b.sum * expf(b.max - a.max)};
  }
};

/**
 * One block per row. `dlogits` may be null (loss only) and may alias `logits`: every element is read
 * by the thread that later writes it, and the target logit is read before the barrier that precedes
 * the writes.
 */
template <class T>
__global__ void fused_classifier_kernel(std::size_t rows, std::size_t vocab, std::size_t ld, const T* logits,
                                        const std::int32_t* targets, T* dlogits, float* row_loss, float* row_lse,
                                        float grad_scale) {
  using Reduce = cub::BlockReduce<OnlineSoftmax, block_threads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ OnlineSoftmax row;
  const std::size_t r = blockIdx.x;
  const T* xr = logits + r * ld;
  OnlineSoftmax st{-INFINITY, 0.0f};
  for (std::size_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float v = float(to_compute(xr[c]));
    if (v > st.max) {
      st.sum = st.sum * expf(st.max - v) + 1.0f;  // exp(-inf) = 0 on the first element
      st.max = v;
    } else if (v != -INFINITY) {  // a masked logit adds nothing (and -inf - -inf would be NaN)
      st.sum += expf(v - st.max);
    }
  }
  const OnlineSoftmax total = Reduce(storage).Reduce(st, OnlineSoftmaxOp{});
  const std::int32_t t = targets[r];
  const bool valid_target = t >= 0 && std::size_t(t) < vocab;
  if (threadIdx.x == 0) {
    row = total;
    const float lse = total.max + logf(total.sum);
    // -log p_t = lse - x_t: exact even where p_t underflows to zero. A target outside the vocabulary
    // (padding columns included) makes the row's loss NaN: a kernel cannot throw.
    row_loss[r] = valid_target ? lse - float(to_compute(xr[t])) : NAN;
    if (row_lse) row_lse[r] = lse;
  }
  __syncthreads();
  if (!dlogits) return;
  const float mx = row.max, inv = 1.0f / row.sum, s = grad_scale / float(rows);
  T* dr = dlogits + r * ld;
  for (std::size_t c = threadIdx.x; c < ld; c += blockDim.x) {
    float g = 0.0f;
    if (c < vocab) g = s * (expf(float(to_compute(xr[c])) - mx) * inv - (std::int64_t(c) == t ? 1.0f : 0.0f));
    dr[c] = from_compute<T>(compute_type_t<T>(g));
  }
}

/** `*loss` = mean of `row_loss` in one block, in a fixed order (the same bits on every run, unlike atomics). */
template <class = void>
__global__ void mean_rows_kernel(std::size_t rows, const float* row_loss, float* loss) {
  using Reduce = cub::BlockReduce<float, block_threads>;
  __shared__ typename Reduce::TempStorage storage;
  float s = 0.0f;
  for (std::size_t r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
  const float total = Reduce(storage).Sum(s);
  if (threadIdx.x == 0) *loss = total / float(rows);
}

}  // namespace detail

/**
 * @brief Softmax cross-entropy and its gradient in one kernel: for each row of `logits` (row stride
 * `ld`, the first `vocab` columns real, `[vocab, ld)` padding),
 * `row_loss[r] = logsumexp(x_r) - x_r[t_r]`, `*loss = mean_r row_loss[r]` and, unless `dlogits` is null,
 * `dlogits[r, c] = grad_scale / rows * (softmax(x_r)[c] - [c == t_r])` for `c < vocab`, 0 on padding.
 *
 * `T` is float, bf16 or f16; the statistics, the loss and the gradient are computed in fp32 (the
 * gradient is rounded once, into T). `dlogits` may alias `logits` (the gradient replaces the logits, as
 * a training step that no longer needs them can afford). `row_loss` (length rows) is required scratch
 * and output; `row_lse` (length rows) optionally receives each row's log-sum-exp. A target outside
 * `[0, vocab)` makes its row's loss, and so `*loss`, NaN. Enqueued on `s` (the thread's compute stream
 * by default); never synchronises.
 */
template <class T>
void fused_classifier(std::size_t rows, std::size_t vocab, std::size_t ld, const T* logits, const std::int32_t* targets,
                      T* dlogits, float* row_loss, float* loss, float grad_scale = 1.0f, float* row_lse = nullptr,
                      cudaStream_t s = nullptr) {
  require(vocab >= 1 && ld >= vocab, "gpu::fused_classifier: ", rows, " rows of ", vocab,
          " vocabulary columns need a row "
          "stride ld >= vocab >= 1, got ld = ",
          ld, ". Fix: pass the padded width of the logits as ld");
  require(rows <= 0x7fffffffu, "gpu::fused_classifier: ", rows, " rows exceed one grid dimension (2^31 - 1)");
  s = detail::pick(s);
  if (!rows) {
    check(cudaMemsetAsync(loss, 0, sizeof(float), s), "cudaMemsetAsync(loss)");
    return;
  }
  MPAR_LAUNCH(detail::fused_classifier_kernel, unsigned(rows), detail::block_threads, 0, s, rows, vocab, ld, logits,
              targets, dlogits, row_loss, row_lse, grad_scale);
  check_launch("gpu::fused_classifier");
  MPAR_LAUNCH(detail::mean_rows_kernel<>, 1, detail::block_threads, 0, s, rows, row_loss, loss);
  check_launch("gpu::fused_classifier(mean)");
}

}  // namespace mpar::gpu
