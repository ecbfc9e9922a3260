#pragma once
/**
 * @file `launch(op, stream)` for the vocabulary-parallel operations (backend/ops/vocab_parallel.hpp): the device side
 * CudaBackend::run launches, the embedding and cross-entropy kernels of gpu/kernels.hpp.
 */
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/vocab_parallel.hpp"

namespace mpar::gpu {

inline void launch(const ops::embedding_forward& op, cudaStream_t s = nullptr) {
  embedding_forward(op.tokens, op.dim, op.ids, op.table, op.out, op.vocab_offset, op.vocab_local, s);
}
inline void launch(const ops::embedding_backward& op, cudaStream_t s = nullptr) {
  embedding_backward(op.tokens, op.dim, op.ids, op.dout, op.dtable, op.vocab_offset, op.vocab_local, s);
}
inline void launch(const ops::vocab_parallel_max& op, cudaStream_t s = nullptr) {
  vocab_parallel_max(op.rows, op.cols, op.logits, op.row_max, s);
}
inline void launch(const ops::vocab_parallel_sumexp& op, cudaStream_t s = nullptr) {
  vocab_parallel_sumexp(op.rows, op.cols, op.col_offset, op.logits, op.targets, op.row_max, op.sumexp, op.target_logit,
                        s);
}
inline void launch(const ops::vocab_parallel_loss& op, cudaStream_t s = nullptr) {
  vocab_parallel_loss(op.rows, op.row_max, op.sumexp, op.target_logit, op.loss, s);
}
inline void launch(const ops::vocab_parallel_backward& op, cudaStream_t s = nullptr) {
  vocab_parallel_backward(op.rows, op.cols, op.col_offset, op.logits, op.targets, op.row_max, op.sumexp, op.dlogits,
                          op.scale, s);
}

}  // namespace mpar::gpu
