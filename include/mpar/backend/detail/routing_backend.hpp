#pragma once
/**
 * @file The `routing_backend` concept: a backend's row kernels that route tokens (MoE dispatch and combine).
 */
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace mpar::detail {

/**
 * @brief The routing family of `backend`: the row kernels that route tokens (MoE dispatch and combine),
 * with the semantics of their `mpar::host` reference (backend/host/row_kernels.hpp); `index` is
 * `std::int32_t` in rank memory: `gather_rows(rows, d, index, src, dst)`, `scatter_rows(rows, d, index, src,
 * dst)`, `scatter_add_rows(rows, d, index, weight, src, dst)` (accumulates; `weight` may be null) and its
 * backward `scatter_add_rows_backward(rows, d, index, weight, dy, src, dsrc, dot)`.
 *
 * The routing decisions themselves are one operation, `moe_route(tokens, experts, k, capacity, probs, choice,
 * accepted, route, route_token, route_weight, used, routed)` (reference: backend/host/moe_routing.hpp; CUDA:
 * gpu::moe_route): top-k of the gate probabilities, the per-expert capacity and the routing order, written to
 * rank memory, so a MoE layer decides where its tokens go without a host read; around it, with the same
 * reference: `moe_gate_stats(tokens, experts, k, probs, choice, routed, stats)` (the load-balancing
 * statistics and the dropped count), `moe_aux_loss(experts, k, alpha, stats, aux)`, `moe_slots(experts,
 * capacity, used, route_token, route_weight, slot_token, slot_weight)` (the static-size exchange's slots; an
 * empty slot has index -1, which the row kernels read as no row) and `moe_gate_backward(tokens, experts, k,
 * capacity, slot_token, dot, aux_grad, alpha, stats, dprobs)`.
 */
template <class B>
concept routing_backend = requires(const float* a, float* c, const std::int32_t* ids, std::size_t n) {
  B::gather_rows(n, n, ids, a, c);
  B::scatter_rows(n, n, ids, a, c);
  B::scatter_add_rows(n, n, ids, a, a, c);
  B::scatter_add_rows_backward(n, n, ids, a, a, a, c, c);
}
&&requires(const float* probs, std::int32_t* i, std::uint8_t* flag, float* w, std::size_t n) {
  // MoE routing decisions (backend/host/moe_routing.hpp).
  B::moe_route(n, n, n, n, probs, i, flag, i, i, w, i, i);
  B::moe_gate_stats(n, n, n, probs, i, i, w);
  B::moe_aux_loss(n, n, 0.1f, probs, w);
  B::moe_slots(n, n, i, i, probs, i, w);
  B::moe_gate_backward(n, n, n, n, i, probs, 1.0f, 0.1f, probs, w);
};

}  // namespace mpar::detail
