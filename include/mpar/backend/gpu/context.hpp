#pragma once
/**
 * @file The per-thread CUDA context of a rank: its device, its compute stream and its cuBLAS handles.
 *
 * mpar runs a rank per thread (or per process). cuBLAS handles must not be used by two threads at
 * once, and each rank needs its own stream so that ranks sharing a GPU run concurrently; keeping all
 * of it thread-local lets the CudaBackend policy stay a stateless type, like HostBackend.
 */
#include "mpar/backend/gpu/runtime.hpp"  // with cuBLAS and cuBLASLt (or their emulation)

#include <cstddef>
#include <memory>
#include <mutex>

#include "mpar/backend/gpu/cuda_error.hpp"

namespace mpar::gpu {

/**
 * @brief A compute stream as the memory resource sees it: the stream, and whether it still exists.
 * A buffer is freed in the order of the stream it was allocated on (`cudaFreeAsync`); a rank's own
 * stream is destroyed when its thread ends, after which its buffers are freed with `cudaFree`.
 */
struct StreamToken {
  explicit StreamToken(cudaStream_t s) : stream(s) {}
  std::mutex m;
  cudaStream_t stream;
  bool alive = true;  // guarded by m
};

/** @brief One thread's CUDA state: device, compute stream, cuBLAS and cuBLASLt handles and a Lt workspace. */
class ThreadContext {
 public:
  /** Workspace for cuBLASLt: 32 MiB covers the split-K and stream-K kernels of large GEMMs on Hopper. */
  static constexpr std::size_t lt_workspace_bytes = std::size_t(32) << 20;

  ThreadContext() = default;
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;
  ~ThreadContext() {
    // Destruction may run after the CUDA runtime shut down at exit: errors are ignored on purpose.
    if (workspace_) (void)cudaFree(workspace_);
    if (lt_) (void)cublasLtDestroy(lt_);
    if (blas_) (void)cublasDestroy(blas_);
    if (own_stream_) {
      {
        std::lock_guard lock(own_token_->m);
        own_token_->alive = false;  // from now on this stream's buffers are freed with cudaFree
      }
      (void)cudaStreamSynchronize(own_stream_);
      (void)cudaStreamDestroy(own_stream_);
    }
  }

  /** Binds this thread to `device` (idempotent); the first call also creates the thread's stream. */
  void bind(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    device_ = device;
    if (!own_stream_) {
      check(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      own_token_ = std::make_shared<StreamToken>(own_stream_);
    }
    if (!stream_) {
      stream_ = own_stream_;
      token_ = own_token_;
    }
  }
  [[nodiscard]] int device() const { return device_; }

  /** The compute stream; binds device 0 on first use when the thread never called bind(). */
  [[nodiscard]] cudaStream_t stream() {
    if (device_ < 0) bind(0);
    return stream_;
  }
  /** Uses `s` as this thread's compute stream from now on (the caller keeps it alive). */
  void set_stream(cudaStream_t s) {
    if (device_ < 0) bind(0);
    stream_ = s ? s : own_stream_;
    token_ = s ? std::make_shared<StreamToken>(s) : own_token_;
  }
  /** The compute stream for the memory resource (see StreamToken). */
  [[nodiscard]] const std::shared_ptr<StreamToken>& stream_token() {
    if (device_ < 0) bind(0);
    return token_;
  }

  /** The cuBLAS handle, set to run on `s` (the compute stream when null). */
  [[nodiscard]] cublasHandle_t blas(cudaStream_t s = nullptr) {
    if (!blas_) {
      check(cublasCreate(&blas_), "cublasCreate");
      // Tensor-op math for 16-bit inputs; fp32 GEMMs stay true fp32 unless the user opts into TF32.
      check(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    }
    check(cublasSetStream(blas_, s ? s : stream()), "cublasSetStream");
    return blas_;
  }
  [[nodiscard]] cublasLtHandle_t lt() {
    if (!lt_) check(cublasLtCreate(&lt_), "cublasLtCreate");
    return lt_;
  }
  [[nodiscard]] void* lt_workspace() {
    if (!workspace_) check(cudaMalloc(&workspace_, lt_workspace_bytes), "cudaMalloc(cuBLASLt workspace)");
    return workspace_;
  }

 private:
  int device_ = -1;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<StreamToken> own_token_, token_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
};

/** The calling thread's context. */
[[nodiscard]] inline ThreadContext& this_thread() {
  thread_local ThreadContext ctx;
  return ctx;
}

/** The calling thread's compute stream (every mpar CUDA kernel and GEMM without an explicit stream uses it). */
[[nodiscard]] inline cudaStream_t current_stream() { return this_thread().stream(); }

}  // namespace mpar::gpu
