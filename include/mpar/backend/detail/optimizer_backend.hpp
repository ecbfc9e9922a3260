#pragma once
/**
 * @file The `optimizer_backend` concept: a backend's optimizer kernels (AdamW, SGD, the gradient norm,
 * clipping and loss-scale factors), so an optimizer runs where its weights live.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/optimizer_kernels.hpp"  // UpdateFactors (the optimizer kernels' per-step inputs)

namespace mpar::detail {

/**
 * @brief The optimizer family of `backend`: fp32 kernels over `n` elements, with the semantics of their
 * `mpar::host` reference (backend/host/optimizer_kernels.hpp):
 * - `adamw_update(n, w, g, m, v, beta1, beta2, eps, lr, weight_decay, bias_correction1,
 *   bias_correction2, factors)`: one AdamW step on weights `w` with moments `m`, `v`, in the
 *   direct textbook form (bias corrections `1 - beta^t` given by the caller); the gradient scale
 *   and the skip flag are read from `factors` (an `UpdateFactors` in rank memory), so clipping
 *   and the f16 overflow skip need no host read;
 * - `adamw_update(n, w, g, m, v, ..., factors, decay_runs, runs)`: the same update over a flat range (all the
 *   parameters of a rank, see `optim::AdamW`) with the weight decay applied per `DecayRun` of a table in rank
 *   memory: one call per step however many parameters;
 * - `sgd_update(n, w, g, buf, momentum, dampening, nesterov, lr, weight_decay, first, factors)`:
 *   one SGD step with L2 decay and momentum buffer `buf` (null when `momentum == 0`), `factors`
 *   as for `adamw_update`;
 * - `sum_squares(n, x, acc)`: `*acc += sum x[i]^2` into a double in rank memory (the host
 *   accumulates in double; a device may sum a block in float), the local part of the global
 *   gradient norm;
 * - `update_factors(squares, max_norm, inv_loss_scale, skip_nonfinite, norm, factors)`: from the
 *   reduced sum of squares (rank memory), the gradient norm and the `UpdateFactors` of the step
 *   (clipping coefficient times the inverse loss scale; skip on a non-finite norm);
 * - `scale(n, factor, x)`: `x[i] *= factor` in place (argument order of `host::scale`);
 * - `adamw_advance(beta1, beta2, lr, factors, scalars)` and `adamw_update(n, w, g, m, v, beta1, beta2, eps,
 *   weight_decay, scalars, factors[, decay_runs, runs])`: the AdamW step with its learning rate and bias
 *   corrections in rank memory (`AdamWScalars`, advanced by the first), so that a captured step replays with
 *   the values of each step (see `graph_backend`).
 */
template <class B>
concept optimizer_backend = requires(const float* a, float* c, std::size_t n, double* acc, UpdateFactors* factors) {
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 1e-3f, 0.01f, 0.1f, 0.001f,
                  static_cast<const UpdateFactors*>(factors));
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 1e-3f, 0.01f, 0.1f, 0.001f,
                  static_cast<const UpdateFactors*>(factors), static_cast<const DecayRun*>(nullptr), n);
  B::sgd_update(n, c, a, c, 0.9f, 0.0f, false, 1e-2f, 0.0f, true, static_cast<const UpdateFactors*>(factors));
  B::sum_squares(n, a, acc);
  B::update_factors(static_cast<const double*>(acc), 1.0, 1.0f, true, acc, factors);
  B::scale(n, 1.0f, c);
  B::adamw_advance(0.9f, 0.999f, a, static_cast<const UpdateFactors*>(factors), static_cast<AdamWScalars*>(nullptr));
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 0.01f, static_cast<const AdamWScalars*>(nullptr),
                  static_cast<const UpdateFactors*>(factors));
  B::adamw_update(n, c, a, c, c, 0.9f, 0.999f, 1e-8f, 0.01f, static_cast<const AdamWScalars*>(nullptr),
                  static_cast<const UpdateFactors*>(factors), static_cast<const DecayRun*>(nullptr), n);
};

}  // namespace mpar::detail
