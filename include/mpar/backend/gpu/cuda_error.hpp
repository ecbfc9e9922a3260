#pragma once
/**
 * @file Errors from the CUDA runtime, cuBLAS and NCCL as exceptions that name the failed call.
 *
 * Every CUDA, cuBLAS and NCCL status goes through `check`, so a failure surfaces at the call that
 * caused it (with the library's own message) instead of as a corrupted result later on.
 */
#include "mpar/backend/gpu/runtime.hpp"  // with cuBLAS and cuBLASLt (or their emulation)

#include <stdexcept>
#include <string>

#include "mpar/core/error.hpp"

namespace mpar {

/** @brief A CUDA runtime or cuBLAS failure, with the operation that failed and the library's message. */
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace gpu {

/** Throws cuda_error naming `what` unless `st` is cudaSuccess. */
inline void check(cudaError_t st, const char* what) {
  if (st != cudaSuccess)
    throw cuda_error(
        mpar::detail::cat("CUDA error in ", what, ": ", cudaGetErrorName(st), " (", cudaGetErrorString(st), ")"));
}
/** Throws cuda_error naming `what` unless `st` is CUBLAS_STATUS_SUCCESS. */
inline void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(mpar::detail::cat("cuBLAS error in ", what, ": ", cublasGetStatusName(st), " (",
                                       cublasGetStatusString(st), ")"));
}

/** Number of visible CUDA devices; 0 (not an exception) when there is no driver or no device. */
[[nodiscard]] inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status so later queries start clean
    return 0;
  }
  return n;
}

/** Throws cuda_error naming `what` if a kernel launch left an error. */
inline void check_launch(const char* what) { check(cudaGetLastError(), what); }

}  // namespace gpu
}  // namespace mpar
