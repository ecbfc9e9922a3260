#pragma once
/**
 * @file Gradient clipping by the global norm, correct on any tensor x pipeline x data mesh.
 *
 * The global norm is that of the full (unsharded, single-model) gradient. Each element must be counted
 * exactly once:
 * - a parameter sharded over the tensor axis contributes its local sum of squares, summed over the
 *   tensor group;
 * - a parameter replicated over the tensor axis (`nn::Parameter::sharded_over_tensor == false`) holds the
 *   same gradient on every tensor rank: it is counted once, never summed over the tensor group;
 * - pipeline stages own distinct parameters: their sums are added over the pipeline group;
 * - data-parallel replicas hold the same (already averaged) gradient: they are NOT summed;
 * - with a mixture of experts, expert parameters (layout sharded on the `expert` axis) differ between expert
 *   ranks and are summed over the expert group; every other parameter is replicated over it.
 * The local sums of squares and the scaling run on the compute backend `B` (HostBackend unless given:
 * `grad_norm<CudaBackend>(params, tensor, pipeline)`); the host accumulates in double.
 */
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::optim {

/** @brief Whether a parameter is split over the expert axis (its layout shards a dimension on `expert`). */
[[nodiscard]] inline bool sharded_over_expert(const nn::Parameter& p) {
  return p.layout.find("expert") != std::string::npos;
}

/** @brief Local sums of squares of a parameter set, split by which groups hold distinct parts of them. */
struct GradSquares {
  double tensor_sharded = 0.0;  ///< parameters sharded over the tensor axis (sum these over the tensor group)
  double replicated = 0.0;      ///< parameters every tensor rank holds whole (count once)
  double expert_tensor_sharded = 0.0;  ///< expert parameters also sharded over the tensor axis
  double expert_replicated = 0.0;      ///< expert parameters whole on every tensor rank
};

/** @brief The local sums of squares of the gradients of `params`, each parameter's by `B::sum_squares`. */
template <backend B = HostBackend>
[[nodiscard]] GradSquares grad_squares(std::span<nn::Parameter* const> params) {
  GradSquares s;
  for (const auto* p : params) {
    const double acc = p->grad.empty() ? 0.0 : B::sum_squares(p->grad.size(), p->grad.data());
    if (sharded_over_expert(*p)) (p->sharded_over_tensor ? s.expert_tensor_sharded : s.expert_replicated) += acc;
    else (p->sharded_over_tensor ? s.tensor_sharded : s.replicated) += acc;
  }
  return s;
}

namespace detail {
struct NoGroup {};

/** Combines local sums into the global squared norm over the tensor, pipeline and expert groups given. */
template <class TC, class PC, class EC = NoGroup>
[[nodiscard]] double global_squares(GradSquares s, TC* tensor, PC* pipeline, EC* expert = nullptr) {
  if constexpr (!std::is_same_v<TC, NoGroup>) {
    Buffer<double> buf{s.tensor_sharded, s.expert_tensor_sharded};  // rank memory: it is communicated
    tensor->all_reduce(std::span<double>(buf), ReduceOp::sum);
    s.tensor_sharded = buf[0];
    s.expert_tensor_sharded = buf[1];
  }
  // Expert ranks hold different experts: their sums add up over the expert group; the other parameters are
  // replicated over it (like data replicas) and count once.
  Buffer<double> experts{s.expert_tensor_sharded + s.expert_replicated};
  if constexpr (!std::is_same_v<EC, NoGroup>) expert->all_reduce(std::span<double>(experts), ReduceOp::sum);
  Buffer<double> total{s.tensor_sharded + s.replicated + experts[0]};
  if constexpr (!std::is_same_v<PC, NoGroup>) pipeline->all_reduce(std::span<double>(total), ReduceOp::sum);
  return total[0];
}
}  // namespace detail

/** @brief The global gradient norm on one rank (no model parallelism). */
template <backend B = HostBackend>
[[nodiscard]] double grad_norm(std::span<nn::Parameter* const> params) {
  return std::sqrt(detail::global_squares<detail::NoGroup, detail::NoGroup>(grad_squares<B>(params), nullptr, nullptr));
}
/** @brief The global gradient norm under tensor parallelism (`tensor`: this rank's tensor group). */
template <backend B = HostBackend, communicator TC>
[[nodiscard]] double grad_norm(std::span<nn::Parameter* const> params, TC& tensor) {
  return std::sqrt(detail::global_squares<TC, detail::NoGroup>(grad_squares<B>(params), &tensor, nullptr));
}
/** @brief The global gradient norm under tensor and pipeline parallelism. Never pass the data group. */
template <backend B = HostBackend, communicator TC, communicator PC>
[[nodiscard]] double grad_norm(std::span<nn::Parameter* const> params, TC& tensor, PC& pipeline) {
  return std::sqrt(detail::global_squares<TC, PC>(grad_squares<B>(params), &tensor, &pipeline));
}
/**
 * @brief The global gradient norm with experts spread over `expert` as well (mixture of experts): expert
 * parameters (`sharded_over_expert`) are summed over the expert group, the others counted once.
 */
template <backend B = HostBackend, communicator TC, communicator PC, communicator EC>
[[nodiscard]] double grad_norm(std::span<nn::Parameter* const> params, TC& tensor, PC& pipeline, EC& expert) {
  return std::sqrt(detail::global_squares<TC, PC, EC>(grad_squares<B>(params), &tensor, &pipeline, &expert));
}

/**
 * @brief The factor that brings a gradient of norm `norm` to at most `max_norm`: `min(1, max_norm / (norm + 1e-6))`.
 * A non-finite norm gives 1 (nothing to rescale meaningfully; the loss scaler skips such steps).
 */
[[nodiscard]] inline float clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm) || max_norm <= 0.0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

/** @brief Multiplies every gradient by `factor` (`B::scale`). */
template <backend B = HostBackend>
void scale_grads(std::span<nn::Parameter* const> params, float factor) {
  if (factor == 1.0f) return;
  for (auto* p : params)
    if (!p->grad.empty()) B::scale(p->grad.size(), factor, p->grad.data());
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
