#pragma once
/**
 * @file The `backend` concept: what the layers need from a compute backend (HostBackend,
 * CudaBackend). Layers, stages and trainers are templates over a backend type and call these static
 * functions directly, so the choice of backend costs no run-time dispatch.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/gemm.hpp"     // Trans
#include "mpar/core/dtype.hpp"             // bf16
#include "mpar/backend/host/kernels.hpp"  // host::DropoutMask (the mask is the same on every backend)
#include "mpar/backend/host/buffer_ops.hpp"  // the host reference of zero, fill, copy, convert, gemm_strided_batched

namespace mpar {

/**
 * @brief A compute backend. Requirements (all static; pointers are row-major `[rows, cols]` arrays in
 * memory of the rank's memory resource, which the backend installs in `init_rank()`):
 * - `memory_space` (a tag with a `name`), `tensor_type<T, R>` (its own tensor type), `name`;
 * - `init_rank()`: prepares the calling rank's thread (BLAS threads, device, stream, memory resource);
 * - `synchronize()`: returns when every operation the thread issued has finished;
 * - `gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`: row-major C = alpha op(A) op(B) + beta C;
 * - `gemm<bf16, float>(...)` (same arguments): bf16 A and B, fp32 C, products accumulated in fp32 — the
 *   GEMM of mixed-precision training (host: oneDNN's AMX / AVX-512 bf16 kernels; CUDA: tensor cores);
 * - the layer kernels, with the semantics of `mpar::host` (backend/host/kernels.hpp), which is their
 *   reference: `add`, `bias_add_forward`, `bias_add_backward` (accumulates), `gelu_forward`,
 *   `gelu_backward`, `softmax_forward` (optionally causal), `softmax_backward`, `layernorm_forward`,
 *   `layernorm_backward` (accumulates dgamma/dbeta), `dropout_apply`, `embedding_forward`,
 *   `embedding_backward` (accumulates), `vocab_parallel_max`, `vocab_parallel_sumexp`,
 *   `vocab_parallel_backward`;
 * - the optimizer kernels, fp32 over `n` elements, with the semantics of their `mpar::host`
 *   reference (backend/host/optimizer_kernels.hpp), so an optimizer runs where its weights live:
 *   - `adamw_update(n, w, g, m, v, beta1, beta2, eps, lr, weight_decay, bias_correction1,
 *     bias_correction2, grad_scale)`: one AdamW step on weights `w` with moments `m`, `v`, in the
 *     direct textbook form (bias corrections `1 - beta^t` given by the caller);
 *   - `sgd_update(n, w, g, buf, momentum, dampening, nesterov, lr, weight_decay, first, grad_scale)`:
 *     one SGD step with L2 decay and momentum buffer `buf` (null when `momentum == 0`);
 *   - `sum_squares(n, x) -> double`: the sum of `x[i]^2` (the host accumulates in double; a device
 *     may accumulate in float), the local part of the global gradient norm;
 *   - `scale(n, factor, x)`: `x[i] *= factor` in place (argument order of `host::scale`);
 * - the row kernels that route tokens (MoE dispatch and combine), with the semantics of their
 *   `mpar::host` reference (backend/host/row_kernels.hpp); `index` is `std::int32_t` in rank memory:
 *   `gather_rows(rows, d, index, src, dst)`, `scatter_rows(rows, d, index, src, dst)`,
 *   `scatter_add_rows(rows, d, index, weight, src, dst)` (accumulates; `weight` may be null) and its
 *   backward `scatter_add_rows_backward(rows, d, index, weight, dy, src, dsrc, dot)`.
 * - the buffer operations and the batched GEMM, with the semantics of their `mpar::host` reference
 *   (backend/host/buffer_ops.hpp), so no host loop touches rank memory: `zero(n, x)`, `fill(n, value, x)`,
 *   `copy(n, src, dst)` (no overlap), `convert(n, src, dst)` (fp32 to bf16/f16 rounding to nearest even, and
 *   back exactly), and `gemm_strided_batched<T[, float]>(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb,
 *   stride_b, beta, c, ldc, stride_c, batch)`: `batch` row-major GEMMs whose operands are `stride_*`
 *   elements apart (fp32, or bf16/f16 A and B with an fp32 C); `vocab_parallel_loss(rows, row_max, sumexp,
 *   target_logit, loss)`: the mean cross-entropy from the statistics, into one float of rank memory;
 * Each operation returns with its result in memory that host code may read (a backend with
 * asynchronous devices synchronises), because the code around the layers and the optimizers —
 * communicators, the loss scaler, checkpoints — reads the same buffers on the host.
 */
template <class B>
concept backend = requires(const float* a, float* c, const bf16* h, bf16* hw, const std::int32_t* ids,
                           const host::DropoutMask& mask, std::size_t n) {
  typename B::memory_space;
  typename B::template tensor_type<float, 2>;
  B::init_rank();
  B::synchronize();
  B::template gemm<float>(Trans::no, Trans::no, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n);
  B::template gemm<bf16, float>(Trans::no, Trans::yes, n, n, n, 1.0f, h, n, h, n, 1.0f, c, n);
  B::add(n, a, a, c);
  B::bias_add_forward(n, n, a, c);
  B::bias_add_backward(n, n, a, c);
  B::gelu_forward(n, a, c);
  B::gelu_backward(n, a, a, c);
  B::softmax_forward(n, n, a, c, true);
  B::softmax_backward(n, n, a, a, c);
  B::layernorm_forward(n, n, a, a, a, c, c, c);
  B::layernorm_backward(n, n, a, a, a, a, a, c, c, c);
  B::dropout_apply(mask, n, n, a, c);
  B::embedding_forward(n, n, ids, a, c, n, n);
  B::embedding_backward(n, n, ids, a, c, n, n);
  B::vocab_parallel_max(n, n, a, c);
  B::vocab_parallel_sumexp(n, n, n, a, ids, a, c, c);
  B::vocab_parallel_backward(n, n, n, a, ids, a, a, c, 1.0f);
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 1e-3f, 0.01f, 0.1f, 0.001f, 1.0f);
  B::sgd_update(n, c, a, c, 0.9f, 0.0f, false, 1e-2f, 0.0f, true, 1.0f);
  { B::sum_squares(n, a) } -> std::same_as<double>;
  B::scale(n, 1.0f, c);
  B::gather_rows(n, n, ids, a, c);
  B::scatter_rows(n, n, ids, a, c);
  B::scatter_add_rows(n, n, ids, a, a, c);
  B::scatter_add_rows_backward(n, n, ids, a, a, a, c, c);
  // The buffer operations and the batched GEMM (backend/host/buffer_ops.hpp).
  B::zero(n, c);
  B::fill(n, 1.0f, c);
  B::copy(n, a, c);
  B::convert(n, a, hw);
  B::convert(n, h, c);
  B::template gemm_strided_batched<float>(Trans::no, Trans::yes, n, n, n, 1.0f, a, n, n, a, n, n, 0.0f, c, n, n, n);
  B::template gemm_strided_batched<bf16, float>(Trans::no, Trans::no, n, n, n, 1.0f, h, n, n, h, n, n, 1.0f, c, n, n, n);
  B::vocab_parallel_loss(n, a, a, a, c);
};

}  // namespace mpar
