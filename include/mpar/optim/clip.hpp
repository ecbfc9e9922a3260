#pragma once
/**
 * @file Gradient clipping by the global norm, correct on any tensor x pipeline x data mesh.
 *
 * The global norm is that of the full (unsharded, single-model) gradient. Each element must be counted
 * exactly once:
 * - a parameter sharded over the tensor axis contributes its local sum of squares, summed over the
 *   tensor group;
 * - a parameter replicated over the tensor axis (`nn::Parameter::sharded_over_tensor == false`) holds the
 *   same gradient on every tensor rank: it is counted once, by tensor rank 0;
 * - pipeline stages own distinct parameters: their sums are added over the pipeline group;
 * - data-parallel replicas hold the same (already averaged) gradient: they are NOT summed;
 * - with a mixture of experts, expert parameters (layout sharded on the `expert` axis) differ between expert
 *   ranks and are summed over the expert group; every other parameter is replicated over it and counted by
 *   expert rank 0.
 * Because each rank leaves out what another rank of its group counts, one scalar per rank suffices: the
 * local sums accumulate into a double in rank memory (`ops::sum_squares`) and are all-reduced there over the
 * groups, so the whole norm is computed without a host read (`global_grad_squares`); `grad_norm` reads the
 * result once for callers that want a number.
 */
#include <cmath>
#include <cstddef>
#include <span>
#include <string>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/ops/optimizer.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::optim {

/** @brief Whether a parameter is split over the expert axis (its layout shards a dimension on `expert`). */
[[nodiscard]] inline bool sharded_over_expert(const nn::Parameter& p) {
  return p.layout.find("expert") != std::string::npos;
}

/**
 * @brief Which parameters this rank counts in the global norm: a parameter whole on every tensor rank only
 * on tensor rank 0 (`tensor_rank0`), a parameter outside the experts only on expert rank 0 (`expert_rank0`).
 */
struct SquaresShare {
  bool tensor_rank0 = true;
  bool expert_rank0 = true;
  [[nodiscard]] bool counts(const nn::Parameter& p) const {
    return (p.sharded_over_tensor || tensor_rank0) && (sharded_over_expert(p) || expert_rank0);
  }
};

/**
 * @brief The share of the squared norm over `groups...` (none, the tensor group, tensor and pipeline, or
 * tensor, pipeline and expert groups) that this rank counts.
 */
[[nodiscard]] inline SquaresShare squares_share() { return {}; }
template <communicator TC>
[[nodiscard]] SquaresShare squares_share(TC& tensor) {
  return {tensor.rank() == 0, true};
}
template <communicator TC, communicator PC>
[[nodiscard]] SquaresShare squares_share(TC& tensor, PC&) {
  return {tensor.rank() == 0, true};
}
template <communicator TC, communicator PC, communicator EC>
[[nodiscard]] SquaresShare squares_share(TC& tensor, PC&, EC& expert) {
  return {tensor.rank() == 0, expert.rank() == 0};
}

/** @brief Adds the squares of the gradients this rank counts (`share`) into `*acc` (rank memory), by `ops::sum_squares`. */
template <backend B = HostBackend>
void accumulate_grad_squares(std::span<nn::Parameter* const> params, SquaresShare share, double* acc) {
  for (const auto* p : params)
    if (!p->grad.empty() && share.counts(*p))
      B::run(ops::sum_squares{.n = p->grad.size(), .x = p->grad.data(), .acc = acc});
}

/** @brief All-reduces (sum) the scalar `acc` (rank memory) over each of `groups...`. */
template <communicator... Groups>
void sum_over([[maybe_unused]] double* acc, Groups&... groups) {
  (groups.all_reduce(std::span<double>(acc, 1), ReduceOp::sum), ...);
}

/**
 * @brief The global squared gradient norm into `*acc` (rank memory; it is overwritten), without a host read:
 * `groups...` are none, the tensor group, the tensor and pipeline groups, or tensor, pipeline and expert
 * groups. Never pass the data group (replicas hold the same gradient).
 */
template <backend B = HostBackend, communicator... Groups>
  requires(sizeof...(Groups) <= 3)
void global_grad_squares(std::span<nn::Parameter* const> params, double* acc, Groups&... groups) {
  zero_in_rank<B>(acc, 1);
  accumulate_grad_squares<B>(params, squares_share(groups...), acc);
  sum_over(acc, groups...);
}

/**
 * @brief The global gradient norm (see `global_grad_squares` for `groups...`), read back to the host: one
 * synchronisation; a training step uses `global_grad_squares` and `ops::update_factors` instead.
 */
template <backend B = HostBackend, communicator... Groups>
  requires(sizeof...(Groups) <= 3)
[[nodiscard]] double grad_norm(std::span<nn::Parameter* const> params, Groups&... groups) {
  // Rank memory, uninitialised (a zero fill would be a host write): zeroed, accumulated and communicated by `B`.
  Buffer<double> acc = B::template allocate<double>(1);
  global_grad_squares<B>(params, acc.data(), groups...);
  double squares = 0;
  copy_to_host<B>(acc.data(), &squares, 1);
  return std::sqrt(squares);
}

/**
 * @brief The factor that brings a gradient of norm `norm` to at most `max_norm`: `min(1, max_norm / (norm + 1e-6))`.
 * A non-finite norm gives 1 (nothing to rescale meaningfully; the loss scaler skips such steps).
 * `host::update_factors` computes the same on the device side of a step.
 */
[[nodiscard]] inline float clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm) || max_norm <= 0.0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

/** @brief Multiplies every gradient by `factor` (`ops::scale`). */
template <backend B = HostBackend>
void scale_grads(std::span<nn::Parameter* const> params, float factor) {
  if (factor == 1.0f) return;
  for (auto* p : params)
    if (!p->grad.empty()) B::run(ops::scale{.n = p->grad.size(), .factor = factor, .x = p->grad.data()});
}

/**
 * @brief Clips gradients in place to global norm `max_norm` and returns the norm before clipping.
 * `groups...` are none, the tensor group, the tensor and pipeline groups, or tensor, pipeline and expert groups
 * (see `grad_norm`); the norm and the scaling run on backend `B`.
 */
template <backend B = HostBackend, communicator... Groups>
  requires(sizeof...(Groups) <= 3)
double clip_grad_norm(std::span<nn::Parameter* const> params, double max_norm, Groups&... groups) {
  const double norm = grad_norm<B>(params, groups...);
  scale_grads<B>(params, clip_coefficient(norm, max_norm));
  return norm;
}

}  // namespace mpar::optim
