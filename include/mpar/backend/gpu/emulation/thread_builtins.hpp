#pragma once
/**
 * @file A kernel thread's built-ins under the emulation: `threadIdx`, `blockIdx`, `blockDim`, `gridDim`,
 * `__syncthreads()` and the block's dynamic shared memory, each answered by the fiber that runs the thread
 * (emulation/simt.hpp). Read outside a kernel they throw instead of returning garbage.
 */
#include <source_location>

#include "mpar/backend/gpu/emulation/simt.hpp"

#define threadIdx (::mpar::gpu::emulation::Executor::here().fiber("threadIdx").thread_idx)
#define blockIdx (::mpar::gpu::emulation::Executor::here().block_idx())
#define blockDim (::mpar::gpu::emulation::Executor::here().block_dim())
#define gridDim (::mpar::gpu::emulation::Executor::here().grid_dim())

/** The block barrier; where it is called from tells apart barriers that divergent threads reach. */
inline void __syncthreads(const std::source_location& at = std::source_location::current()) {
  ::mpar::gpu::emulation::Executor::here().syncthreads(at);
}

namespace mpar::gpu::emulation {
/** The running block's `extern __shared__` bytes (MPAR_DYNAMIC_SHARED), filled with 0xFF as each block starts. */
[[nodiscard]] inline void* dynamic_shared_memory() { return Executor::here().dynamic_shared_memory(); }
}  // namespace mpar::gpu::emulation
