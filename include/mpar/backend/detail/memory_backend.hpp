#pragma once
/**
 * @file The `memory_backend` concept: a backend's rank memory and stream — its memory space, per-rank
 * set-up, synchronisation, the stream-ordered part, and the buffer operations on rank memory.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/detail/stream_ordered.hpp"
#include "mpar/backend/host/buffer_ops.hpp"  // the host reference of zero, fill, copy, convert
#include "mpar/core/dtype.hpp"               // bf16
#include "mpar/core/init.hpp"                // InitBlock
#include "mpar/core/memory_resource.hpp"     // Buffer

namespace mpar::detail {

/**
 * @brief The rank-memory and stream family of `backend` (backend/backend.hpp has the ordering contract):
 * - `memory_space` (a tag with a `name`), `name`;
 * - `init_rank()`: prepares the calling rank's thread (BLAS threads, device, stream, memory resource);
 * - `synchronize()`: returns when every operation the thread issued has finished (and reports the
 *   first error one of them raised since the last wait);
 * - the stream-ordered part, `detail::stream_ordered<B>`: events, asynchronous copies to and from pinned host
 *   memory, uninitialised allocation;
 * - the buffer operations, with the semantics of their `mpar::host` reference (backend/host/buffer_ops.hpp),
 *   so no host loop touches rank memory: `zero(n, x)`, `fill(n, value, x)`, `copy(n, src, dst)` (no
 *   overlap), `copy_2d(rows, cols, src, src_ld, dst, dst_ld)` (a `rows x cols` block of one row-major matrix
 *   into another in one operation — `dst[r * dst_ld + c] = src[r * src_ld + c]` — with leading dimensions of
 *   at least `cols`, else a config_error when the call is issued; the blocks must not overlap; no rows or
 *   no columns copy nothing), `copy_2d_batched(rows, cols, src, src_ld, src_stride, dst, dst_ld, dst_stride, batch)`
 *   (a two-level batch of such blocks, `BatchStrides` / `BatchExtents` as in `gemm_strided_batched`, in one
 *   operation), `convert(n, src, dst)` (fp32 to bf16/f16 rounding to nearest even, and back exactly),
 *   `init_values(block, x)` (a parameter block's counter-based initial values, core/init.hpp, bit for bit
 *   those of `init_value` on the host: a parameter is initialised where it lives, with no upload).
 */
template <class B>
concept memory_backend = requires(const float* a, float* c, const bf16* h, std::size_t n, bf16* hw,
                                  const InitBlock& block) {
  typename B::memory_space;
  B::init_rank();
  B::synchronize();
  // Stream-ordered execution: events, asynchronous copies, uninitialised allocation.
  requires detail::stream_ordered<B>;
  // The buffer operations (backend/host/buffer_ops.hpp).
  B::zero(n, c);
  B::fill(n, 1.0f, c);
  B::copy(n, a, c);
  B::copy_2d(n, n, a, n, c, n);
  B::copy_2d_batched(n, n, a, n, BatchStrides{n, n}, c, n, BatchStrides{n, n}, BatchExtents{n, n});
  B::convert(n, a, hw);
  B::convert(n, h, c);
  B::init_values(block, c);
};

}  // namespace mpar::detail
