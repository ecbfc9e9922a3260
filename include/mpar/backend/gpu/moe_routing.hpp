#pragma once
/**
 * @file MoE routing on the device: top-k of the gate probabilities, the per-expert capacity and the
 * token permutation, with the decisions of parallel::MoeMlp's host loops (parallel/moe.hpp).
 *
 * The rules (the host's, bit for bit): token t picks its k most probable experts, ties to the lower
 * index; an expert accepts at most `capacity` assignments, first choices of all tokens before second
 * choices, tokens in index order; the accepted assignments are routed grouped by expert, tokens in
 * index order within an expert.
 *
 * How, with CUB where it does the job:
 * - top-k: one thread per token selects k of E by k sweeps (E is tens of experts: a per-token sort or a
 *   segmented radix sort would move more data than it reads);
 * - capacity: the assignments in priority order (j major, then t) are stably radix-sorted by expert
 *   (`cub::DeviceRadixSort::SortPairs`), counted per expert (`cub::DeviceHistogram::HistogramEven`), the
 *   counts turned into segment starts (`cub::DeviceScan::ExclusiveSum`); an assignment is accepted when
 *   its position in its expert's segment is below the capacity;
 * - permutation: every assignment gets the key `e * T + t` if accepted and `E * T + a` otherwise (unique,
 *   rejected ones last), and one more radix sort puts the routed rows first in the host's order; the
 *   routed count is `cub::DeviceReduce::Sum` of the per-expert accepted counts.
 * Everything stays in device memory (no host read): the counts feed the all-to-all's size exchange.
 *
 * Include from a translation unit compiled by nvcc, or by g++ with MPAR_CUDA_EMULATION (backend/gpu/runtime.hpp).
 */
#include <cstddef>
#include <cstdint>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/kernels.hpp"  // grid_for, block_threads, pick, check_launch
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime and CUB, or their emulation
#include "mpar/backend/ops/token_routing.hpp"
#include "mpar/core/error.hpp"

namespace mpar::gpu {

/** @brief Where moe_route writes its decisions: caller-owned device arrays (a = t * k + j is an assignment). */
struct MoeRouting {
  std::int32_t* choice = nullptr;       ///< [T k]: the expert of assignment a (the j-th choice of token t)
  std::uint8_t* accepted = nullptr;     ///< [T k]: 1 if the capacity admitted assignment a
  std::int32_t* route = nullptr;        ///< [T k]: the first `*routed` are the accepted a's in routing order
  std::int32_t* route_token = nullptr;  ///< [T k]: route[i] / k, the row gather_rows reads
  float* route_weight = nullptr;        ///< [T k]: probs[t, choice[a]], the combine weight
  std::int32_t* used = nullptr;         ///< [E]: accepted assignments per expert (the all-to-all's row counts)
  std::int32_t* routed = nullptr;       ///< [1]: sum of used (T k - routed were dropped)
};

namespace detail {

/** One thread per token: k sweeps, each taking the most probable expert not yet taken (ties: lower index). */
template <class = void>
__global__ void moe_topk_kernel(std::size_t tokens, std::size_t experts, std::size_t k, const float* probs,
                                std::int32_t* choice, std::int32_t* prio_expert, std::int32_t* prio_index) {
  const std::size_t t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  const float* p = probs + t * experts;
  float last = INFINITY;
  std::int64_t last_e = -1;
  for (std::size_t j = 0; j < k; ++j) {
    // The next in the order (p descending, index ascending) after (last, last_e).
    std::int64_t best = -1;
    float bp = -INFINITY;
    for (std::size_t e = 0; e < experts; ++e) {
      const float v = isnan(p[e]) ? -INFINITY : p[e];  // a NaN still yields k distinct, valid experts
      const bool after = v < last || (v == last && std::int64_t(e) > last_e);
      if (after && (best < 0 || v > bp)) best = std::int64_t(e), bp = v;
    }
    choice[t * k + j] = std::int32_t(best);
    // The capacity's priority order: first choices of all tokens, then second choices, ...
    prio_expert[j * tokens + t] = std::int32_t(best);
    prio_index[j * tokens + t] = std::int32_t(t * k + j);
    last = bp;
    last_e = best;
  }
}

/** Accepts the first `capacity` assignments of each expert's segment (sorted stably by expert). */
template <class = void>
__global__ void moe_capacity_kernel(std::size_t n, std::size_t tokens, std::size_t experts, std::size_t capacity,
                                    const std::int32_t* sorted_expert, const std::int32_t* sorted_index,
                                    const std::int32_t* start, std::uint8_t* accepted, std::uint32_t* route_key) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::int32_t e = sorted_expert[i], a = sorted_index[i];
    const bool ok = i - std::size_t(start[e]) < capacity;
    accepted[a] = ok ? 1 : 0;
    const std::size_t k = n / tokens, t = std::size_t(a) / k;
    route_key[a] = ok ? std::uint32_t(std::size_t(e) * tokens + t) : std::uint32_t(experts * tokens + std::size_t(a));
  }
}
/** used[e] = min(count[e], capacity) */
template <class = void>
__global__ void moe_used_kernel(std::size_t experts, std::size_t capacity, const std::int32_t* count,
                                std::int32_t* used) {
  for (std::size_t e = threadIdx.x; e < experts; e += blockDim.x)
    used[e] = std::int32_t(std::size_t(count[e]) < capacity ? std::size_t(count[e]) : capacity);
}

/** The routed rows' token and combine weight. */
template <class = void>
__global__ void moe_route_rows_kernel(std::size_t n, std::size_t k, std::size_t experts, const std::int32_t* route,
                                      const std::int32_t* choice, const float* probs, const std::int32_t* routed,
                                      std::int32_t* route_token, float* route_weight) {
  const std::size_t m = std::size_t(*routed);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    if (i >= m) {  // past the routed rows: defined values, never read by the row kernels
      route_token[i] = -1;
      route_weight[i] = 0.0f;
      continue;
    }
    const std::size_t a = std::size_t(route[i]), t = a / k;
    route_token[i] = std::int32_t(t);
    route_weight[i] = probs[t * experts + std::size_t(choice[a])];
  }
}

template <class = void>
__global__ void iota_kernel(std::size_t n, std::int32_t* x) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = std::int32_t(i);
}

}  // namespace detail

/**
 * @brief Routes `tokens` tokens over `experts` experts from their gate probabilities `probs`
 * ([tokens, experts], device): top-`k` choices, at most `capacity` accepted assignments per expert,
 * and the routing permutation, into `out` (see MoeRouting). Enqueued on `s`; device temporaries are
 * allocated and freed in stream order; nothing is read back to the host.
 */
inline void moe_route(std::size_t tokens, std::size_t experts, std::size_t k, std::size_t capacity, const float* probs,
                      const MoeRouting& out, cudaStream_t s = nullptr) {
  require(experts >= 1 && k >= 1 && k <= experts, "gpu::moe_route: top_k = ", k, " must be in [1, experts = ", experts,
          "]");
  // Keys e * T + t and E * T + a must fit the 32-bit radix keys; indices t * k + j fit an int32.
  require(tokens * k < (std::size_t(1) << 31) && (experts + k) * tokens < (std::size_t(1) << 32),
          "gpu::moe_route: ", tokens, " tokens x ", experts, " experts (top ", k,
          ") exceed the 32-bit routing keys. "
          "Fix: route fewer tokens per call");
  s = detail::pick(s);
  const std::size_t n = tokens * k;
  if (n == 0) {
    check(cudaMemsetAsync(out.used, 0, experts * sizeof(std::int32_t), s), "cudaMemsetAsync(used)");
    check(cudaMemsetAsync(out.routed, 0, sizeof(std::int32_t), s), "cudaMemsetAsync(routed)");
    return;
  }
  const int ni = int(n), ei = int(experts);
  DeviceBuffer<std::int32_t> prio_e(n, s), prio_i(n, s), sorted_e(n, s), sorted_i(n, s), count(experts, s),
      start(experts, s), identity(n, s);
  DeviceBuffer<std::uint32_t> key(n, s), sorted_key(n, s);
  const unsigned blocks = unsigned((tokens + detail::block_threads - 1) / detail::block_threads);
  MPAR_LAUNCH(detail::moe_topk_kernel<>, blocks, detail::block_threads, 0, s, tokens, experts, k, probs, out.choice,
              prio_e.data(), prio_i.data());
  check_launch("gpu::moe_route(top-k)");

  // One temporary-storage block, sized for the largest of the CUB calls.
  std::size_t bytes = 0, b = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, b, prio_e.data(), sorted_e.data(), prio_i.data(), sorted_i.data(), ni,
                                        0, 32, s),
        "cub::DeviceRadixSort::SortPairs(size)");
  bytes = b > bytes ? b : bytes;
  check(cub::DeviceHistogram::HistogramEven(nullptr, b, prio_e.data(), count.data(), ei + 1, 0, ei, ni, s),
        "cub::DeviceHistogram::HistogramEven(size)");
  bytes = b > bytes ? b : bytes;
  check(cub::DeviceScan::ExclusiveSum(nullptr, b, count.data(), start.data(), ei, s),
        "cub::DeviceScan::ExclusiveSum(size)");
  bytes = b > bytes ? b : bytes;
  check(cub::DeviceRadixSort::SortPairs(nullptr, b, key.data(), sorted_key.data(), identity.data(), out.route, ni, 0,
                                        32, s),
        "cub::DeviceRadixSort::SortPairs(size)");
  bytes = b > bytes ? b : bytes;
  check(cub::DeviceReduce::Sum(nullptr, b, out.used, out.routed, ei, s), "cub::DeviceReduce::Sum(size)");
  bytes = b > bytes ? b : bytes;
  DeviceBuffer<std::uint8_t> temp(bytes ? bytes : 1, s);

  // Capacity: stable sort of the priority-ordered assignments by expert, segment starts, acceptance.
  b = bytes;
  check(cub::DeviceRadixSort::SortPairs(temp.data(), b, prio_e.data(), sorted_e.data(), prio_i.data(), sorted_i.data(),
                                        ni, 0, 32, s),
        "cub::DeviceRadixSort::SortPairs(by expert)");
  b = bytes;
  check(cub::DeviceHistogram::HistogramEven(temp.data(), b, prio_e.data(), count.data(), ei + 1, 0, ei, ni, s),
        "cub::DeviceHistogram::HistogramEven(experts)");
  b = bytes;
  check(cub::DeviceScan::ExclusiveSum(temp.data(), b, count.data(), start.data(), ei, s),
        "cub::DeviceScan::ExclusiveSum");
  MPAR_LAUNCH(detail::moe_capacity_kernel<>, detail::grid_for(n), detail::block_threads, 0, s, n, tokens, experts,
              capacity, sorted_e.data(), sorted_i.data(), start.data(), out.accepted, key.data());
  check_launch("gpu::moe_route(capacity)");
  MPAR_LAUNCH(detail::moe_used_kernel<>, 1, detail::block_threads, 0, s, experts, capacity, count.data(), out.used);
  check_launch("gpu::moe_route(used)");

  // Permutation: routed rows first, grouped by expert, tokens ascending.
  MPAR_LAUNCH(detail::iota_kernel<>, detail::grid_for(n), detail::block_threads, 0, s, n, identity.data());
  check_launch("gpu::moe_route(iota)");
  b = bytes;
  check(cub::DeviceRadixSort::SortPairs(temp.data(), b, key.data(), sorted_key.data(), identity.data(), out.route, ni,
                                        0, 32, s),
        "cub::DeviceRadixSort::SortPairs(routing order)");
  b = bytes;
  check(cub::DeviceReduce::Sum(temp.data(), b, out.used, out.routed, ei, s), "cub::DeviceReduce::Sum(routed)");
  MPAR_LAUNCH(detail::moe_route_rows_kernel<>, detail::grid_for(n), detail::block_threads, 0, s, n, k, experts,
              out.route, out.choice, probs, out.routed, out.route_token, out.route_weight);
  check_launch("gpu::moe_route(rows)");
}

/** `ops::moe_route` as CudaBackend::run launches it: the sorts and scans above, nothing read back. */
inline void launch(const ops::moe_route& op, cudaStream_t s) {
  moe_route(op.tokens, op.experts, op.k, op.capacity, op.probs,
            MoeRouting{op.choice, op.accepted, op.route, op.route_token, op.route_weight, op.used, op.routed}, s);
}

}  // namespace mpar::gpu
