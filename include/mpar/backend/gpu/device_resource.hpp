#pragma once
/**
 * @file Device memory as a MemoryResource, allocated and freed in stream order: where a CUDA rank's
 * tensors, parameters, gradients and optimizer states live (installed by `CudaBackend::init_rank`).
 *
 * Why not managed memory: the host must not touch rank memory between operations anyway (the
 * backend contract, backend/backend.hpp), and managed pages migrate on every host touch; on an
 * over-subscribed GPU managed memory can stall the device. Why stream-ordered: `cudaMallocAsync` /
 * `cudaFreeAsync` draw from the device's memory pool in the order of the rank's stream, so dropping a
 * temporary right after the kernel that uses it is safe and never waits for the device, and with the
 * pool's release threshold raised (`keep_pool_memory`) a training step reuses the previous step's
 * memory without calling the driver — no caching layer of our own is needed.
 */
#include "mpar/backend/gpu/runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::gpu {

/**
 * @brief `cudaMallocAsync` on the calling thread's compute stream; `cudaFreeAsync` on the stream the
 * block was allocated on, whichever thread frees it (once that stream is gone — its thread ended —
 * `cudaFree`). The host cannot read this memory: values reach it by `CudaBackend::copy_to_host_async`.
 * Thread-safe; one per process (`device_memory_resource()`).
 */
class DeviceMemoryResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    const std::shared_ptr<StreamToken>& token = this_thread().stream_token();
    void* p = nullptr;
    const cudaError_t st = cudaMallocAsync(&p, bytes ? bytes : 1, token->stream);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(mpar::detail::cat("cudaMallocAsync of ", bytes, " bytes on device ", this_thread().device(),
                                         " failed: ", cudaGetErrorString(st)));
    }
    std::lock_guard lock(m_);
    owners_[p] = token;
    return p;
  }
  // Freeing may run after the CUDA runtime shut down at exit: errors are ignored on purpose.
  void deallocate(void* p, std::size_t) noexcept override {
    if (p == nullptr) return;
    std::shared_ptr<StreamToken> owner;
    {
      std::lock_guard lock(m_);
      if (auto it = owners_.find(p); it != owners_.end()) {
        owner = std::move(it->second);
        owners_.erase(it);
      }
    }
    if (owner) {
      std::lock_guard lock(owner->m);
      if (owner->alive) {
        (void)cudaFreeAsync(p, owner->stream);
        return;
      }
    }
    (void)cudaFree(p);
  }
  [[nodiscard]] const char* name() const noexcept override { return "cuda-device"; }
  /** Uploads initial values on the calling thread's stream (after the allocation) and waits for them. */
  void write_initial(void* dst, const void* src, std::size_t bytes) override {
    const std::shared_ptr<StreamToken>& token = this_thread().stream_token();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, token->stream), "cudaMemcpyAsync (write_initial)");
    check(cudaStreamSynchronize(token->stream), "cudaStreamSynchronize (write_initial)");
  }

 private:
  std::mutex m_;
  std::unordered_map<void*, std::shared_ptr<StreamToken>> owners_;
};

/** @brief The process's device memory resource (shared by every CUDA rank). Never destroyed: buffers in static objects may be freed after it. */
[[nodiscard]] inline DeviceMemoryResource& device_memory_resource() {
  static auto* r = new DeviceMemoryResource;
  return *r;
}

/**
 * Raises the release threshold of `device`'s default memory pool to "never", so memory freed with
 * `cudaFreeAsync` stays in the pool for the next step instead of going back to the driver at every
 * synchronisation.
 */
inline void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  std::uint64_t threshold = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
        "cudaMemPoolSetAttribute(release threshold)");
}

}  // namespace mpar::gpu
