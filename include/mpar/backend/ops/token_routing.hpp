#pragma once
/**
 * @file The token-routing operations of a mixture of experts (parallel::MoeMlp), as operation objects (see
 * backend/ops/operation.hpp): the row moves of dispatch and combine (`gather_rows`, `scatter_rows`,
 * `scatter_add_rows` and its backward) and the routing decisions around the exchange (`moe_route`,
 * `moe_gate_stats`, `moe_aux_loss`, `moe_slots`, `moe_gate_backward`). Their host references are the plain loops of
 * backend/host/row_kernels.hpp and backend/host/moe_routing.hpp, whose comments give each rule in full; CUDA's are
 * backend/gpu/row_kernels.hpp, moe_routing.hpp and moe_ops.hpp.
 *
 * Rows are `d` floats wide and `index` is `std::int32_t` in rank memory; a negative index names no row (an empty
 * slot of the capacity-bounded exchange): a gather writes a zero row, a scatter skips it.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/moe_routing.hpp"
#include "mpar/backend/host/row_kernels.hpp"

namespace mpar::ops {

/** `dst[i, :] = src[index[i], :]` for `i < rows` (zero where `index[i] < 0`). */
struct gather_rows {
  static constexpr const char* name = "gather_rows";
  std::size_t rows = 0, d = 0;
  const std::int32_t* index = nullptr;
  const float* src = nullptr;
  float* dst = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(index), f(src), f(dst);
  }
};

/** `dst[index[i], :] = src[i, :]` for `i < rows` (distinct indices; negative ones skipped). */
struct scatter_rows {
  static constexpr const char* name = "scatter_rows";
  std::size_t rows = 0, d = 0;
  const std::int32_t* index = nullptr;
  const float* src = nullptr;
  float* dst = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(index), f(src), f(dst);
  }
};

/** `dst[index[i], :] += weight[i] * src[i, :]` in `i` order (accumulates; `weight` null: weight 1). */
struct scatter_add_rows {
  static constexpr const char* name = "scatter_add_rows";
  std::size_t rows = 0, d = 0;
  const std::int32_t* index = nullptr;
  const float* weight = nullptr;
  const float* src = nullptr;
  float* dst = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(index), f(weight), f(src), f(dst);
  }
};

/**
 * The backward of a weighted `scatter_add_rows` (the MoE combine): `dsrc[i, :] = weight[i] dy[index[i], :]` and
 * `dot[i] = <dy[index[i], :], src[i, :]>`, the gradient of `weight[i]` (both overwritten).
 */
struct scatter_add_rows_backward {
  static constexpr const char* name = "scatter_add_rows_backward";
  std::size_t rows = 0, d = 0;
  const std::int32_t* index = nullptr;
  const float* weight = nullptr;
  const float* dy = nullptr;
  const float* src = nullptr;
  float* dsrc = nullptr;
  float* dot = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(index), f(weight), f(dy), f(src), f(dsrc), f(dot);
  }
};

/**
 * The routing decisions of `tokens` tokens over `experts` experts from the gate probabilities `probs`
 * ([tokens, experts]), written to rank memory so that no host read decides where tokens go: each token's top-`k`
 * experts (`choice`), which of them the per-expert `capacity` accepts (`accepted`, first choices before second), the
 * accepted assignments in routing order (`route`, `route_token`, `route_weight`), each expert's count (`used`) and
 * their sum (`routed`). See `host::moe_route` for the rules.
 */
struct moe_route {
  static constexpr const char* name = "moe_route";
  std::size_t tokens = 0, experts = 0, k = 0, capacity = 0;
  const float* probs = nullptr;
  std::int32_t* choice = nullptr;
  std::uint8_t* accepted = nullptr;
  std::int32_t* route = nullptr;
  std::int32_t* route_token = nullptr;
  float* route_weight = nullptr;
  std::int32_t* used = nullptr;
  std::int32_t* routed = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(probs), f(choice), f(accepted), f(route), f(route_token), f(route_weight), f(used), f(routed);
  }
};

/**
 * The load-balancing statistics `stats[2 experts + 2]`: per expert the assignments that chose it and the sum of its
 * gate probabilities, the token count, and the assignments the capacity dropped (see `host::moe_gate_stats`).
 */
struct moe_gate_stats {
  static constexpr const char* name = "moe_gate_stats";
  std::size_t tokens = 0, experts = 0, k = 0;
  const float* probs = nullptr;
  const std::int32_t* choice = nullptr;
  const std::int32_t* routed = nullptr;
  float* stats = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(probs), f(choice), f(routed), f(stats);
  }
};

/** The Switch load-balancing loss `*aux = alpha E sum_e f_e P_e` from group-summed `stats`. */
struct moe_aux_loss {
  static constexpr const char* name = "moe_aux_loss";
  std::size_t experts = 0, k = 0;
  float alpha = 0;
  const float* stats = nullptr;
  float* aux = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(stats), f(aux);
  }
};

/**
 * The `experts * capacity` slots of the static-size exchange: slot `e * capacity + i` holds expert e's i-th routed
 * row for `i < used[e]` and is empty (token -1, weight 0) above.
 */
struct moe_slots {
  static constexpr const char* name = "moe_slots";
  std::size_t experts = 0, capacity = 0;
  const std::int32_t* used = nullptr;
  const std::int32_t* route_token = nullptr;
  const float* route_weight = nullptr;
  std::int32_t* slot_token = nullptr;
  float* slot_weight = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(used), f(route_token), f(route_weight), f(slot_token), f(slot_weight);
  }
};

/**
 * The gate probabilities' gradient `dprobs [tokens, experts]` (overwritten): the slots' combine-weight gradients
 * `dot` added in slot order, then the load-balancing loss's share `aux_grad alpha E f_e / G`.
 */
struct moe_gate_backward {
  static constexpr const char* name = "moe_gate_backward";
  std::size_t tokens = 0, experts = 0, k = 0, capacity = 0;
  const std::int32_t* slot_token = nullptr;
  const float* dot = nullptr;
  float aux_grad = 0, alpha = 0;
  const float* stats = nullptr;
  float* dprobs = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(slot_token), f(dot), f(stats), f(dprobs);
  }
};

inline void host_reference(const gather_rows& op) { host::gather_rows(op.rows, op.d, op.index, op.src, op.dst); }
inline void host_reference(const scatter_rows& op) { host::scatter_rows(op.rows, op.d, op.index, op.src, op.dst); }
inline void host_reference(const scatter_add_rows& op) {
  host::scatter_add_rows(op.rows, op.d, op.index, op.weight, op.src, op.dst);
}
inline void host_reference(const scatter_add_rows_backward& op) {
  host::scatter_add_rows_backward(op.rows, op.d, op.index, op.weight, op.dy, op.src, op.dsrc, op.dot);
}
inline void host_reference(const moe_route& op) {
  host::moe_route(op.tokens, op.experts, op.k, op.capacity, op.probs, op.choice, op.accepted, op.route, op.route_token,
                  op.route_weight, op.used, op.routed);
}
inline void host_reference(const moe_gate_stats& op) {
  host::moe_gate_stats(op.tokens, op.experts, op.k, op.probs, op.choice, op.routed, op.stats);
}
inline void host_reference(const moe_aux_loss& op) { host::moe_aux_loss(op.experts, op.k, op.alpha, op.stats, op.aux); }
inline void host_reference(const moe_slots& op) {
  host::moe_slots(op.experts, op.capacity, op.used, op.route_token, op.route_weight, op.slot_token, op.slot_weight);
}
inline void host_reference(const moe_gate_backward& op) {
  host::moe_gate_backward(op.tokens, op.experts, op.k, op.capacity, op.slot_token, op.dot, op.aux_grad, op.alpha,
                          op.stats, op.dprobs);
}

}  // namespace mpar::ops
