#pragma once
/**
 * @file The CUDA runtime (and cuBLAS, cuBLASLt, cuDNN, CUB, NCCL) that mpar's device code compiles against, and the one way it
 * launches a kernel.
 *
 * Normally the real ones (`cuda_runtime.h`, the 16-bit float and data-type headers, `cublas_v2.h`, `cublasLt.h`,
 * and under nvcc the CUB algorithms mpar uses: CUB's headers are device code, which a host compiler cannot read).
 * With `MPAR_CUDA_EMULATION` defined (the CMake option of the same name: a test build compiled by g++, never a
 * backend for users) it is the emulated runtime of backend/gpu/emulation/: kernels run on the CPU in a SIMT
 * emulator, device memory faults on any host access, cuBLAS(Lt) calls run a naive reference that honours every
 * argument, NCCL's calls run between thread ranks on emulated devices, cuDNN's SDPA graphs run as naive attention, and CUB's block reduction and device sort, histogram, scan and sum run with CUB's semantics
 * (docs/cuda.md, "The emulated runtime").
 *
 * - `MPAR_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)`: `kernel<<<grid, block, shared_bytes,
 *   stream>>>(args...)` under nvcc; under the emulation the grid runs at once on the calling thread. `kernel`
 *   is named as in a call (template arguments deduced from `args`), without commas; a kernel whose template
 *   arguments need a comma is first bound to a local (`const auto kernel = f<T, D>;`), as nvcc launches too.
 * - `MPAR_DYNAMIC_SHARED(type, name);` in a kernel: `extern __shared__ type name[]`, the block's dynamic shared
 *   memory (`shared_bytes` of the launch).
 */
#if defined(MPAR_CUDA_EMULATION)
#if defined(__CUDACC__)
#error "MPAR_CUDA_EMULATION is a g++ build: nvcc compiles against the real CUDA runtime"
#endif
#include "mpar/backend/gpu/emulation/runtime.hpp"

#define MPAR_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)          \
  ::mpar::gpu::emulation::Launch(#kernel, grid, block, shared_bytes, stream, \
                                 [=](auto... mpar_launch_args) { kernel(mpar_launch_args...); })(__VA_ARGS__)
#define MPAR_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::mpar::gpu::emulation::dynamic_shared_memory())
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>
#include <nccl.h>
#if defined(MPAR_HAVE_CUDNN)
#include <cudnn.h>
#endif
#if defined(__CUDACC__)
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_histogram.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#endif

#define MPAR_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define MPAR_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
