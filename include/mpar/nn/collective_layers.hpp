#pragma once
/**
 * @file Redistributions as layers (`AllReduce`, `GatherFeatures`) for composing a Stage by hand; the
 * collectives themselves, with their backward duals, are in redistributions.hpp.
 */
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/redistributions.hpp"

namespace mpar::nn {

/** @brief Layer: Partial<sum, tensor> -> Replicate (all-reduce forward; identity backward). */
template <communicator C, backend B = HostBackend>
class AllReduce : public detail::NoParameters, public detail::TypedLayer<AllReduce<C, B>> {
  using Typed = detail::TypedLayer<AllReduce<C, B>>;

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
  // The caller keeps its tensor: the sum (and the identity backward) work on a copy made by B, on the rank's
  // stream (`Act<L>(x)` would copy on the host, before a stream-ordered backend has written `x`).
  Activation do_forward(const Activation& x, int) {
    return ReduceToReplicate::forward<B>(*comm_, Act<TensorPartial>(backend_copy<B>(x))).tensor();
  }
  Activation do_backward(const Activation& dy, int) {
    return ReduceToReplicate::backward<B>(*comm_, Act<Replicate>(backend_copy<B>(dy))).tensor();
  }
  C* comm_;
};

/** @brief Layer: Shard<1, tensor> -> Replicate (all-gather of features; backward keeps this rank's columns). */
template <communicator C, backend B = HostBackend>
class GatherFeatures : public detail::NoParameters, public detail::TypedLayer<GatherFeatures<C, B>> {
  using Typed = detail::TypedLayer<GatherFeatures<C, B>>;

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
  // GatherFeaturesOf's two directions on the caller's tensor, read in place (wrapping it in an Act would copy it).
  Activation do_forward(const Activation& x, int) { return gather_features<B>(*comm_, x); }
  Activation do_backward(const Activation& dy, int) {
    return local_features<B>(dy, std::size_t(comm_->size()), std::size_t(comm_->rank()));
  }
  C* comm_;
};

}  // namespace mpar::nn
