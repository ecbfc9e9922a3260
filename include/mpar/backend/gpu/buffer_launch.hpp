#pragma once
/**
 * @file `launch(op, stream)` for the buffer operations (backend/ops/buffer.hpp): the device side CudaBackend::run
 * launches — cudaMemsetAsync, the grid-stride kernels of gpu/buffer_ops.hpp and gpu::convert, and device-to-device
 * cudaMemcpy(2D)Async (one per block of a batched 2-D copy; only attention's unfused fallback issues those).
 */
#include <cstddef>

#include "mpar/backend/gpu/buffer_ops.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/buffer.hpp"

namespace mpar::gpu {

template <class T>
void launch(const ops::zero<T>& op, cudaStream_t s = nullptr) {
  zero(op.n, op.x, s);
}
template <class T>
void launch(const ops::fill<T>& op, cudaStream_t s = nullptr) {
  fill(op.n, op.value, op.x, s);
}
template <class T>
void launch(const ops::copy<T>& op, cudaStream_t s = nullptr) {
  copy_on_device(op.src, op.dst, op.n, detail::pick(s));
}
template <class T>
void launch(const ops::copy_2d<T>& op, cudaStream_t s = nullptr) {
  op.check("CudaBackend");
  copy_2d_on_device(op.rows, op.cols, op.src, op.src_ld, op.dst, op.dst_ld, detail::pick(s));
}
template <class T>
void launch(const ops::copy_2d_batched<T>& op, cudaStream_t s = nullptr) {
  op.check("CudaBackend");
  for (std::size_t i = 0; i < op.batch.outer; ++i)
    for (std::size_t j = 0; j < op.batch.inner; ++j)
      copy_2d_on_device(op.rows, op.cols, op.src + i * op.src_stride.outer + j * op.src_stride.inner, op.src_ld,
                        op.dst + i * op.dst_stride.outer + j * op.dst_stride.inner, op.dst_ld, detail::pick(s));
}
template <class From, class To>
void launch(const ops::convert<From, To>& op, cudaStream_t s = nullptr) {
  convert(op.n, op.src, op.dst, s);
}
template <class T>
  requires requires(const InitBlock& b, T* x) { init_values(b, x); }
void launch(const ops::init_values<T>& op, cudaStream_t s = nullptr) { init_values(op.block, op.x, s); }

}  // namespace mpar::gpu
