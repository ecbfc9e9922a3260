#pragma once
/**
 * @file Redistributions as layers (`AllReduce`, `GatherFeatures`) for composing a Stage by hand; the
 * collectives themselves, with their backward duals, are in redistribute.hpp.
 */
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

#include "mpar/comm/communicator.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/redistribute.hpp"

namespace mpar::nn {

/** @brief Layer: Partial<sum, tensor> -> Replicate (all-reduce forward; identity backward). */
template <communicator C>
class AllReduce : public detail::NoParameters, public detail::TypedLayer<AllReduce<C>> {
  using Typed = detail::TypedLayer<AllReduce<C>>;

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "AllReduce";
  using default_input = TensorPartial;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    static_assert(std::is_same_v<L, TensorPartial>,
                  "mpar::nn::AllReduce sums Partial<sum, tensor> addends but is fed another layout (see L above): it "
                  "would multiply a replicated tensor by TP. Fix: AllReduce only after a RowParallel with "
                  "RowReduce::none, and remove it elsewhere");
    return std::is_same_v<L, TensorPartial>;
  }
  template <class L>
  using output_layout = Replicate;

  explicit AllReduce(C& comm) : comm_(&comm) {}
  void drop(int) {}

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int) {
    return ReduceToReplicate::forward(*comm_, Act<TensorPartial>(x)).tensor();
  }
  Activation do_backward(const Activation& dy, int) {
    return ReduceToReplicate::backward(*comm_, Act<Replicate>(dy)).tensor();
  }
  C* comm_;
};

/** @brief Layer: Shard<1, tensor> -> Replicate (all-gather of features; backward keeps this rank's columns). */
template <communicator C>
class GatherFeatures : public detail::NoParameters, public detail::TypedLayer<GatherFeatures<C>> {
  using Typed = detail::TypedLayer<GatherFeatures<C>>;

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "GatherFeatures";
  using default_input = FeatureShard;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    static_assert(
        std::is_same_v<L, FeatureShard>,
        "mpar::nn::GatherFeatures all-gathers a feature-sharded tensor (Shard<1, tensor>) but is fed another "
        "layout (see L above). Fix: put it right after a ColumnParallel (for a Partial tensor use AllReduce)");
    return std::is_same_v<L, FeatureShard>;
  }
  template <class L>
  using output_layout = Replicate;

  explicit GatherFeatures(C& comm) : comm_(&comm) {}
  void drop(int) {}

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int) {
    return GatherFeaturesOf::forward(*comm_, Act<FeatureShard>(x)).tensor();
  }
  Activation do_backward(const Activation& dy, int) {
    return GatherFeaturesOf::backward(*comm_, Act<Replicate>(dy)).tensor();
  }
  C* comm_;
};

}  // namespace mpar::nn
