#pragma once
/**
 * @file `Bias<L>`: a learned per-feature bias added elementwise to an activation of layout `L`,
 * keeping that layout. On a feature-sharded activation each rank holds its block of the bias.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief `y = x + b` over `features` global features, for `L` = `Replicate` (bias replicated) or
 * `Shard<1, tensor>` (bias split like the features). A Partial input is refused: each addend would
 * receive the bias, adding it TP times.
 */
template <class L = Replicate, backend B = HostBackend>
class Bias : public detail::TypedLayer<Bias<L, B>> {
  using Typed = detail::TypedLayer<Bias<L, B>>;
  static_assert(std::is_same_v<L, Replicate> || std::is_same_v<L, FeatureShard>,
                "mpar::nn::Bias<L>: L must be Replicate or Shard<1, axis::tensor>; for a token-sharded activation "
                "use the bias of the preceding RowParallel (added after its reduce-scatter)");

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "Bias";
  using default_input = L;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<In, L>) {
      return true;
    } else if constexpr (In::is_partial) {
      static_assert(
          detail::always_false_v<In>,
          "mpar::nn::Bias is fed a Partial<sum, tensor> tensor: every addend would receive the bias, adding it "
          "once per rank. Fix: insert AllReduce before it, or use the bias of the RowParallel");
      return false;
    } else {
      static_assert(detail::always_false_v<In>,
                    "mpar::nn::Bias<L> was declared for another layout than it is fed. Fix: declare it with the layout "
                    "shown as 'In' above (Bias<Shard<1, axis::tensor>> after a ColumnParallel)");
      return false;
    }
  }
  template <class In>
  using output_layout = In;

  /** `tp_size` / `tp_rank` place this rank's block when `L` is feature-sharded. */
  Bias(std::size_t features, std::uint64_t seed, std::uint64_t id, std::string name, std::size_t tp_size = 1,
       std::size_t tp_rank = 0) {
    const bool sharded = std::is_same_v<L, FeatureShard>;
    require(!sharded || features % tp_size == 0, "Bias '", name, "' (tensor rank ", tp_rank, "): ", features,
            " features are not divisible by the tensor-parallel size ", tp_size);
    using PL = std::conditional_t<std::is_same_v<L, FeatureShard>, Shard<0, axis::tensor>, Replicate>;
    const std::array<std::size_t, 1> s{features};
    bias_ = make_parameter<B, 1>(std::move(name), id, s,
                                 detail::tensor_box<PL>(s, sharded ? tp_size : 1, sharded ? tp_rank : 0), PL::name(),
                                 sharded && tp_size > 1, seed, InitSpec::normal(0.02));
  }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int) {
    require(x.extent(1) == bias_.value.size(), "Bias '", bias_.name, "': input has ", x.extent(1),
            " features, this rank's bias has ", bias_.value.size());
    Activation y = backend_copy<B>(x);  // the caller keeps x; B copies it on the rank's stream
    detail::add_row_vector<B>(y, bias_.value);
    return y;
  }
  Activation do_backward(const Activation& dy, int) {
    detail::add_column_sums<B>(dy, bias_.grad);
    return backend_copy<B>(dy);  // the gradient passes through unchanged
  }

 public:
  std::vector<Parameter*> parameters() { return {&bias_}; }
  void drop(int) {}
  [[nodiscard]] std::size_t in_features() const { return 0; }
  [[nodiscard]] std::size_t out_features() const { return 0; }

 private:
  Parameter bias_;
};

}  // namespace mpar::nn
