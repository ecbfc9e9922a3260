#pragma once
/**
 * @file Host reference of the buffer operations of the `backend` concept — `zero`, `fill`, `copy`,
 * `copy_2d`, `convert`, `init_values` — of the strided-batched GEMM, and of the cross-entropy's loss reduction.
 *
 * Why they are backend operations: on a device backend the buffers live in device memory, so zeroing a
 * gradient, keeping a copy of an activation or rounding fp32 weights to bf16 must be kernels on the
 * rank's stream, not host loops over the same memory (each a page migration or a stall). A parameter's initial
 * values likewise: the counter-based init is a pure function of (seed, parameter, element), so the rank's
 * backend evaluates it where the block lives instead of the host computing and uploading it.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "mpar/backend/copy_2d_shape.hpp"
#include "mpar/backend/host/bf16_convert.hpp"
#include "mpar/backend/host/gemm.hpp"
#include "mpar/backend/types.hpp"  // Trans, BatchStrides, BatchExtents
#include "mpar/core/dtype.hpp"
#include "mpar/core/init.hpp"  // InitBlock

namespace mpar::host {

/** x[i] = 0 for i < n. */
template <class T>
void zero(std::size_t n, T* x) {
  static_assert(std::is_trivially_copyable_v<T>, "host::zero: T must be trivially copyable (all-zero bytes is zero)");
  if (n) std::memset(static_cast<void*>(x), 0, n * sizeof(T));
}
/** x[i] = value for i < n. */
template <class T>
void fill(std::size_t n, T value, T* x) {
  std::fill(x, x + n, value);
}
/** dst[i] = src[i] for i < n; the ranges must not overlap. */
template <class T>
void copy(std::size_t n, const T* src, T* dst) {
  if (n) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), n * sizeof(T));
}
/**
 * dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols: a `rows x cols` block of one row-major
 * matrix into another (leading dimensions in elements, each at least `cols`: a config_error otherwise). The
 * two blocks must not overlap; `rows == 0` or `cols == 0` copies nothing. Packed blocks are one memcpy.
 */
template <class T>
void copy_2d(std::size_t rows, std::size_t cols, const T* src, std::size_t src_ld, T* dst, std::size_t dst_ld) {
  mpar::detail::require_copy_2d_shape("HostBackend", rows, cols, src_ld, dst_ld);
  if (rows == 0 || cols == 0) return;
  if (src_ld == cols && dst_ld == cols) return copy(rows * cols, src, dst);
  for (std::size_t r = 0; r < rows; ++r) copy(cols, src + r * src_ld, dst + r * dst_ld);
}
/**
 * A two-level batch of `copy_2d` blocks in one operation: for i < batch.outer, j < batch.inner, the
 * `rows x cols` block at `src + i * src_stride.outer + j * src_stride.inner` (leading dimension `src_ld`) into
 * the one at `dst + i * dst_stride.outer + j * dst_stride.inner` (`dst_ld`). No two destination blocks may
 * overlap, nor any with a source block. Rearranges a matrix's column blocks into separate dense blocks (or
 * back) in one call: e.g. the heads of a `[tokens, heads * head_dim]` matrix into `[batch, heads, seq,
 * head_dim]`.
 */
template <class T>
void copy_2d_batched(std::size_t rows, std::size_t cols, const T* src, std::size_t src_ld, BatchStrides src_stride,
                     T* dst, std::size_t dst_ld, BatchStrides dst_stride, BatchExtents batch) {
  mpar::detail::require_copy_2d_shape("HostBackend", rows, cols, src_ld, dst_ld);
  for (std::size_t i = 0; i < batch.outer; ++i)
    for (std::size_t j = 0; j < batch.inner; ++j)
      copy_2d(rows, cols, src + i * src_stride.outer + j * src_stride.inner, src_ld,
              dst + i * dst_stride.outer + j * dst_stride.inner, dst_ld);
}
/**
 * dst[i] = To(src[i]): fp32 to bf16/f16 rounds to nearest even, 16-bit to fp32 is exact. fp32 <-> bf16, the
 * mixed-precision step's conversions, run vectorized (bf16_convert.hpp) with the same bits.
 */
template <class From, class To>
void convert(std::size_t n, const From* src, To* dst) {
  if constexpr (std::is_same_v<From, float> && std::is_same_v<To, bf16>)
    convert_to_bf16(n, src, dst);
  else if constexpr (std::is_same_v<From, bf16> && std::is_same_v<To, float>)
    convert_from_bf16(n, src, dst);
  else
    for (std::size_t i = 0; i < n; ++i) dst[i] = mpar::convert<To>(src[i]);
}

/** x[k] = T(block.value(k)) for k < block.size(): a parameter block's initial values (core/init.hpp). */
template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
void init_values(const InitBlock& block, T* x) {
  const std::uint64_t n = block.size();
  for (std::uint64_t k = 0; k < n; ++k) x[k] = T(block.value(k));
}

/**
 * A two-level batch of row-major GEMMs, `C_ij = alpha op(A_ij) op(B_ij) + beta C_ij` for i < batch.outer,
 * j < batch.inner, with `A_ij = a + i * stride_a.outer + j * stride_a.inner` (and so on for B, C; strides in
 * elements): every (sequence, head) pair of an attention product in one call. With oneDNN the whole batch is
 * one matmul execution (a 4-D primitive, created once per shape and strides); otherwise (CBLAS, double,
 * 16-bit operands without a oneDNN kernel) the host runs the GEMMs one after another through `mpar::gemm`.
 */
template <class TIn, class TOut = TIn>
  requires mpar::detail::host_gemm_types<TIn, TOut>
void gemm_strided_batched(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, TOut alpha, const TIn* a,
                          std::size_t lda, BatchStrides stride_a, const TIn* b, std::size_t ldb, BatchStrides stride_b,
                          TOut beta, TOut* c, std::size_t ldc, BatchStrides stride_c, BatchExtents batch) {
  if (m == 0 || n == 0 || batch.outer == 0 || batch.inner == 0) return;
#if defined(MPAR_HAVE_ONEDNN)
  // One entry is a plain GEMM (whose 2-D primitive may pick a faster kernel); an empty k is C = beta C there.
  if constexpr (std::is_same_v<TOut, float>)
    if (k > 0 && batch.outer * batch.inner > 1) {
      mpar::detail::require_leading_dims(ta, tb, m, n, k, lda, ldb, ldc);
      if (onednn::gemm_batched<TIn>(ta == Trans::yes, tb == Trans::yes, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                    stride_b, beta, c, ldc, stride_c, batch))
        return;
    }
#endif
  for (std::size_t i = 0; i < batch.outer; ++i)
    for (std::size_t j = 0; j < batch.inner; ++j)
      mpar::gemm<TIn, TOut>(ta, tb, m, n, k, alpha, a + i * stride_a.outer + j * stride_a.inner, lda,
                            b + i * stride_b.outer + j * stride_b.inner, ldb, beta,
                            c + i * stride_c.outer + j * stride_c.inner, ldc);
}

/**
 * `batch` row-major GEMMs `C_i = alpha op(A_i) op(B_i) + beta C_i` with `A_i = a + i * stride_a` (and so on
 * for B, C; strides in elements): the two-level batch above with one level.
 */
template <class TIn, class TOut = TIn>
  requires mpar::detail::host_gemm_types<TIn, TOut>
void gemm_strided_batched(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, TOut alpha, const TIn* a,
                          std::size_t lda, std::size_t stride_a, const TIn* b, std::size_t ldb, std::size_t stride_b,
                          TOut beta, TOut* c, std::size_t ldc, std::size_t stride_c, std::size_t batch) {
  gemm_strided_batched<TIn, TOut>(ta, tb, m, n, k, alpha, a, lda, BatchStrides{0, stride_a}, b, ldb,
                                  BatchStrides{0, stride_b}, beta, c, ldc, BatchStrides{0, stride_c},
                                  BatchExtents{1, batch});
}

/**
 * `*loss` = the mean over rows of log(sumexp[r]) + row_max[r] - target_logit[r]: the cross-entropy from the
 * (all-reduced) statistics of `vocab_parallel_max` / `vocab_parallel_sumexp`, into rank memory, so the host
 * reads one number instead of three per token. Summed in double.
 */
inline void vocab_parallel_loss(std::size_t rows, const float* row_max, const float* sumexp, const float* target_logit,
                                float* loss) {
  double s = 0;
  for (std::size_t r = 0; r < rows; ++r) s += double(std::log(sumexp[r]) + row_max[r] - target_logit[r]);
  *loss = rows ? float(s / double(rows)) : 0.0f;
}

}  // namespace mpar::host
