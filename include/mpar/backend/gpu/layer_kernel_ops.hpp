#pragma once
/**
 * @file `launch(op, stream)` for the layers' elementwise and row operations (backend/ops/layer_kernels.hpp): the
 * device side CudaBackend::run launches, the kernels of gpu/kernels.hpp.
 */
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/layer_kernels.hpp"

namespace mpar::gpu {

inline void launch(const ops::add& op, cudaStream_t s = nullptr) { add(op.n, op.x, op.z, op.y, s); }
inline void launch(const ops::bias_add_forward& op, cudaStream_t s = nullptr) {
  bias_add_forward(op.rows, op.cols, op.bias, op.y, s);
}
inline void launch(const ops::bias_add_backward& op, cudaStream_t s = nullptr) {
  bias_add_backward(op.rows, op.cols, op.dy, op.dbias, s);
}
inline void launch(const ops::gelu_forward& op, cudaStream_t s = nullptr) { gelu_forward(op.n, op.x, op.y, s); }
inline void launch(const ops::gelu_backward& op, cudaStream_t s = nullptr) {
  gelu_backward(op.n, op.x, op.dy, op.dx, s);
}
inline void launch(const ops::softmax_forward& op, cudaStream_t s = nullptr) {
  softmax_forward(op.rows, op.cols, op.x, op.y, op.causal, op.scale, s);
}
inline void launch(const ops::softmax_backward& op, cudaStream_t s = nullptr) {
  softmax_backward(op.rows, op.cols, op.y, op.dy, op.dx, 1.0f, s);
}
inline void launch(const ops::layernorm_forward& op, cudaStream_t s = nullptr) {
  layernorm_forward(op.rows, op.cols, op.x, op.gamma, op.beta, op.y, op.mean, op.rstd, op.eps, s);
}
inline void launch(const ops::layernorm_backward& op, cudaStream_t s = nullptr) {
  layernorm_backward(op.rows, op.cols, op.x, op.mean, op.rstd, op.gamma, op.dy, op.dx, op.dgamma, op.dbeta, s);
}
inline void launch(const ops::dropout_apply& op, cudaStream_t s = nullptr) {
  dropout_apply(op.mask, op.rows, op.cols, op.x, op.y, s);
}

}  // namespace mpar::gpu
