#pragma once
/**
 * @file The `backend` concept: what the layers need from a compute backend (HostBackend,
 * CudaBackend). Layers, stages and trainers are templates over a backend type and call these static
 * functions directly, so the choice of backend costs no run-time dispatch.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/types.hpp"  // Trans, host::DropoutMask (the same on every backend)
#include "mpar/core/dtype.hpp"             // bf16
#include "mpar/backend/host/optimizer_kernels.hpp"  // UpdateFactors (the optimizer kernels' per-step inputs)
#include "mpar/core/memory_resource.hpp"  // Buffer (allocate)
#include "mpar/backend/host/buffer_ops.hpp"  // the host reference of zero, fill, copy, convert, gemm_strided_batched
#include "mpar/backend/host/gemm_bias_gelu.hpp"  // the host reference of gemm_bias_gelu
#include "mpar/backend/host/accumulate.hpp"  // the host reference of accumulate

namespace mpar {

/**
 * @brief A compute backend. Requirements (all static; pointers are row-major `[rows, cols]` arrays in
 * memory of the rank's memory resource, which the backend installs in `init_rank()`):
 * - `memory_space` (a tag with a `name`), `tensor_type<T, R>` (its own tensor type), `name`;
 * - `init_rank()`: prepares the calling rank's thread (BLAS threads, device, stream, memory resource);
 * - `synchronize()`: returns when every operation the thread issued has finished (and reports the
 *   first error one of them raised since the last wait);
 * - the stream-ordered part, `stream_ordered<B>`: events, asynchronous copies to and from pinned host
 *   memory, uninitialised allocation;
 * - `gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`: row-major C = alpha op(A) op(B) + beta C;
 * - `gemm<bf16, float>(...)` (same arguments): bf16 A and B, fp32 C, products accumulated in fp32 — the
 *   GEMM of mixed-precision training (host: oneDNN's AMX / AVX-512 bf16 kernels; CUDA: tensor cores);
 * - the layer kernels, with the semantics of `mpar::host` (backend/host/kernels.hpp), which is their
 *   reference: `add`, `bias_add_forward`, `bias_add_backward` (accumulates), `gelu_forward`,
 *   `gelu_backward`, `softmax_forward` (optionally causal), `softmax_backward`, `layernorm_forward`,
 *   `layernorm_backward` (accumulates dgamma/dbeta), `dropout_apply`, `embedding_forward`,
 *   `embedding_backward` (accumulates), `vocab_parallel_max`, `vocab_parallel_sumexp`,
 *   `vocab_parallel_backward`;
 * - the fused GEMM epilogue `gemm_bias_gelu(m, n, k, a, lda, w, ldw, bias, pre, y)` (fp32, or bf16/f16
 *   `a` and `w` with fp32 accumulation): `pre = a w + bias`, `y = gelu(pre)`, with the semantics of
 *   `mpar::host::gemm_bias_gelu` (backend/host/gemm_bias_gelu.hpp): the MLP's first projection, keeping
 *   the pre-activation for GeLU's backward;
 * - the optimizer kernels, fp32 over `n` elements, with the semantics of their `mpar::host`
 *   reference (backend/host/optimizer_kernels.hpp), so an optimizer runs where its weights live:
 *   - `adamw_update(n, w, g, m, v, beta1, beta2, eps, lr, weight_decay, bias_correction1,
 *     bias_correction2, factors)`: one AdamW step on weights `w` with moments `m`, `v`, in the
 *     direct textbook form (bias corrections `1 - beta^t` given by the caller); the gradient scale
 *     and the skip flag are read from `factors` (an `UpdateFactors` in rank memory), so clipping
 *     and the f16 overflow skip need no host read;
 *   - `sgd_update(n, w, g, buf, momentum, dampening, nesterov, lr, weight_decay, first, factors)`:
 *     one SGD step with L2 decay and momentum buffer `buf` (null when `momentum == 0`), `factors`
 *     as for `adamw_update`;
 *   - `sum_squares(n, x, acc)`: `*acc += sum x[i]^2` into a double in rank memory (the host
 *     accumulates in double; a device may sum a block in float), the local part of the global
 *     gradient norm;
 *   - `update_factors(squares, max_norm, inv_loss_scale, skip_nonfinite, norm, factors)`: from the
 *     reduced sum of squares (rank memory), the gradient norm and the `UpdateFactors` of the step
 *     (clipping coefficient times the inverse loss scale; skip on a non-finite norm);
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
 * - `accumulate(n, x, scale, acc)`: `*acc += scale * sum x[i]` into a double of rank memory, with the
 *   semantics of `mpar::host::accumulate` (backend/host/accumulate.hpp): each micro-batch's loss added to
 *   the step's statistics, which reach the host once per step;
 * Operations are ordered on the calling rank's stream and return at once: an operation runs after
 * every operation the rank issued before it and before every one issued after it, but not
 * necessarily before the call returns. Host code reads or writes rank memory only after an explicit
 * wait: `synchronize()`, or `wait_event(e)` for an event recorded after the producing operation (see
 * `stream_ordered`); the sanctioned way to bring values to the host is `copy_to_host_async` into a
 * pinned buffer followed by such a wait. Arguments are captured when the operation is issued
 * (pointers and sizes by value): the memory they point to must stay allocated until the stream has
 * passed the operation (rank memory freed by its `Buffer` is released in stream order, so dropping a
 * tensor right after issuing an operation on it is safe). No operation returns a value to the host
 * (reductions such as `sum_squares` write rank memory). An error raised by an operation is reported by the next
 * `synchronize()` or event wait of the rank, naming the operation.
 * `HostBackend` runs each operation before it returns, which satisfies this contract trivially;
 * `StreamHostBackend` (backend/stream/) runs them on a worker thread per rank to prove that code
 * keeps it, and `DiscreteHostBackend` also makes every host access to rank memory fault.
 */
/**
 * @brief The stream-ordered part of a backend (see `backend` for the contract it serves):
 * - `event_type`: a marker in the rank's stream, default-constructible; `record_event(e)` places it
 *   after every operation issued so far; `wait_event(e)` blocks the host until the stream has passed
 *   it (and reports a pending error of the stream); `stream_wait_event(e)` makes the calling rank's
 *   stream wait for `e` (possibly recorded by another rank or stream) without blocking the host;
 *   `event_done(e)` says whether the stream has passed it, without blocking;
 * - `pinned_buffer<T>`: host memory the asynchronous copies may target (page-locked on a GPU),
 *   constructed from an element count, with `data()` and `size()`;
 * - `copy_to_host_async(n, src, dst)`: `n` elements from rank memory `src` to host memory `dst`,
 *   ordered on the stream; `dst` may be read after a wait for a later event;
 *   `copy_from_host_async(n, src, dst)`: host memory `src` to rank memory `dst`; `src` must not
 *   change until the stream has passed the copy;
 * - `allocate<T>(n) -> Buffer<T>`: `n` elements of rank memory that nobody initialises (the host
 *   does not touch them; an operation must write them before any reads them).
 */
template <class B>
concept stream_ordered = requires(typename B::event_type& e, const float* src, float* dst, std::size_t n) {
  requires std::default_initializable<typename B::event_type>;
  B::record_event(e);
  B::wait_event(e);
  B::stream_wait_event(e);
  { B::event_done(e) } -> std::convertible_to<bool>;
  { typename B::template pinned_buffer<float>(n).data() } -> std::same_as<float*>;
  { typename B::template pinned_buffer<float>(n).size() } -> std::convertible_to<std::size_t>;
  B::template copy_to_host_async<float>(n, src, dst);
  B::template copy_from_host_async<float>(n, src, dst);
  { B::template allocate<float>(n) } -> std::same_as<Buffer<float>>;
};

template <class B>
concept backend = requires(const float* a, float* c, const bf16* h, const std::int32_t* ids,
                           const host::DropoutMask& mask, std::size_t n, double* acc, UpdateFactors* factors,
                           bf16* hw) {
  typename B::memory_space;
  typename B::template tensor_type<float, 2>;
  B::init_rank();
  B::synchronize();
  // Stream-ordered execution: events, asynchronous copies, uninitialised allocation.
  requires stream_ordered<B>;
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
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 1e-3f, 0.01f, 0.1f, 0.001f, static_cast<const UpdateFactors*>(factors));
  B::sgd_update(n, c, a, c, 0.9f, 0.0f, false, 1e-2f, 0.0f, true, static_cast<const UpdateFactors*>(factors));
  B::sum_squares(n, a, acc);
  B::update_factors(static_cast<const double*>(acc), 1.0, 1.0f, true, acc, factors);
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
  // The fused GEMM epilogue of the MLP's first projection (backend/host/gemm_bias_gelu.hpp).
  B::gemm_bias_gelu(n, n, n, a, n, a, n, a, c, c);
  B::gemm_bias_gelu(n, n, n, h, n, h, n, a, c, c);
  // The per-step statistics in rank memory (backend/host/accumulate.hpp).
  B::accumulate(n, a, 1.0, acc);
};

}  // namespace mpar
