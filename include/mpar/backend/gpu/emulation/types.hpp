#pragma once
/**
 * @file The CUDA runtime's plain types for g++ (MPAR_CUDA_EMULATION): `dim3`, `uint3`, `cudaError_t`,
 * `cudaMemcpyKind`, `cudaStream_t`, `cudaEvent_t`, the device and kernel attributes mpar uses and the library
 * data-type tags, with the values the real headers give them.
 */
#include <atomic>
#include <cstdint>

/** Thread and block indices (`threadIdx`, `blockIdx`). */
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

/** Launch extents: a missing extent is 1, as in CUDA. */
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/** The runtime's status codes that the emulation returns. */
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUgraph_st;
/**
 * An emulated stream: work runs at once on the calling thread, so a stream is only a handle, and the graph its
 * work is recorded into while a capture is under way (emulation/graphs.hpp).
 */
struct CUstream_st {
  unsigned flags = 0;
  CUgraph_st* capture = nullptr;
};
using cudaStream_t = CUstream_st*;
inline constexpr unsigned cudaStreamDefault = 0x0;
inline constexpr unsigned cudaStreamNonBlocking = 0x1;

/** An emulated event: whether it was recorded, and when (host time, as the work before it has run by then). */
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  double recorded_ms = 0;
};
using cudaEvent_t = CUevent_st*;
inline constexpr unsigned cudaEventDefault = 0x0;
inline constexpr unsigned cudaEventBlockingSync = 0x1;
inline constexpr unsigned cudaEventDisableTiming = 0x2;

/** CUDA graphs (emulation/graphs.hpp): a recorded graph, its executable form, a node (only counted). */
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
using cudaGraphNode_t = void*;
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

/** The device's memory pool (`cudaMallocAsync`): a handle whose attributes are accepted (by every rank thread). */
struct CUmemPoolHandle_st {
  std::atomic<unsigned long long> release_threshold{0};
};
using cudaMemPool_t = CUmemPoolHandle_st*;
enum cudaMemPoolAttr : int {
  cudaMemPoolAttrReleaseThreshold = 4,
};

/** The device attributes mpar queries. */
enum cudaDeviceAttr : int {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
/** The kernel attributes mpar sets. */
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

/** The element-type tags of cuBLAS and cuDNN descriptors (library_types.h). */
enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
};
