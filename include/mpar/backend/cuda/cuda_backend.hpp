#pragma once
/** @file The CUDA backend policy type: the device twin of HostBackend. */
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mpar/backend/cuda/context.hpp"
#include "mpar/backend/cuda/device_tensor.hpp"
#include "mpar/backend/cuda/gemm.hpp"
#include "mpar/backend/host/host_backend.hpp"  // the backend concept

namespace mpar {

/** @brief Memory-space tag: global memory of the calling thread's CUDA device. */
struct CudaMemory {
  static constexpr const char* name = "cuda";
};

/**
 * @brief The CUDA backend: device memory, cuBLAS/cuBLASLt GEMM and the kernels of
 * `mpar/backend/cuda/kernels.hpp`, all on the calling thread's compute stream.
 *
 * Stateless like HostBackend: the per-rank state (device, stream, cuBLAS handles) is thread-local
 * (`gpu::this_thread()`), so N ranks as N threads, on one GPU or several, each get their own.
 * Pointers passed to `gemm` are device pointers.
 */
struct CudaBackend {
  using memory_space = CudaMemory;
  template <class T, std::size_t R>
  using tensor_type = gpu::DeviceTensor<T, R>;
  static constexpr const char* name = "cuda";

  /** Binds the calling rank's thread to device 0 (one GPU per process); see init_rank(int). */
  static void init_rank() { gpu::this_thread().bind(gpu::this_thread().device() < 0 ? 0 : gpu::this_thread().device()); }
  /** Binds the calling rank's thread to `device` and creates its compute stream. */
  static void init_rank(int device) { gpu::this_thread().bind(device); }
  /** Waits until the calling rank's compute stream is idle (before reading results on the host). */
  static void synchronize() { gpu::check(cudaStreamSynchronize(gpu::current_stream()), "cudaStreamSynchronize"); }

  /** Row-major GEMM on device pointers (see gpu::gemm): fp32/fp64 as is, bf16/f16 on tensor cores with fp32 accumulation. */
  template <class T>
    requires gpu::gemm_types<T, T>
  static void gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, gpu::gemm_scalar_t<T> alpha,
                   const T* a, std::size_t lda, const T* b, std::size_t ldb, gpu::gemm_scalar_t<T> beta, T* c,
                   std::size_t ldc) {
    gpu::gemm<T, T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

static_assert(backend<CudaBackend>);

}  // namespace mpar
