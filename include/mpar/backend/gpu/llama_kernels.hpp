#pragma once
/**
 * @file CUDA kernels of the Llama-class layers (`llama_kernel_backend`): RMSNorm, the rotate-half rotary embedding and
 * the SwiGLU gate, the device twins of the host references in backend/ops/ (rmsnorm.hpp, rope.hpp, silu_gate.hpp),
 * each a function with the operation's arguments plus a trailing optional stream, and a `launch(op, stream)` overload
 * per operation object, which is how CudaBackend runs them. Compile with nvcc, or g++ with MPAR_CUDA_EMULATION
 * (backend/gpu/runtime.hpp).
 *
 * A row's sums run as a block reduction, and the gain gradient adds per-chunk column sums with atomics, so results
 * agree with the host to float rounding, not bit for bit. The rotary angles are computed in double and rounded once,
 * as on the host.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/kernels.hpp"  // grid_for, block_threads, pick, block_reduce, check_launch
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/backend/ops/rmsnorm.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/backend/ops/silu_gate.hpp"

namespace mpar::gpu {

namespace detail {

// Templates (instantiated for float), so that including this header in several translation units defines each
// kernel once.
/** One block per row: the mean square reduced over the block, then the scaled row. */
template <class T>
__global__ void rmsnorm_forward_kernel(std::size_t cols, float eps, const T* x, const T* gain, T* y, float* rstd) {
  const std::size_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float ss = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  const float rs = 1.0f / sqrtf(block_reduce(ss, SumOp{}) / float(cols) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = xr[c] * rs * gain[c];
}
/** One block per row: `dx = rstd (g dy - x rstd^2 mean(g dy x))`; each thread writes only what it read (dx may be dy). */
template <class T>
__global__ void rmsnorm_backward_dx_kernel(std::size_t cols, const T* x, const float* rstd, const T* gain, const T* dy,
                                           T* dx) {
  const std::size_t r = blockIdx.x;
  const T *xr = x + r * cols, *dyr = dy + r * cols;
  const float rs = rstd[r];
  float dot = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) dot += dyr[c] * gain[c] * xr[c];
  const float k = block_reduce(dot, SumOp{}) * rs * rs / float(cols);
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) dx[r * cols + c] = rs * (dyr[c] * gain[c] - xr[c] * k);
}
/** A thread per column and chunk of rows: `sum dy x rstd` over the chunk, added to `dgain`. */
template <class T>
__global__ void rmsnorm_backward_gain_kernel(std::size_t rows, std::size_t cols, std::size_t rows_per_chunk, const T* x,
                                             const float* rstd, const T* dy, float* dgain) {
  const std::size_t c = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const std::size_t r0 = blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float dg = 0;
  for (std::size_t r = r0; r < r1; ++r) dg += dy[r * cols + c] * x[r * cols + c] * rstd[r];
  atomicAdd(dgain + c, dg);
}
/** A thread per (row, head, pair i): rotates `(x_i, x_{i+d/2})` by `sign * position * theta^(-2i/d)`. */
template <class T>
__global__ void rope_kernel(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                            const std::int32_t* positions, double theta, const T* x, T* y, double sign) {
  const std::size_t half = head_dim / 2, n = rows * heads * half;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = k / (heads * half), h = (k / half) % heads, i = k % half;
    const double a = double(positions[r]) * pow(theta, -2.0 * double(i) / double(head_dim));
    const float ca = float(cos(a)), sa = float(sign * sin(a));
    const std::size_t at = r * ld + h * head_dim + i;
    const T lo = x[at], hi = x[at + half];  // both read before either is written (x may be y)
    y[at] = lo * ca - hi * sa;
    y[at + half] = hi * ca + lo * sa;
  }
}
template <class T>
__global__ void silu_gate_forward_kernel(std::size_t rows, std::size_t cols, const T* gate_up, T* y) {
  const std::size_t n = rows * cols;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = k / cols, c = k % cols;
    const T g = gate_up[r * 2 * cols + c], u = gate_up[r * 2 * cols + cols + c];
    y[k] = g / (1.0f + expf(-g)) * u;
  }
}
/** Each thread reads its gate and up values before writing their gradients (dgate_up may be gate_up). */
template <class T>
__global__ void silu_gate_backward_kernel(std::size_t rows, std::size_t cols, const T* gate_up, const T* dy,
                                          T* dgate_up) {
  const std::size_t n = rows * cols;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n;
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = k / cols, c = k % cols, at = r * 2 * cols + c;
    const T g = gate_up[at], u = gate_up[at + cols], d = dy[k];
    const T s = 1.0f / (1.0f + expf(-g));
    dgate_up[at] = d * u * s * (1.0f + g * (1.0f - s));
    dgate_up[at + cols] = d * g * s;
  }
}

}  // namespace detail

/** `rstd = 1 / sqrt(mean(x^2) + eps)` per row and `y = x * rstd * gain` (see `llama_kernel_backend`). */
inline void rmsnorm_forward(std::size_t rows, std::size_t cols, float eps, const float* x, const float* gain, float* y,
                            float* rstd, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::rmsnorm_forward_kernel<float>, unsigned(rows), detail::block_threads, 0, detail::pick(s), cols,
              eps, x, gain, y, rstd);
  check_launch("gpu::rmsnorm_forward");
}
/**
 * The input gradient (overwritten; may be `dy`) and `dgain += sum over rows of dy x rstd`. The gain's sums read `dy`
 * first, so they are launched before the kernel that may overwrite it.
 */
inline void rmsnorm_backward(std::size_t rows, std::size_t cols, const float* x, const float* rstd, const float* gain,
                             const float* dy, float* dx, float* dgain, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  s = detail::pick(s);
  constexpr std::size_t chunk = 64;
  const dim3 grid(unsigned((cols + detail::block_threads - 1) / detail::block_threads),
                  unsigned((rows + chunk - 1) / chunk));
  MPAR_LAUNCH(detail::rmsnorm_backward_gain_kernel<float>, grid, detail::block_threads, 0, s, rows, cols, chunk, x,
              rstd, dy, dgain);
  check_launch("gpu::rmsnorm_backward(dgain)");
  MPAR_LAUNCH(detail::rmsnorm_backward_dx_kernel<float>, unsigned(rows), detail::block_threads, 0, s, cols, x, rstd,
              gain, dy, dx);
  check_launch("gpu::rmsnorm_backward(dx)");
}
/** The rotate-half rotary embedding of `heads` heads per row at `positions` (x may be y). */
inline void rope_forward(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                         const std::int32_t* positions, double theta, const float* x, float* y,
                         cudaStream_t s = nullptr) {
  const std::size_t n = rows * heads * (head_dim / 2);
  if (!n) return;
  MPAR_LAUNCH(detail::rope_kernel<float>, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), rows, heads,
              head_dim, ld, positions, theta, x, y, 1.0);
  check_launch("gpu::rope_forward");
}
/** Its transpose, the rotation by minus each angle (dy may be dx). */
inline void rope_backward(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                          const std::int32_t* positions, double theta, const float* dy, float* dx,
                          cudaStream_t s = nullptr) {
  const std::size_t n = rows * heads * (head_dim / 2);
  if (!n) return;
  MPAR_LAUNCH(detail::rope_kernel<float>, detail::grid_for(n), detail::block_threads, 0, detail::pick(s), rows, heads,
              head_dim, ld, positions, theta, dy, dx, -1.0);
  check_launch("gpu::rope_backward");
}
/** `y = silu(gate) * up`, row `r` of `gate_up` holding `cols` gate values then `cols` up values. */
inline void silu_gate_forward(std::size_t rows, std::size_t cols, const float* gate_up, float* y,
                              cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::silu_gate_forward_kernel<float>, detail::grid_for(rows * cols), detail::block_threads, 0,
              detail::pick(s), rows, cols, gate_up, y);
  check_launch("gpu::silu_gate_forward");
}
/** The gradient of both halves (overwritten; may be `gate_up`). */
inline void silu_gate_backward(std::size_t rows, std::size_t cols, const float* gate_up, const float* dy,
                               float* dgate_up, cudaStream_t s = nullptr) {
  if (!rows || !cols) return;
  MPAR_LAUNCH(detail::silu_gate_backward_kernel<float>, detail::grid_for(rows * cols), detail::block_threads, 0,
              detail::pick(s), rows, cols, gate_up, dy, dgate_up);
  check_launch("gpu::silu_gate_backward");
}

// The operation objects (backend/ops/), as CudaBackend::run launches them.
inline void launch(const ops::rmsnorm_forward& op, cudaStream_t s) {
  rmsnorm_forward(op.rows, op.cols, op.eps, op.x, op.gain, op.y, op.rstd, s);
}
inline void launch(const ops::rmsnorm_backward& op, cudaStream_t s) {
  rmsnorm_backward(op.rows, op.cols, op.x, op.rstd, op.gain, op.dy, op.dx, op.dgain, s);
}
inline void launch(const ops::rope_forward& op, cudaStream_t s) {
  rope_forward(op.rows, op.heads, op.head_dim, op.ld, op.positions, op.theta, op.x, op.y, s);
}
inline void launch(const ops::rope_backward& op, cudaStream_t s) {
  rope_backward(op.rows, op.heads, op.head_dim, op.ld, op.positions, op.theta, op.dy, op.dx, s);
}
inline void launch(const ops::silu_gate_forward& op, cudaStream_t s) {
  silu_gate_forward(op.rows, op.cols, op.gate_up, op.y, s);
}
inline void launch(const ops::silu_gate_backward& op, cudaStream_t s) {
  silu_gate_backward(op.rows, op.cols, op.gate_up, op.dy, op.dgate_up, s);
}

}  // namespace mpar::gpu
