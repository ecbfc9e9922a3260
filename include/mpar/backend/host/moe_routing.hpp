#pragma once
/**
 * @file The host reference of the backends' MoE routing operations (see `routing_backend`): the routing
 * decisions of parallel::MoeMlp as plain loops, one rule per loop, so each reads as the rule it
 * implements, and the small operations around them (load-balancing statistics and loss, the slots of
 * the capacity-bounded exchange, the gate probabilities' gradient). `gpu::moe_route`
 * (backend/gpu/moe_routing.hpp) takes the same decisions with sorts and scans; backend/gpu/moe_ops.hpp has
 * the others.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace mpar::host {

/**
 * @brief Routes `tokens` tokens over `experts` experts from their gate probabilities `probs`
 * ([tokens, experts]); an assignment is `a = t * k + j`, the j-th choice of token t.
 * - `choice[a]`: token t's k most probable experts, most probable first, ties to the lower index (a NaN
 *   probability ranks below every number, so a token still gets k distinct experts);
 * - `accepted[a]` (1/0): each expert accepts at most `capacity` assignments, first choices of all
 *   tokens before second choices, tokens in index order within a choice rank;
 * - `route[i]` for `i < *routed`: the accepted assignments grouped by expert (ascending), tokens ascending
 *   within an expert, `route_token[i] = route[i] / k` and `route_weight[i] = probs[t, choice[a]]`; past
 *   `*routed`, `route` lists the dropped assignments ascending, with token -1 and weight 0;
 * - `used[e]`: the accepted assignments of expert e; `*routed`: their sum (`tokens * k - *routed` dropped).
 */
inline void moe_route(std::size_t tokens, std::size_t experts, std::size_t k, std::size_t capacity, const float* probs,
                      std::int32_t* choice, std::uint8_t* accepted, std::int32_t* route, std::int32_t* route_token,
                      float* route_weight, std::int32_t* used, std::int32_t* routed) {
  // top-k: k passes, each taking the best expert after the previous one in (p descending, index ascending)
  for (std::size_t t = 0; t < tokens; ++t) {
    const float* p = probs + t * experts;
    float last = std::numeric_limits<float>::infinity();
    std::size_t last_e = 0;
    for (std::size_t j = 0; j < k; ++j) {
      bool found = false;
      std::size_t best = 0;
      float best_p = 0.0f;
      for (std::size_t e = 0; e < experts; ++e) {
        const float v = std::isnan(p[e]) ? -std::numeric_limits<float>::infinity() : p[e];
        const bool after = j == 0 || v < last || (v == last && e > last_e);
        if (after && (!found || v > best_p)) found = true, best = e, best_p = v;
      }
      choice[t * k + j] = std::int32_t(best);
      last = best_p;
      last_e = best;
    }
  }
  // capacity: first choices of all tokens, then second choices, ...
  for (std::size_t e = 0; e < experts; ++e) used[e] = 0;
  for (std::size_t j = 0; j < k; ++j)
    for (std::size_t t = 0; t < tokens; ++t) {
      const std::size_t a = t * k + j, e = std::size_t(choice[a]);
      const bool ok = std::size_t(used[e]) < capacity;
      accepted[a] = ok ? 1 : 0;
      used[e] += ok ? 1 : 0;
    }
  // routing order: by expert, then token
  std::size_t i = 0;
  for (std::size_t e = 0; e < experts; ++e)
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t a = t * k + j;
        if (std::size_t(choice[a]) != e || !accepted[a]) continue;
        route[i] = std::int32_t(a);
        route_token[i] = std::int32_t(t);
        route_weight[i] = probs[t * experts + e];
        ++i;
      }
  *routed = std::int32_t(i);
  for (std::size_t a = 0; a < tokens * k; ++a)  // then the dropped assignments, ascending
    if (!accepted[a]) {
      route[i] = std::int32_t(a);
      route_token[i] = -1;
      route_weight[i] = 0.0f;
      ++i;
    }
}

/**
 * @brief The load-balancing statistics of `tokens` routed tokens, `stats[2 experts + 2]` (float): `[e]` the
 * assignments that chose expert e (before capacity), `[E + e]` the sum of the gate probabilities of e over
 * the tokens (in token order), `[2E]` the token count, `[2E + 1]` the assignments dropped by the capacity
 * (`tokens * k - *routed`). The first 2E + 1 are summed over the token group by the caller.
 */
inline void moe_gate_stats(std::size_t tokens, std::size_t experts, std::size_t k, const float* probs,
                           const std::int32_t* choice, const std::int32_t* routed, float* stats) {
  for (std::size_t i = 0; i < 2 * experts; ++i) stats[i] = 0.0f;
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t j = 0; j < k; ++j) stats[std::size_t(choice[t * k + j])] += 1.0f;
    for (std::size_t e = 0; e < experts; ++e) stats[experts + e] += probs[t * experts + e];
  }
  stats[2 * experts] = float(tokens);
  stats[2 * experts + 1] = float(tokens * k - std::size_t(*routed));
}

/**
 * @brief The load-balancing loss (Switch) from group-summed statistics (`moe_gate_stats`): `*aux = alpha E
 * sum_e f_e P_e`, `f_e = stats[e] / (G k)`, `P_e = stats[E + e] / G`, `G = stats[2E]` (0 if G = 0), in double.
 */
inline void moe_aux_loss(std::size_t experts, std::size_t k, float alpha, const float* stats, float* aux) {
  const double g = double(stats[2 * experts]);
  double sum = 0.0;
  if (g > 0)
    for (std::size_t e = 0; e < experts; ++e) {
      const float f = float(double(stats[e]) / (g * double(k)));
      sum += double(f) * double(stats[experts + e]) / g;
    }
  *aux = float(double(alpha) * double(experts) * sum);
}

/**
 * @brief The slots of a capacity-bounded exchange from `moe_route`'s output: slot `e * capacity + i` holds
 * expert e's i-th routed row (`route_token`, `route_weight` at its position in the routing order) for
 * `i < used[e]`, and is empty (token -1, weight 0) above. `experts * capacity` slots in all, whatever
 * the counts: the exchange's sizes are static.
 */
inline void moe_slots(std::size_t experts, std::size_t capacity, const std::int32_t* used,
                      const std::int32_t* route_token, const float* route_weight, std::int32_t* slot_token,
                      float* slot_weight) {
  std::size_t start = 0;
  for (std::size_t e = 0; e < experts; ++e) {
    const std::size_t n = std::size_t(used[e]);
    for (std::size_t i = 0; i < capacity; ++i) {
      slot_token[e * capacity + i] = i < n ? route_token[start + i] : -1;
      slot_weight[e * capacity + i] = i < n ? route_weight[start + i] : 0.0f;
    }
    start += n;
  }
}

/**
 * @brief The gradient of the gate probabilities `dprobs [tokens, experts]` (overwritten): the combine
 * weights' gradients `dot` of the slots (`moe_slots`; slot s is expert s / capacity) added in slot order,
 * then the load-balancing loss's `aux_grad * alpha * E * f_e / G` (f from the group-summed `stats`; none if
 * G = 0 or aux_grad = 0).
 */
inline void moe_gate_backward(std::size_t tokens, std::size_t experts, std::size_t k, std::size_t capacity,
                              const std::int32_t* slot_token, const float* dot, float aux_grad, float alpha,
                              const float* stats, float* dprobs) {
  for (std::size_t i = 0; i < tokens * experts; ++i) dprobs[i] = 0.0f;
  for (std::size_t s = 0; s < experts * capacity; ++s)
    if (slot_token[s] >= 0) dprobs[std::size_t(slot_token[s]) * experts + s / capacity] += dot[s];
  const double g = double(stats[2 * experts]);
  if (!(g > 0) || aux_grad == 0.0f) return;
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t e = 0; e < experts; ++e) {
      const float f = float(double(stats[e]) / (g * double(k)));
      dprobs[t * experts + e] += float(double(aux_grad) * double(alpha) * double(experts) * double(f) / g);
    }
}

}  // namespace mpar::host
