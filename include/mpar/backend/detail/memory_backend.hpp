#pragma once
/**
 * @file The `memory_backend` concept: a backend's rank memory and stream — its memory space, per-rank
 * set-up, synchronisation, the stream-ordered part, and the buffer operations on rank memory.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/detail/stream_ordered.hpp"
#include "mpar/backend/ops/buffer.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/core/dtype.hpp"            // bf16
#include "mpar/core/memory_resource.hpp"  // Buffer

namespace mpar::detail {

/**
 * @brief The rank-memory and stream family of `backend` (backend/backend.hpp has the ordering contract):
 * - `memory_space` (a tag with a `name`), `name`;
 * - `init_rank()`: prepares the calling rank's thread (BLAS threads, device, stream, memory resource);
 * - `synchronize()`: returns when every operation the thread issued has finished (and reports the
 *   first error one of them raised since the last wait);
 * - the stream-ordered part, `detail::stream_ordered<B>`: events, asynchronous copies to and from pinned host
 *   memory, uninitialised allocation;
 * - the buffer operations (operation objects, backend/ops/buffer.hpp), with the semantics of their host reference,
 *   so no host loop touches rank memory: `ops::zero`, `ops::fill`, `ops::copy` (no overlap), `ops::copy_2d` (a
 *   `rows x cols` block of one row-major matrix into another, leading dimensions of at least `cols`, else a
 *   config_error when the operation is issued), `ops::copy_2d_batched` (a two-level batch of such blocks, in one
 *   operation), `ops::convert` (fp32 to bf16/f16 rounding to nearest even, and back exactly), `ops::init_values` (a
 *   parameter block's counter-based initial values, core/init.hpp, bit for bit those of `init_value` on the host:
 *   a parameter is initialised where it lives, with no upload).
 */
template <class B>
concept memory_backend = detail::stream_ordered<B> && supports<B, ops::zero<float>> && supports<B, ops::fill<float>> &&
    supports<B, ops::copy<float>> && supports<B, ops::copy_2d<float>> && supports<B, ops::copy_2d_batched<float>> &&
    supports<B, ops::convert<float, bf16>> && supports<B, ops::convert<bf16, float>> &&
    supports<B, ops::init_values<float>> && requires {
  typename B::memory_space;
  B::init_rank();
  B::synchronize();
};

}  // namespace mpar::detail
