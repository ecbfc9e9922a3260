#pragma once
/**
 * @file Devices, streams and errors under the emulation: one device; streams are handles and work runs at once on
 * the calling thread (launches, copies and sets are synchronous), so synchronising returns at once.
 *
 * Stream order is therefore trivially kept, and concurrency between streams is not modelled here: the stream
 * emulation of backend/stream/ is where ordering bugs between streams show.
 */
#include "mpar/backend/gpu/emulation/types.hpp"

namespace mpar::gpu::emulation::detail {
inline cudaError_t& last_error() {
  thread_local cudaError_t e = cudaSuccess;
  return e;
}
inline int& current_device() {
  thread_local int d = 0;
  return d;
}
}  // namespace mpar::gpu::emulation::detail

inline cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return cudaErrorInvalidValue;
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidValue;  // cudaErrorInvalidDevice in CUDA: one emulated device
  ::mpar::gpu::emulation::detail::current_device() = device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = ::mpar::gpu::emulation::detail::current_device();
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = new CUstream_st{flags};
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

/** The error a failed launch left (the emulation throws instead, so this stays cudaSuccess), cleared on read. */
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ::mpar::gpu::emulation::detail::last_error();
  ::mpar::gpu::emulation::detail::last_error() = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::mpar::gpu::emulation::detail::last_error(); }

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (emulation: a pointer is not of the kind the call needs, "
             "or a range leaves its allocation)";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
  }
  return "unknown error";
}
