#pragma once
/**
 * @file The `backend` concept: what the layers need from a compute backend (HostBackend,
 * CudaBackend). Layers, stages and trainers are templates over a backend type and call these static
 * functions directly, so the choice of backend costs no run-time dispatch. The operations come in
 * families, each a concept in its own header, so that code can require only the family it calls:
 * `memory_backend` (rank memory, stream, buffer operations), `gemm_backend`, `layer_kernel_backend` and
 * `optimizer_backend`; `backend` is their conjunction plus the operations that span families (the fused GEMM
 * epilogue). Optional families that only some layers use (MoE token routing, the Llama-class kernels) are operation
 * objects (backend/ops/) that those layers require by themselves.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/detail/gemm_backend.hpp"
#include "mpar/backend/detail/layer_kernel_backend.hpp"
#include "mpar/backend/detail/memory_backend.hpp"
#include "mpar/backend/detail/optimizer_backend.hpp"
#include "mpar/backend/detail/stream_ordered.hpp"
#include "mpar/backend/ops/accumulate.hpp"
#include "mpar/backend/ops/gemm.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/types.hpp"  // Trans, host::DropoutMask (the same on every backend)
#include "mpar/core/dtype.hpp"     // bf16

namespace mpar {

/**
 * @brief A compute backend: every family (pointers are row-major `[rows, cols]` arrays in memory of the
 * rank's memory resource, which the backend installs in `init_rank()`):
 * - `detail::memory_backend<B>` (backend/memory_backend.hpp): memory space, `init_rank()`, `synchronize()`, the
 *   stream-ordered part (`detail::stream_ordered<B>`, backend/stream_ordered.hpp), the buffer operations;
 * - `detail::gemm_backend<B>` (backend/gemm_backend.hpp): `ops::gemm` in fp32 and mixed precision,
 *   `ops::gemm_strided_batched`;
 * - `detail::layer_kernel_backend<B>` (backend/layer_kernel_backend.hpp): the layers' elementwise and row kernels;
 * - `detail::optimizer_backend<B>` (backend/optimizer_backend.hpp): AdamW, SGD, the gradient norm and step factors;
 * - and, spanning the GEMM and layer families, the fused GEMM epilogue `ops::gemm_bias_gelu<float>` and `<bf16>`
 *   (backend/ops/gemm.hpp): `pre = a w + bias`, `y = gelu(pre)`, the MLP's first projection, keeping the
 *   pre-activation for GeLU's backward;
 * - `run(ops::accumulate{n, x, scale, acc})` (`supports<B, ops::accumulate>`; backend/ops/accumulate.hpp):
 *   `*acc += scale * sum x[i]` into a double of rank memory, each micro-batch's loss added to the step's
 *   statistics, which reach the host once per step.
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
template <class B>
concept backend = detail::memory_backend<B> && detail::gemm_backend<B> && detail::layer_kernel_backend<B> &&
    detail::optimizer_backend<B> && supports<B, ops::accumulate> && supports<B, ops::gemm_bias_gelu<float>> &&
    supports<B, ops::gemm_bias_gelu<bf16>>;

}  // namespace mpar
