#pragma once
/**
 * @file The `optimizer_backend` concept: a backend's optimizer operations (AdamW, SGD, the gradient norm, clipping
 * and loss-scale factors; operation objects in backend/ops/optimizer.hpp), so an optimizer runs where its weights
 * live.
 */
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/optimizer.hpp"

namespace mpar::detail {

/**
 * @brief `B` runs the optimizer operations: `ops::adamw_update` (its lr and bias corrections given or in rank
 * memory, its weight decay uniform or per `DecayRun`), `ops::adamw_advance`, `ops::sgd_update`, `ops::sum_squares`,
 * `ops::update_factors` and `ops::scale`, with the semantics of their host reference (backend/ops/optimizer.hpp).
 */
template <class B>
concept optimizer_backend =
    supports<B, ops::adamw_update> && supports<B, ops::adamw_advance> && supports<B, ops::sgd_update> &&
    supports<B, ops::sum_squares> && supports<B, ops::update_factors> && supports<B, ops::scale>;

}  // namespace mpar::detail
