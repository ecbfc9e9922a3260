#pragma once
/**
 * @file `launch(op, stream)` for the GEMM operations (backend/ops/gemm.hpp): the device side CudaBackend::run
 * launches, cuBLAS(Lt) through gpu/gemm.hpp; fp32/fp64 as is, 16-bit A and B on tensor cores with fp32 accumulation.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/detail/gemm_types.hpp"
#include "mpar/backend/gpu/gemm.hpp"
#include "mpar/backend/gpu/layer_kernel_ops.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/gemm.hpp"

namespace mpar::gpu {

template <class In, class Out>
  requires detail::gemm_types<In, Out>
void launch(const ops::gemm<In, Out>& op, cudaStream_t s = nullptr) {
  gemm<In, Out>(op.ta, op.tb, op.m, op.n, op.k, op.alpha, op.a, op.lda, op.b, op.ldb, op.beta, op.c, op.ldc, s);
}

/**
 * The two-level batch (attention's sequences x heads): cublasGemmStridedBatchedEx takes one batch stride, so it
 * covers the larger level in one call per entry of the smaller (min(outer, inner) launches, stream-ordered).
 */
template <class In, class Out>
  requires detail::gemm_types<In, Out>
void launch(const ops::gemm_strided_batched<In, Out>& op, cudaStream_t s = nullptr) {
  const BatchExtents batch = op.batch;
  const bool over_inner = batch.inner >= batch.outer;
  const std::size_t loops = over_inner ? batch.outer : batch.inner, count = over_inner ? batch.inner : batch.outer;
  const auto by_level = [&](BatchStrides x) { return over_inner ? x : BatchStrides{x.inner, x.outer}; };
  const BatchStrides sa = by_level(op.stride_a), sb = by_level(op.stride_b), sc = by_level(op.stride_c);
  for (std::size_t o = 0; o < loops; ++o)
    gemm_strided_batched<In, Out>(op.ta, op.tb, op.m, op.n, op.k, op.alpha, op.a + o * sa.outer, op.lda,
                                  std::int64_t(sa.inner), op.b + o * sb.outer, op.ldb, std::int64_t(sb.inner), op.beta,
                                  op.c + o * sc.outer, op.ldc, std::int64_t(sc.inner), count, s);
}

/** The MLP's first projection composed on one stream: cuBLAS's GEMM into `pre`, the bias kernel, the GeLU kernel. */
template <class In>
  requires detail::gemm_types<In, float>
void launch(const ops::gemm_bias_gelu<In>& op, cudaStream_t s = nullptr) {
  if (op.m == 0 || op.n == 0) return;
  gemm<In, float>(Trans::no, Trans::no, op.m, op.n, op.k, 1.0f, op.a, op.lda, op.w, op.ldw, 0.0f, op.pre, op.n, s);
  launch(ops::bias_add_forward{.rows = op.m, .cols = op.n, .bias = op.bias, .y = op.pre}, s);
  launch(ops::gelu_forward{.n = op.m * op.n, .x = op.pre, .y = op.y}, s);
}

}  // namespace mpar::gpu
