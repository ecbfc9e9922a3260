#pragma once
/**
 * @file The small MoE operations around `gpu::moe_route` (backend/gpu/moe_routing.hpp): the load-balancing
 * statistics and loss, the slots of the capacity-bounded exchange and the gate probabilities' gradient, with
 * the semantics of their host reference (backend/host/moe_routing.hpp) and the same float summation order, so
 * they agree with it bit for bit. They read and write a few `experts`- or `tokens x experts`-sized arrays:
 * simple kernels (a thread per expert, slot or element), nothing read back to the host.
 *
 * Include from a translation unit compiled by nvcc.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/kernels.hpp"  // grid_for, block_threads, pick, check_launch
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/backend/ops/token_routing.hpp"

namespace mpar::gpu {

namespace detail {

/** One thread per expert sums its column in token order (the host's order); thread 0 adds the counts. */
template <class = void>
__global__ void moe_gate_stats_kernel(std::size_t tokens, std::size_t experts, std::size_t k, const float* probs,
                                      const std::int32_t* choice, const std::int32_t* routed, float* stats) {
  for (std::size_t e = threadIdx.x; e < experts; e += blockDim.x) {
    float count = 0.0f, sum = 0.0f;
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t j = 0; j < k; ++j) count += std::size_t(choice[t * k + j]) == e ? 1.0f : 0.0f;
      sum += probs[t * experts + e];
    }
    stats[e] = count;
    stats[experts + e] = sum;
  }
  if (threadIdx.x == 0) {
    stats[2 * experts] = float(tokens);
    stats[2 * experts + 1] = float(tokens * k - std::size_t(*routed));
  }
}

template <class = void>
__global__ void moe_aux_loss_kernel(std::size_t experts, std::size_t k, float alpha, const float* stats, float* aux) {
  const double g = double(stats[2 * experts]);
  double sum = 0.0;
  if (g > 0)
    for (std::size_t e = 0; e < experts; ++e) {
      const float f = float(double(stats[e]) / (g * double(k)));
      sum += double(f) * double(stats[experts + e]) / g;
    }
  *aux = float(double(alpha) * double(experts) * sum);
}

template <class = void>
__global__ void moe_slots_kernel(std::size_t experts, std::size_t capacity, const std::int32_t* used,
                                 const std::int32_t* route_token, const float* route_weight, std::int32_t* slot_token,
                                 float* slot_weight) {
  const std::size_t n = experts * capacity;
  for (std::size_t s = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; s < n;
       s += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = s / capacity, i = s % capacity;
    std::size_t start = 0;
    for (std::size_t q = 0; q < e; ++q) start += std::size_t(used[q]);
    const bool full = i < std::size_t(used[e]);
    slot_token[s] = full ? route_token[start + i] : -1;
    slot_weight[s] = full ? route_weight[start + i] : 0.0f;
  }
}

/** dprobs = 0, then each slot's dot into its (token, expert): a token picks an expert once, so no two collide. */
template <class = void>
__global__ void moe_gate_fold_kernel(std::size_t experts, std::size_t capacity, const std::int32_t* slot_token,
                                     const float* dot, float* dprobs) {
  const std::size_t n = experts * capacity;
  for (std::size_t s = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; s < n;
       s += std::size_t(gridDim.x) * blockDim.x)
    if (slot_token[s] >= 0) dprobs[std::size_t(slot_token[s]) * experts + s / capacity] = 0.0f + dot[s];
}

template <class = void>
__global__ void moe_gate_aux_kernel(std::size_t tokens, std::size_t experts, std::size_t k, float aux_grad, float alpha,
                                    const float* stats, float* dprobs) {
  const double g = double(stats[2 * experts]);
  if (!(g > 0) || aux_grad == 0.0f) return;
  const std::size_t n = tokens * experts;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t e = i % experts;
    const float f = float(double(stats[e]) / (g * double(k)));
    dprobs[i] += float(double(aux_grad) * double(alpha) * double(experts) * double(f) / g);
  }
}

}  // namespace detail

/** host::moe_gate_stats on the device. */
inline void moe_gate_stats(std::size_t tokens, std::size_t experts, std::size_t k, const float* probs,
                           const std::int32_t* choice, const std::int32_t* routed, float* stats,
                           cudaStream_t s = nullptr) {
  MPAR_LAUNCH(detail::moe_gate_stats_kernel<>, 1, detail::block_threads, 0, detail::pick(s), tokens, experts, k, probs,
              choice, routed, stats);
  check_launch("gpu::moe_gate_stats");
}
/** host::moe_aux_loss on the device (one thread: E terms). */
inline void moe_aux_loss(std::size_t experts, std::size_t k, float alpha, const float* stats, float* aux,
                         cudaStream_t s = nullptr) {
  MPAR_LAUNCH(detail::moe_aux_loss_kernel<>, 1, 1, 0, detail::pick(s), experts, k, alpha, stats, aux);
  check_launch("gpu::moe_aux_loss");
}
/** host::moe_slots on the device. */
inline void moe_slots(std::size_t experts, std::size_t capacity, const std::int32_t* used,
                      const std::int32_t* route_token, const float* route_weight, std::int32_t* slot_token,
                      float* slot_weight, cudaStream_t s = nullptr) {
  if (!experts || !capacity) return;
  MPAR_LAUNCH(detail::moe_slots_kernel<>, detail::grid_for(experts * capacity), detail::block_threads, 0,
              detail::pick(s), experts, capacity, used, route_token, route_weight, slot_token, slot_weight);
  check_launch("gpu::moe_slots");
}
/** host::moe_gate_backward on the device. */
inline void moe_gate_backward(std::size_t tokens, std::size_t experts, std::size_t k, std::size_t capacity,
                              const std::int32_t* slot_token, const float* dot, float aux_grad, float alpha,
                              const float* stats, float* dprobs, cudaStream_t s = nullptr) {
  s = detail::pick(s);
  if (!tokens || !experts) return;
  check(cudaMemsetAsync(dprobs, 0, tokens * experts * sizeof(float), s), "cudaMemsetAsync(dprobs)");
  if (capacity) {
    MPAR_LAUNCH(detail::moe_gate_fold_kernel<>, detail::grid_for(experts * capacity), detail::block_threads, 0, s,
                experts, capacity, slot_token, dot, dprobs);
    check_launch("gpu::moe_gate_backward(fold)");
  }
  MPAR_LAUNCH(detail::moe_gate_aux_kernel<>, detail::grid_for(tokens * experts), detail::block_threads, 0, s, tokens,
              experts, k, aux_grad, alpha, stats, dprobs);
  check_launch("gpu::moe_gate_backward(aux)");
}

// The operation objects (backend/ops/token_routing.hpp), as CudaBackend::run launches them.
inline void launch(const ops::moe_gate_stats& op, cudaStream_t s) {
  moe_gate_stats(op.tokens, op.experts, op.k, op.probs, op.choice, op.routed, op.stats, s);
}
inline void launch(const ops::moe_aux_loss& op, cudaStream_t s) {
  moe_aux_loss(op.experts, op.k, op.alpha, op.stats, op.aux, s);
}
inline void launch(const ops::moe_slots& op, cudaStream_t s) {
  moe_slots(op.experts, op.capacity, op.used, op.route_token, op.route_weight, op.slot_token, op.slot_weight, s);
}
inline void launch(const ops::moe_gate_backward& op, cudaStream_t s) {
  moe_gate_backward(op.tokens, op.experts, op.k, op.capacity, op.slot_token, op.dot, op.aux_grad, op.alpha, op.stats,
                    op.dprobs, s);
}

}  // namespace mpar::gpu
