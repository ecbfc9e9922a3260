#pragma once
/**
 * @file Activation collectives on the tensor axis, as functions (used inside the layers) and as
 * layers (`AllReduce`, `GatherFeatures`) for composing a Stage by hand.
 *
 * Every function is a no-op copy on a one-rank group, so TP = 1 pays no communication.
 */
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

#include "mpar/comm/communicator.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/** @brief Sum of the Partial addends: in place, returns the replicated tensor. */
template <communicator C>
void all_reduce_sum(C& comm, Activation& x) {
  if (comm.size() > 1) comm.all_reduce(x.span(), ReduceOp::sum);
}

/** @brief Token-sharded `[T/p, n]` -> replicated `[T, n]` (all-gather of row blocks). */
template <communicator C>
[[nodiscard]] Activation gather_tokens(C& comm, const Activation& x) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return x;
  Activation full({x.extent(0) * p, x.extent(1)});
  comm.all_gather(std::span<const float>(x.span()), full.span());
  return full;
}

/** @brief Partial `[T, n]` -> token-sharded sum `[T/p, n]` (reduce-scatter of row blocks). */
template <communicator C>
[[nodiscard]] Activation reduce_scatter_tokens(C& comm, const Activation& x, std::string_view who) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return x;
  require(x.extent(0) % p == 0, who, " (tensor rank ", comm.rank(), "): ", x.extent(0),
          " tokens cannot be split evenly over ", p, " tensor ranks for sequence parallelism");
  Activation part({x.extent(0) / p, x.extent(1)});
  comm.reduce_scatter(std::span<const float>(x.span()), part.span(), ReduceOp::sum);
  return part;
}

/** @brief Feature-sharded `[T, n/p]` -> replicated `[T, n]` (all-gather, then interleave the column blocks). */
template <communicator C>
[[nodiscard]] Activation gather_features(C& comm, const Activation& x) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return x;
  const std::size_t t = x.extent(0), nl = x.extent(1);
  Activation stacked({p * t, nl});
  comm.all_gather(std::span<const float>(x.span()), stacked.span());
  Activation full({t, p * nl});
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t i = 0; i < t; ++i)
      for (std::size_t j = 0; j < nl; ++j) full.data()[i * p * nl + r * nl + j] = stacked.data()[(r * t + i) * nl + j];
  return full;
}

/** @brief This rank's column block of a replicated `[T, n]` (no communication). */
[[nodiscard]] inline Activation local_features(const Activation& x, std::size_t p, std::size_t rank) {
  const std::size_t n = x.extent(1), nl = n / p;
  return Activation(x.slice(1, rank * nl, (rank + 1) * nl));
}

/** @brief This rank's row block of a replicated `[T, n]` (no communication). */
[[nodiscard]] inline Activation local_tokens(const Activation& x, std::size_t p, std::size_t rank) {
  const std::size_t tl = x.extent(0) / p;
  return Activation(x.slice(0, rank * tl, (rank + 1) * tl));
}

/** @brief Layer: Partial<sum, tensor> -> Replicate (all-reduce forward; identity backward). */
template <communicator C>
class AllReduce : public detail::NoParameters {
 public:
  static constexpr std::string_view layer_kind = "AllReduce";
  using default_input = TensorPartial;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr Verdict accepts() {
    return std::is_same_v<L, TensorPartial> ? Verdict::ok : Verdict::layout_parameter_mismatch;
  }
  template <class L>
  using output_layout = Replicate;

  explicit AllReduce(C& comm) : comm_(&comm) {}
  Activation forward(const Activation& x, int = 0) {
    Activation y = x;
    all_reduce_sum(*comm_, y);
    return y;
  }
  // d(sum_r x_r)/dx_r = I: each rank's addend receives the replicated gradient unchanged.
  Activation backward(const Activation& dy, int = 0) { return dy; }
  void drop(int) {}

 private:
  C* comm_;
};

/** @brief Layer: Shard<1, tensor> -> Replicate (all-gather of features; backward keeps this rank's columns). */
template <communicator C>
class GatherFeatures : public detail::NoParameters {
 public:
  static constexpr std::string_view layer_kind = "GatherFeatures";
  using default_input = FeatureShard;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr Verdict accepts() {
    if constexpr (std::is_same_v<L, FeatureShard>) return Verdict::ok;
    else if constexpr (L::is_partial) return Verdict::linear_fed_partial;
    else return Verdict::needs_feature_shard;
  }
  template <class L>
  using output_layout = Replicate;

  explicit GatherFeatures(C& comm) : comm_(&comm) {}
  Activation forward(const Activation& x, int = 0) { return gather_features(*comm_, x); }
  Activation backward(const Activation& dy, int = 0) {
    return local_features(dy, std::size_t(comm_->size()), std::size_t(comm_->rank()));
  }
  void drop(int) {}

 private:
  C* comm_;
};

}  // namespace mpar::nn
