#pragma once
/**
 * @file `launch(op, stream)` for the optional fused operations (backend/ops/fused.hpp) that have CUDA kernels: the
 * one-pass classifier (gpu/classifier.hpp), the residual add fused into the layer norm (gpu/residual_layernorm.hpp)
 * and attention over the QKV layout (gpu/qkv_attention.hpp: cuDNN's SDPA where it takes the call, mpar's flash kernel
 * otherwise).
 */
#include "mpar/backend/gpu/classifier.hpp"
#include "mpar/backend/gpu/qkv_attention.hpp"
#include "mpar/backend/gpu/residual_layernorm.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/fused.hpp"

namespace mpar::gpu {

inline void launch(const ops::fused_classifier& op, cudaStream_t s = nullptr) {
  fused_classifier(op.rows, op.vocab, op.ld, op.logits, op.targets, op.dlogits, op.row_loss, op.loss, op.grad_scale,
                   nullptr, s);
}
inline void launch(const ops::residual_layernorm_forward& op, cudaStream_t s = nullptr) {
  residual_layernorm_forward(op.rows, op.cols, op.x, op.branch, op.gamma, op.beta, op.h, op.y, op.mean, op.rstd, 1e-5f,
                             s);
}
inline void launch(const ops::residual_layernorm_backward& op, cudaStream_t s = nullptr) {
  residual_layernorm_backward(op.rows, op.cols, op.h, op.mean, op.rstd, op.gamma, op.dy, op.dres, op.dh, op.dgamma,
                              op.dbeta, s);
}
template <class T>
void launch(const ops::attention_forward<T>& op, cudaStream_t s = nullptr) {
  (void)qkv_attention_forward<T>(op.nb, op.heads, op.seq, op.head_dim, op.scale, op.causal, op.qkv, op.o, op.o_heads,
                                 op.lse, s);
}
template <class T>
void launch(const ops::attention_backward<T>& op, cudaStream_t s = nullptr) {
  (void)qkv_attention_backward<T>(op.nb, op.heads, op.seq, op.head_dim, op.scale, op.causal, op.qkv, op.o_heads, op.lse,
                                  op.dout, op.dqkv, s);
}

}  // namespace mpar::gpu
