#pragma once
/**
 * @file The `gemm_backend` concept: a backend's matrix products (plain, mixed precision, strided batched).
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/buffer_ops.hpp"  // the host reference of gemm_strided_batched
#include "mpar/backend/types.hpp"            // Trans
#include "mpar/core/dtype.hpp"               // bf16

namespace mpar::detail {

/**
 * @brief The GEMM family of `backend`:
 * - `gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`: row-major C = alpha op(A) op(B) + beta C;
 * - `gemm<bf16, float>(...)` (same arguments): bf16 A and B, fp32 C, products accumulated in fp32 — the
 *   GEMM of mixed-precision training (host: oneDNN's AMX / AVX-512 bf16 kernels; CUDA: tensor cores);
 * - `gemm_strided_batched<T[, float]>(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
 *   ldc, stride_c, batch)`: `batch` row-major GEMMs whose operands are `stride_*` elements apart (fp32, or
 *   bf16/f16 A and B with an fp32 C), with the semantics of the `mpar::host` reference (backend/host/buffer_ops.hpp);
 * - the same with a two-level batch (`BatchStrides` per operand, `BatchExtents`): entry (i, j) of X at
 *   `x + i * stride_x.outer + j * stride_x.inner`, so attention's (sequence, head) pairs are one call.
 */
template <class B>
concept gemm_backend = requires(const float* a, float* c, const bf16* h, std::size_t n) {
  B::template gemm<float>(Trans::no, Trans::no, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n);
  B::template gemm<bf16, float>(Trans::no, Trans::yes, n, n, n, 1.0f, h, n, h, n, 1.0f, c, n);
  // The batched GEMM (backend/host/buffer_ops.hpp).
  B::template gemm_strided_batched<float>(Trans::no, Trans::yes, n, n, n, 1.0f, a, n, n, a, n, n, 0.0f, c, n, n, n);
  B::template gemm_strided_batched<bf16, float>(Trans::no, Trans::no, n, n, n, 1.0f, h, n, n, h, n, n, 1.0f, c, n, n,
                                                n);
  // The two-level batch.
  B::template gemm_strided_batched<float>(Trans::no, Trans::yes, n, n, n, 1.0f, a, n, BatchStrides{n, n}, a, n,
                                          BatchStrides{n, n}, 0.0f, c, n, BatchStrides{n, n}, BatchExtents{n, n});
  B::template gemm_strided_batched<bf16, float>(Trans::no, Trans::no, n, n, n, 1.0f, h, n, BatchStrides{n, n}, h, n,
                                                BatchStrides{n, n}, 1.0f, c, n, BatchStrides{n, n}, BatchExtents{n, n});
};

}  // namespace mpar::detail
