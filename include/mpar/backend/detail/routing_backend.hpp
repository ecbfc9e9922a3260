#pragma once
/**
 * @file The `routing_backend` concept: a backend that runs the token-routing operations of a mixture of experts
 * (dispatch and combine rows, the routing decisions; operation objects in backend/ops/token_routing.hpp), an
 * optional family of `backend` that only parallel::MoeMlp requires.
 */
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/token_routing.hpp"

namespace mpar::detail {

/** @brief `B` runs every token-routing operation of backend/ops/token_routing.hpp. */
template <class B>
concept routing_backend =
    supports<B, ops::gather_rows> && supports<B, ops::scatter_rows> && supports<B, ops::scatter_add_rows> &&
    supports<B, ops::scatter_add_rows_backward> && supports<B, ops::moe_route> && supports<B, ops::moe_gate_stats> &&
    supports<B, ops::moe_aux_loss> && supports<B, ops::moe_slots> && supports<B, ops::moe_gate_backward>;

}  // namespace mpar::detail
