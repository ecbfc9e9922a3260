#pragma once
/**
 * @file The `gemm_backend` concept: a backend's matrix products (plain, mixed precision, strided batched; operation
 * objects in backend/ops/gemm.hpp).
 */
#include "mpar/backend/ops/gemm.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/core/dtype.hpp"  // bf16

namespace mpar::detail {

/**
 * @brief The GEMM family of `backend`, with the semantics of their host reference (backend/ops/gemm.hpp):
 * - `ops::gemm<float>`: row-major C = alpha op(A) op(B) + beta C;
 * - `ops::gemm<bf16, float>`: bf16 A and B, fp32 C, products accumulated in fp32 — the GEMM of mixed-precision
 *   training (host: oneDNN's AMX / AVX-512 bf16 kernels; CUDA: tensor cores);
 * - `ops::gemm_strided_batched<float>` and `<bf16, float>`: a two-level batch of such products (`BatchStrides` per
 *   operand, `BatchExtents`), so attention's (sequence, head) pairs are one operation.
 */
template <class B>
concept gemm_backend = supports<B, ops::gemm<float>> && supports<B, ops::gemm<bf16, float>> &&
    supports<B, ops::gemm_strided_batched<float>> && supports<B, ops::gemm_strided_batched<bf16, float>>;

}  // namespace mpar::detail
