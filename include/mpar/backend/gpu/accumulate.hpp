#pragma once
/**
 * @file `launch(ops::accumulate, stream)`: the device side of `ops::accumulate` (backend/ops/accumulate.hpp),
 * `*acc += scale * sum x[i]` into a double of device memory, ordered on a stream; CudaBackend::run launches it.
 *
 * It adds a handful of values (a micro-batch's loss), so one thread sums them in index order in double,
 * operation for operation as the host does: the result equals the host's bit for bit.
 */
#include <cstddef>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/accumulate.hpp"

namespace mpar::gpu {

namespace detail {
template <class T>  // a template, so the header's kernel is defined once however many units include it
__global__ void accumulate_kernel(std::size_t n, const T* x, double scale, double* acc) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += double(x[i]);
  *acc += scale * s;
}
}  // namespace detail

/** `*acc += scale * (x[0] + ... + x[n-1])` in double, ordered on `s`. */
inline void launch(const ops::accumulate& op, cudaStream_t s = nullptr) {
  MPAR_LAUNCH(detail::accumulate_kernel<float>, 1, 1, 0, detail::pick(s), op.n, op.x, op.scale, op.acc);
  check_launch("gpu::accumulate");
}

}  // namespace mpar::gpu
