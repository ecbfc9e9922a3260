#pragma once
/**
 * @file The optimizer operations (`ops::adamw_update`, `ops::adamw_advance`, `ops::sgd_update`, `ops::sum_squares`,
 * `ops::update_factors`, `ops::scale`): an optimizer's step, the global gradient norm and clipping, run where the
 * weights live. See backend/ops/operation.hpp for the pattern.
 *
 * Their host reference is the host kernels of backend/host/optimizer_kernels.hpp (vectorised where it pays, tested on
 * their own against plain loops); every array is fp32 of `n` elements, so an update applies unchanged to a local
 * shard, a ZeRO block or a whole tensor. What a step depends on beyond its hyper-parameters — the gradient scale
 * (clipping times the inverse loss scale), the overflow skip, and for a captured step the learning rate and bias
 * corrections — is read from rank memory (`UpdateFactors`, `AdamWScalars`), so neither clipping nor a replayed
 * graph needs the host to read a device value.
 */
#include <cstddef>

#include "mpar/backend/host/kernels.hpp"  // host::scale
#include "mpar/backend/host/optimizer_kernels.hpp"
#include "mpar/core/error.hpp"

namespace mpar::ops {

/**
 * One AdamW update in the direct textbook form (host::adamw_update): `g' = s g; m = b1 m + (1-b1) g';
 * v = b2 v + (1-b2) g'^2; w = w (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps)`, `s = factors->grad_scale`;
 * nothing changes when `factors->skip != 0`. The step's `lr` and bias corrections `c1, c2` (`1 - beta^t`) are the
 * members below, or read from `scalars` (rank memory, advanced by `ops::adamw_advance`) when it is given, so a
 * captured step replays with each step's values. With `decay_runs` (a table of `runs` `DecayRun`s in rank memory,
 * the last ending at `n`) the weight decay applies per run: one call covers every parameter of a rank, and equals
 * one call per parameter bit for bit.
 */
struct adamw_update {
  static constexpr const char* name = "adamw_update";
  std::size_t n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float lr = 0, bias_correction1 = 1, bias_correction2 = 1;  ///< used when `scalars` is null
  const AdamWScalars* scalars = nullptr;                     ///< the step's lr and bias corrections, or null
  const UpdateFactors* factors = nullptr;                    ///< required: the gradient scale and the skip flag
  const DecayRun* decay_runs = nullptr;                      ///< weight decay per run, or null: everywhere
  std::size_t runs = 0;
  template <class F>
  void each_operand(F&& f) {
    f(w), f(g), f(m), f(v), f(scalars), f(factors), f(decay_runs);
  }
};

/**
 * The scalars of the next AdamW update in rank memory (host::adamw_advance): `scalars->lr = *lr`; unless
 * `factors->skip`, one more update counted and its bias corrections `1 - beta^t`.
 */
struct adamw_advance {
  static constexpr const char* name = "adamw_advance";
  float beta1 = 0, beta2 = 0;
  const float* lr = nullptr;  ///< one float of rank memory, written by the host before the step
  const UpdateFactors* factors = nullptr;
  AdamWScalars* scalars = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(lr), f(factors), f(scalars);
  }
};

/**
 * One SGD update with L2 weight decay and (optionally Nesterov) momentum (host::sgd_update): `d = s g + wd w;
 * buf = first ? d : mu buf + (1 - dampening) d; w -= lr (nesterov ? d + mu buf : buf)`; without momentum `buf`
 * may be null and `w -= lr d`; nothing changes when `factors->skip != 0`.
 */
struct sgd_update {
  static constexpr const char* name = "sgd_update";
  std::size_t n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  float* buf = nullptr;  ///< the momentum buffer; null when `momentum == 0`
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  float lr = 0, weight_decay = 0;
  bool first = false;  ///< the buffer holds nothing yet (the optimizer's first step)
  const UpdateFactors* factors = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(w), f(g), f(buf), f(factors);
  }
};

/**
 * `*acc += sum x[i]^2` into a double of rank memory (the host sums in double; a device may sum a block in float):
 * the local part of the global gradient norm, all-reduced without a host read.
 */
struct sum_squares {
  static constexpr const char* name = "sum_squares";
  std::size_t n = 0;
  const float* x = nullptr;
  double* acc = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(acc);
  }
};

/**
 * The step's gradient norm and `UpdateFactors` from the reduced sum of squares (host::update_factors):
 * `*norm = sqrt(*squares) inv_loss_scale`, the clipping coefficient for `max_norm` (0: no clipping) times
 * `inv_loss_scale` as `factors->grad_scale`, and `factors->skip` set when `skip_nonfinite` and the norm is not
 * finite (the f16 overflow).
 */
struct update_factors {
  static constexpr const char* name = "update_factors";
  const double* squares = nullptr;
  double max_norm = 0;
  float inv_loss_scale = 1;
  bool skip_nonfinite = false;
  double* norm = nullptr;
  UpdateFactors* factors = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(squares), f(norm), f(factors);
  }
};

/** `x[i] *= factor` in place: a gradient's averaging or clipping, a loss's scaling. */
struct scale {
  static constexpr const char* name = "scale";
  std::size_t n = 0;
  float factor = 1;
  float* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x);
  }
};

inline void host_reference(const adamw_update& op) {
  require(op.factors != nullptr, "ops::adamw_update: factors is null; pass the step's UpdateFactors in rank memory");
  const float lr = op.scalars ? op.scalars->lr : op.lr;
  const float c1 = op.scalars ? op.scalars->bias_correction1 : op.bias_correction1;
  const float c2 = op.scalars ? op.scalars->bias_correction2 : op.bias_correction2;
  if (op.decay_runs)
    host::adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, lr, op.weight_decay, c1, c2,
                       op.factors, op.decay_runs, op.runs);
  else
    host::adamw_update(op.n, op.w, op.g, op.m, op.v, op.beta1, op.beta2, op.eps, lr, op.weight_decay, c1, c2,
                       op.factors);
}
inline void host_reference(const adamw_advance& op) {
  host::adamw_advance(op.beta1, op.beta2, op.lr, op.factors, op.scalars);
}
inline void host_reference(const sgd_update& op) {
  require(op.factors != nullptr, "ops::sgd_update: factors is null; pass the step's UpdateFactors in rank memory");
  require(op.momentum == 0.0f || op.buf != nullptr || op.n == 0, "ops::sgd_update: momentum ", op.momentum,
          " needs a momentum buffer of ", op.n, " elements, got null");
  host::sgd_update(op.n, op.w, op.g, op.buf, op.momentum, op.dampening, op.nesterov, op.lr, op.weight_decay, op.first,
                   op.factors);
}
inline void host_reference(const sum_squares& op) { host::sum_squares(op.n, op.x, op.acc); }
inline void host_reference(const update_factors& op) {
  host::update_factors(op.squares, op.max_norm, op.inv_loss_scale, op.skip_nonfinite, op.norm, op.factors);
}
inline void host_reference(const scale& op) { host::scale(op.n, op.factor, op.x); }

}  // namespace mpar::ops
