#pragma once
/**
 * @file CUDA managed (unified) memory as a MemoryResource: where a CUDA rank's tensors and
 * parameters live, so that device kernels and the host-side training code (communicators over host
 * memory, optimizers, checkpoints) read the same buffers without explicit copies.
 */
#include "mpar/backend/gpu/runtime.hpp"

#include <cstddef>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/core/caching_memory_resource.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::gpu {

/**
 * @brief `cudaMallocManaged` / `cudaFree`. Pages migrate to whichever processor touches them, so a
 * layer's activations stay on the GPU while only what the host reads (a loss, a gradient bucket)
 * moves. `cudaFree` waits for the device, which is why the CUDA backend's operations are synchronous.
 */
class ManagedMemoryResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t st = cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(mpar::detail::cat("cudaMallocManaged of ", bytes, " bytes failed: ", cudaGetErrorString(st)));
    }
    return p;
  }
  // Freeing may run after the CUDA runtime shut down at exit: the error is ignored on purpose.
  void deallocate(void* p, std::size_t) noexcept override { (void)cudaFree(p); }
  [[nodiscard]] const char* name() const noexcept override { return "cuda-managed"; }
};

/** @brief The process's managed-memory resource (stateless, shared by every CUDA rank). */
[[nodiscard]] inline ManagedMemoryResource& managed_memory_resource() {
  static ManagedMemoryResource r;
  return r;
}

/**
 * @brief What `CudaBackend::init_rank` installs: managed memory behind a CachingMemoryResource, so a
 * training step reuses the previous step's blocks instead of paying `cudaMallocManaged` and a
 * device-wide `cudaFree` for every activation. One per process, shared by the CUDA ranks (it locks).
 * Never destroyed: buffers in other static objects may be freed after it at exit.
 */
[[nodiscard]] inline CachingMemoryResource& cached_managed_memory_resource() {
  static auto* r = new CachingMemoryResource(managed_memory_resource());
  return *r;
}

}  // namespace mpar::gpu
