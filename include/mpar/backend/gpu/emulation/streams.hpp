#pragma once
/**
 * @file Devices, streams and errors under the emulation: streams are handles and work runs at once on
 * the calling thread (launches, copies and sets are synchronous), so synchronising returns at once.
 *
 * Stream order is therefore trivially kept, and concurrency between streams is not modelled here: the stream
 * emulation of backend/stream/ is where ordering bugs between streams show. An event is complete once recorded
 * (its work has run); querying or timing one never recorded is an error, as in CUDA.
 *
 * There are `emulated_devices` devices (thread ranks of an emulated NCCL communicator each take one); they share one
 * memory, as GPUs with peer access share an address space. Each reports 4 multiprocessors (so that launchers sizing
 * grids by it stride over rows) and the 227 KiB of opt-in shared memory per block of a Hopper GPU, the limit the SIMT emulator enforces.
 */
#include <chrono>

#include "mpar/backend/gpu/emulation/capture_state.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"

namespace mpar::gpu::emulation {
/** How many devices the emulation has. */
inline constexpr int emulated_devices = 8;
}  // namespace mpar::gpu::emulation

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
  *n = ::mpar::gpu::emulation::emulated_devices;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= ::mpar::gpu::emulation::emulated_devices)
    return cudaErrorInvalidValue;  // cudaErrorInvalidDevice in CUDA
  ::mpar::gpu::emulation::detail::current_device() = device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = ::mpar::gpu::emulation::detail::current_device();
  return cudaSuccess;
}
// A wait on the device fails a capture on this thread (CUDA's thread-local mode), as on a GPU.
inline cudaError_t cudaDeviceSynchronize() {
  return ::mpar::gpu::emulation::capturing() ? ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported)
                                             : cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device < 0 || device >= ::mpar::gpu::emulation::emulated_devices)
    return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 << 10;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 4;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 << 10;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
/** Accepted for any kernel; the emulator enforces the device's opt-in limit (227 KiB) on every launch. */
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel*, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > (227 << 10))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = new CUstream_st{flags};
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr) return cudaErrorInvalidValue;
  *e = new CUevent_st{flags};
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  e->recorded = true;
  e->recorded_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  return ::mpar::gpu::emulation::capturing() ? ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported)
                                             : cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }
/** An ordering between streams (allowed in a capture: it orders the recorded work, which runs in order anyway). */
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned = 0) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
/** Host milliseconds between the two records (the work between them ran in between, on the calling thread). */
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  if (ms == nullptr || start == nullptr || stop == nullptr) return cudaErrorInvalidResourceHandle;
  if ((start->flags | stop->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (!start->recorded || !stop->recorded) return cudaErrorInvalidResourceHandle;
  *ms = float(stop->recorded_ms - start->recorded_ms);
  return cudaSuccess;
}

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
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit:
      return "cudaErrorStreamCaptureImplicit";
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
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorIllegalState:
      return "the operation is not permitted in the current state (a capture already under way, or none to end)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
  }
  return "unknown error";
}
