#pragma once
/**
 * @file `launch(op, stream)` for the optimizer operations (backend/ops/optimizer.hpp): the device side CudaBackend::run
 * launches, each one kernel of gpu/kernels.hpp that computes its host reference operation for operation.
 */
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/optimizer.hpp"

namespace mpar::gpu {

/** One AdamW update: its lr and bias corrections given or read from `op.scalars`, its decay uniform or per run. */
inline void launch(const ops::adamw_update& op, cudaStream_t s = nullptr) {
  require(op.factors != nullptr, "ops::adamw_update: factors is null; pass the step's UpdateFactors in rank memory");
  if (op.scalars && op.decay_runs)
    adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, op.weight_decay, op.scalars, op.factors,
                 op.decay_runs, op.runs, s);
  else if (op.scalars)
    adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, op.weight_decay, op.scalars, op.factors, s);
  else if (op.decay_runs)
    adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, op.lr, op.weight_decay, op.bias_correction1,
                 op.bias_correction2, op.factors, op.decay_runs, op.runs, s);
  else
    adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, op.lr, op.weight_decay, op.bias_correction1,
                 op.bias_correction2, op.factors, s);
}
inline void launch(const ops::adamw_advance& op, cudaStream_t s = nullptr) {
  adamw_advance(op.beta1, op.beta2, op.lr, op.factors, op.scalars, s);
}
inline void launch(const ops::sgd_update& op, cudaStream_t s = nullptr) {
  require(op.factors != nullptr, "ops::sgd_update: factors is null; pass the step's UpdateFactors in rank memory");
  sgd_update(op.n, op.w, op.g, op.buf, op.momentum, op.dampening, op.nesterov, op.lr, op.weight_decay, op.first,
             op.factors, s);
}
/** `*acc += sum x[i]^2` into a double of device memory (each block sums in float). */
inline void launch(const ops::sum_squares& op, cudaStream_t s = nullptr) {
  sum_squares_accumulate(op.n, op.x, op.acc, s);
}
inline void launch(const ops::update_factors& op, cudaStream_t s = nullptr) {
  update_factors(op.squares, op.max_norm, op.inv_loss_scale, op.skip_nonfinite, op.norm, op.factors, s);
}
inline void launch(const ops::scale& op, cudaStream_t s = nullptr) { scale(op.n, op.factor, op.x, s); }

}  // namespace mpar::gpu
